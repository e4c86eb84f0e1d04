"""No write of a smoke run follows a link out of its run folder.

Before the fix, a `tmp` symlink in a run dir took the ranks' temporary files (TMPDIR) wherever
it pointed, and a `no-hostfile` there would have been read by DeepSpeed's launcher as a
hostfile. Now the run makes a fresh temporary folder of its own inside a real `tmp` (removed
after the run) and refuses, in one line before anything is launched, a run dir where one of
its paths is a link or in the way. The other names (metrics/, logs/, smoke.log) were already
refused by the output manifest's checks; they stay in the table as guards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from specs import GPT2_TINY, tiny_spec

from tools.core.errors import InputError
from tools.core.settings import Settings
from tools.smoke import SmokeSpec, run_smoke_test

ROOT = Path(__file__).resolve().parents[2]

# name in the run dir -> what is put there ("link": a symlink to a folder outside, "file")
IN_THE_WAY = {
    "tmp-link": ("tmp", "link"),
    "tmp-file": ("tmp", "file"),
    "no-hostfile-link": ("no-hostfile", "link"),
    "no-hostfile-file": ("no-hostfile", "file"),
    "metrics-link": ("metrics", "link"),
    "logs-link": ("logs", "link"),
    "smoke-log-link": ("smoke.log", "link"),
}


def _run_dir_with(tmp_path: Path, name: str, kind: str) -> tuple[Path, Path]:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    if kind == "link":
        (run_dir / name).symlink_to(outside, target_is_directory=True)
    else:
        (run_dir / name).write_text("mine\n")
    return run_dir, outside


@pytest.mark.slow  # before the fix the tmp and no-hostfile cases ran (a 2-step torchrun run)
@pytest.mark.parametrize("case", sorted(IN_THE_WAY))
def test_a_run_dir_whose_paths_lead_elsewhere_is_refused_before_launching(
    tmp_path: Path, settings: Settings, case: str
) -> None:
    name, kind = IN_THE_WAY[case]
    run_dir, outside = _run_dir_with(tmp_path, name, kind)
    with pytest.raises(InputError) as err:
        spec = SmokeSpec(steps=2, run_dir=run_dir, force=True, timeout_s=120, memory_cap=0)
        run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert err.value.field == "--run-dir"
    assert str(run_dir / name) in str(err.value), str(err.value)
    assert not (run_dir / "launch.json").exists()  # nothing was started
    assert list(outside.iterdir()) == []
    if kind == "file":
        assert (run_dir / name).read_text() == "mine\n"


def test_cli_refuses_a_tmp_symlink_in_one_line(tmp_path: Path) -> None:
    run_dir, outside = _run_dir_with(tmp_path, "tmp", "link")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "smoke", "--model", "gpt2", "--strategy", "ddp"]
        + ["--steps", "2", "--run-dir", str(run_dir), "--force"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "TRAINWRIGHT_DEBUG": ""},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("trainwright: error: --run-dir: "), lines
    assert "is a symlink" in lines[0] and "tmp" in lines[0]
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_the_ranks_temporary_folder_is_made_for_the_run_and_removed_after(
    tmp_path: Path, settings: Settings
) -> None:
    run_dir = tmp_path / "run"
    spec = SmokeSpec(steps=2, run_dir=run_dir, memory_cap=0)
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "passed", result.reason
    assert (run_dir / "tmp").is_dir() and not (run_dir / "tmp").is_symlink()
    assert list((run_dir / "tmp").iterdir()) == []  # this run's own folder went with it
