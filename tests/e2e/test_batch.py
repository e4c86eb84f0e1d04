"""Batch reports: ``app.py report`` over the shared briefs, a bad brief, reruns, self-contained HTML.

The browser check renders the HTML in headless Chromium (Debian's ``chromium``; ``make
browser`` installs it). Without it the check skips locally, and fails under CI=true, so that a
missing browser is never a silent pass in CI.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app import main
from tools.artifacts.index import BriefOutcome, render_index_markdown

ROOT = Path(__file__).resolve().parents[2]
# The repository's copies of the shared example briefs, so a clean clone tests the same set.
BRIEFS = ROOT / "examples" / "briefs"
NAMES = ["gpt2-pretrain-local", "llama3-70b-2nodes-h100", "llama3-8b-finetune-8xa100"]
BAD = "broken-brief"


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch over three briefs plus a bad one, with its stderr; reruns are made by tests."""
    base = tmp_path_factory.mktemp("batch")
    src = base / "briefs"
    src.mkdir()
    for name in NAMES:
        shutil.copy(BRIEFS / f"{name}.yaml", src / f"{name}.yaml")
    (src / f"{BAD}.yaml").write_text("model: llama-3-8b\nseq_len: -5\n")
    env = {
        "TRAINWRIGHT_HOME": str(base / "home"),
        "TRAINWRIGHT_OUT": str(base / "out"),
        "TRAINWRIGHT_KNOWLEDGE_DIR": str(base / "knowledge"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("TRAINWRIGHT_DEBUG", raising=False)
        out = base / "r"
        rc = main(["report", str(src), "--out", str(out), "--no-smoke", "--jobs", "2"])
    return {"src": src, "out": out, "rc": rc, "env": env}


def _rerun(batch: dict[str, Any], capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    with pytest.MonkeyPatch.context() as mp:
        for key, value in batch["env"].items():
            mp.setenv(key, value)
        capsys.readouterr()
        main(["report", str(batch["src"]), "--out", str(batch["out"]), "--no-smoke", *extra])
    return capsys.readouterr().err


def test_report_writes_a_folder_per_brief_and_an_index(batch: dict[str, Any]) -> None:
    out = batch["out"]
    assert batch["rc"] == 1  # the bad brief failed; the others did not stop
    for name in NAMES:
        folder = out / name
        for f in ("report.md", "report.html", "plan.json", "launch.sh"):
            assert (folder / f).is_file(), f"{name}/{f} missing"
        plan = json.loads((folder / "plan.json").read_text())
        # ds_config.json is written exactly when DeepSpeed is the choice (DDP plans have none).
        assert (folder / "ds_config.json").is_file() == (plan["deepspeed_config"] is not None)
    assert (out / "llama3-8b-finetune-8xa100" / "ds_config.json").is_file()
    index = (out / "index.md").read_text()
    assert "3 planned, 1 failed" in index
    for name in NAMES:
        assert f"[report]({name}/report.md)" in index
    bad_row = next(line for line in index.splitlines() if line.startswith(f"| {BAD} "))
    assert "seq_len" in bad_row and "error:" in bad_row
    assert not (out / BAD / "plan.json").exists()
    page = (out / "index.html").read_text()
    assert page.count("/report.html'>report</a>") == 3
    assert "class='failed'" in page and "seq_len" in page
    # The 8xA100 fine-tune: its chosen strategy row carries tp/pp, batching, GB and tokens/s.
    row = next(line for line in index.splitlines() if "llama3-8b" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith(".yaml")  # the brief file the folder was planned from
    assert cells[4].startswith(("zero", "ddp")) and re.fullmatch(r"\d+ x \d+", cells[5])
    assert float(cells[6]) > 1 and cells[7] != "-" and cells[9] in ("approved", "changes_requested")


def test_html_is_self_contained_with_charts(batch: dict[str, Any]) -> None:
    for page in [batch["out"] / "index.html", *batch["out"].glob("*/report.html")]:
        text = page.read_text()
        assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", text, re.I), page
        assert "<link" not in text and "<script" not in text
    report = (batch["out"] / "llama3-8b-finetune-8xa100" / "report.html").read_text()
    images = re.findall(r"<img alt='([^']*)' src='data:image/png;base64,([^']+)'>", report)
    assert [alt.split()[0] for alt, _ in images] == ["Memory", "Estimated", "Scaling"]
    for _, data in images:
        png = base64.b64decode(data, validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000


def test_rerun_skips_unchanged_briefs_and_force_redoes_them(
    batch: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    report = batch["out"] / NAMES[0] / "report.html"
    before = report.stat().st_mtime_ns
    err = _rerun(batch, capsys)
    for name in NAMES:
        assert f"{name}: unchanged, skipped" in err
    assert f"{BAD}: FAILED" in err  # a failed brief is tried again
    assert report.stat().st_mtime_ns == before
    assert "3 planned, 1 failed" in (batch["out"] / "index.md").read_text()
    err = _rerun(batch, capsys, "--force", "--jobs", "1")
    assert "unchanged" not in err
    assert report.stat().st_mtime_ns > before


def test_report_bad_cli_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "r")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "b.yaml").write_text("model: gpt2\n")
    assert main(["report", str(tmp_path / "b.yaml"), "--out", str(tmp_path), "--jobs", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path / "b.yaml")])  # --out is required
    assert exc.value.code == 2


def test_index_lists_a_failed_brief_with_its_error() -> None:
    md = render_index_markdown(
        [BriefOutcome("x", Path("x.yaml"), "failed", error="brief.seq_len: must be > 0")]
    )
    assert (
        "| x | x.yaml | error: brief.seq_len: must be > 0 |" in md and "0 planned, 1 failed" in md
    )


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = _chromium()
    assert exe
    cmd = [
        exe,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_reports_render_in_headless_chromium(batch: dict[str, Any], tmp_path: Path) -> None:
    if _chromium() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(
                "chromium is not installed: run `make browser` (as root) before `make test`"
            )
        pytest.skip("chromium not installed (make browser installs Debian's chromium)")
    from PIL import Image

    report = batch["out"] / "llama3-8b-finetune-8xa100" / "report.html"
    for page, n_images in ((report, 3), (batch["out"] / "index.html", 0)):
        # The DOM after load: every chart's <img> is there with its full base64 data, and an
        # inline script that records each image's decoded size proves the browser drew it.
        dom = _browser(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
        assert dom.returncode == 0, dom.stderr[-2000:]
        source_images = re.findall(r"base64,([A-Za-z0-9+/=]+)", page.read_text())
        dom_images = re.findall(r"base64,([A-Za-z0-9+/=]+)", dom.stdout)
        assert len(dom_images) == n_images and dom_images == source_images
        assert "ERR_" not in dom.stderr and "Failed to load" not in dom.stderr
        shot = tmp_path / f"{page.parent.name}-{page.stem}.png"
        res = _browser(
            tmp_path,
            f"--screenshot={shot}",
            "--window-size=1200,2400",
            "--hide-scrollbars",
            page.as_uri(),
        )
        assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
        img = Image.open(shot).convert("RGB")
        colours = img.getcolors(maxcolors=1_000_000) or []
        # A blank or text-only page has a handful of greys; the charts add many colours.
        assert len(colours) > (200 if n_images else 2), f"{shot} looks blank"
        if os.environ.get("TRAINWRIGHT_SCREENSHOT_DIR"):
            shutil.copy(shot, Path(os.environ["TRAINWRIGHT_SCREENSHOT_DIR"]) / shot.name)


def test_two_reports_into_one_folder_run_one_after_the_other(tmp_path: Path) -> None:
    """Issue 26, finding 7d: two ``report`` runs into one folder said "1 planned, 2 failed".

    They clashed on the briefs' threads while all three reports were written. Now a run holds
    the folder (an ``flock`` on its ``.trainwright-lock``) for its whole batch: here this test
    holds it first, both runs say they wait, and once it is free they go one after the other;
    the second finds the first's reports unchanged, and every count printed is true.
    """
    import fcntl

    from procs import cli, read_until

    from tools.core.errors import shown
    from tools.core.outputs import claim

    src = tmp_path / "briefs"
    src.mkdir()
    for name in NAMES:
        shutil.copy(BRIEFS / f"{name}.yaml", src / f"{name}.yaml")
    out = tmp_path / "r"
    claim(out, create=True, force_flag=None)  # a report folder, as an earlier run leaves it
    holder = os.open(out / ".trainwright-lock", os.O_RDONLY | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a third run is writing there
    procs = [
        subprocess.Popen(
            cli("report", str(src), "--out", str(out), "--no-smoke"),
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    results = []
    try:
        for proc in procs:
            assert proc.stderr is not None
            said = read_until(proc, proc.stderr, "waiting for it to finish", guard_s=300)
            assert said[-1] == (
                f"another report is writing into {shown(str(out), 160)}; waiting for it to finish"
            ), said
        os.close(holder)
        holder = -1
        results = [proc.communicate(timeout=900) for proc in procs]
    finally:
        if holder >= 0:
            os.close(holder)
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    for proc, (_stdout, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
        assert "FAILED" not in stderr, stderr[-3000:]
    summaries = sorted(stdout.strip().splitlines()[-1] for stdout, _ in results)
    index = out / "index.html"
    assert summaries == [
        f"3 of 3 brief(s) planned (0 unchanged); index: {index}",
        f"3 of 3 brief(s) planned (3 unchanged); index: {index}",
    ]
    assert "3 brief(s): 3 planned, 0 failed." in (out / "index.md").read_text()
    for name in NAMES:
        assert (out / name / "plan.json").is_file()
