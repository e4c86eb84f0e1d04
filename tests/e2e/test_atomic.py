"""Atomic writes: a writer killed with SIGKILL at any point leaves the old file or a new one.

Real processes and real SIGKILLs: a writer process rewriting a multi-megabyte plan JSON through
``tools.files.write_atomic``, killed at seeded random points across its life; and the real
``python app.py plan`` CLI rewriting an existing report folder (plan.json, report, DeepSpeed
config, launch scripts), killed while it writes. After every kill each file is byte for byte
the old version or a complete new one. Temporary files a kill leaves behind are dot files
named after the writer's pid; nothing removes a file because of its name (issue 26, finding
3c): in an output folder the manifest records each temporary file by name, and the next write
there removes the ones it recorded; elsewhere they stay.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import ROOT, cli, kill_group, read_until

from tools.core.files import copy_atomic, write_atomic
from tools.core.outputs import MANIFEST, claim, write_file

# The versions the writer writes, also exec'd here to know each version's exact bytes:
# version i is a ~2.5 MB plan-like JSON whose first and last keys both carry i.
VERSIONS = r"""
import json
ROWS = json.dumps(
    [{"step": s, "loss": round(10.0 / (s + 1), 6), "tag": "x" * 40} for s in range(30_000)]
)


def version_text(i):
    return '{"version": %d, "rows": %s, "end": %d}\n' % (i, ROWS, i)
"""
# argv: repo root, target, first version, last version. Says "ready" once imported, then
# writes the versions in order, each through write_atomic.
WRITER = (
    VERSIONS
    + r"""
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from tools.core.files import write_atomic

target, first, last = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
texts = {i: version_text(i) for i in range(first, last + 1)}
print("ready", flush=True)
for i in range(first, last + 1):
    write_atomic(target, texts[i])
"""
)
_ns: dict[str, object] = {}
exec(VERSIONS, _ns)  # noqa: S102 - our own constant source, shared with the writer process
version_text = _ns["version_text"]

KILL_POINTS = 48
PER_WRITER = 10  # versions each writer process writes
TMP_RE = re.compile(r"^\.plan\.json\.[0-9a-f]{6}-(\d+)\.[0-9a-f]{8}\.tmp$")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temps(folder: Path) -> dict[str, int]:
    """Temporary files in ``folder``: name -> the pid of the writer that made it."""
    found = {}
    for p in folder.iterdir():
        if p.name.endswith(".tmp"):
            match = TMP_RE.match(p.name)
            assert match, f"a temporary file not of write_atomic's making: {p.name}"
            found[p.name] = int(match[1])
    return found


def _writer(target: Path, first: int, last: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ROOT), str(target), str(first), str(last)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_writer_killed_at_random_points_leaves_old_or_new_file(tmp_path: Path) -> None:
    folder = tmp_path / "plans"
    target = folder / "plan.json"
    write_atomic(target, version_text(0))
    # One unkilled writer measures its life: from start, and from "ready" (writing only).
    born = time.monotonic()
    calibrate = _writer(target, 1, PER_WRITER)
    assert calibrate.stdout is not None
    read_until(calibrate, calibrate.stdout, "ready", guard_s=120)
    started = time.monotonic()
    assert calibrate.wait(timeout=120) == 0
    writing_s, life_s = time.monotonic() - started, time.monotonic() - born
    assert target.read_bytes() == version_text(PER_WRITER).encode()
    assert not _temps(folder)

    # Half the kill points spread over the whole life (start-up, imports, writing), half over
    # the writing part only, where the interesting kills land.
    rng = random.Random(8_4_5)
    points = [("start", rng.uniform(0.0, life_s)) for _ in range(KILL_POINTS // 2)]
    points += [("ready", rng.uniform(0.0, writing_s)) for _ in range(KILL_POINTS - len(points))]
    rng.shuffle(points)
    current, outcomes = PER_WRITER, {"old": 0, "new": 0}
    temps_seen, finished_first = 0, 0
    for since, delay in points:
        first, last = current + 1, current + PER_WRITER
        before = _temps(folder)
        writer = _writer(target, first, last)
        assert writer.stdout is not None
        if since == "ready":
            read_until(writer, writer.stdout, "ready", guard_s=120)
        time.sleep(delay)
        kill_group(writer)
        if writer.returncode == 0:
            finished_first += 1
        else:
            assert writer.returncode == -9, writer.returncode
        data = target.read_bytes()
        version = json.loads(data)["version"]  # parses: not half a file
        assert data == version_text(version).encode(), f"version {version} is not whole"
        assert version == current or first <= version <= last, (version, current)
        outcomes["old" if version == current else "new"] += 1
        assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
        # What a kill leaves: at most the killed writer's one temporary file. Those of earlier
        # killed writers stay: nothing recorded them here (no manifest), and nothing removes a
        # file because its name looks like a temporary file of ours.
        after = _temps(folder)
        mine = {name for name, pid in after.items() if pid == writer.pid}
        assert len(mine) <= 1, after
        assert set(after) - mine == set(before), (before, after)
        temps_seen += len(mine)
        current = version

    # The next write (here, in a live process) leaves them too.
    left = _temps(folder)
    write_atomic(target, version_text(current + 1))
    assert _temps(folder) == left
    assert len(left) == temps_seen
    assert target.read_bytes() == version_text(current + 1).encode()
    print(
        f"\nwrite_atomic: {KILL_POINTS} kill points over a {life_s:.2f} s life "
        f"({writing_s:.2f} s writing): "
        f"{outcomes['old']} old, {outcomes['new']} new, {temps_seen} killed mid-write "
        f"(temporary file left, not removed: unrecorded), {finished_first} writers done first"
    )
    assert outcomes["old"] + outcomes["new"] == KILL_POINTS


def test_modes_follow_the_umask_and_launch_scripts_stay_executable(tmp_path: Path) -> None:
    mask = _umask()
    write_atomic(tmp_path / "report.md", "# r\n")
    write_atomic(tmp_path / "launch.sh", "#!/bin/sh\n", executable=True)
    assert stat.S_IMODE((tmp_path / "report.md").stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "launch.sh").stat().st_mode) == 0o777 & ~mask
    # An earlier version left 0600 files: a rewrite gives the file its normal mode.
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "plan.json").chmod(0o600)
    write_atomic(tmp_path / "plan.json", "{}\n")
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o666 & ~mask
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "private.json", "{}\n")
        write_atomic(tmp_path / "private.sh", "#!/bin/sh\n", executable=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "private.sh").stat().st_mode) == 0o700
    # A copy keeps the source's executable bit (what /save does with launch scripts).
    copy_atomic(tmp_path / "launch.sh", tmp_path / "saved" / "launch.sh")
    copy_atomic(tmp_path / "report.md", tmp_path / "saved" / "report.md")
    assert stat.S_IMODE((tmp_path / "saved" / "launch.sh").stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((tmp_path / "saved" / "report.md").stat().st_mode) == 0o666 & ~mask
    assert (tmp_path / "saved" / "launch.sh").read_text() == "#!/bin/sh\n"
    # The chat's /save copies a plan's files the same way.
    from tools.artifacts.save import save_plan

    plan = {
        "report": {"markdown": str(tmp_path / "report.md")},
        "launch": {"files": {"launch.sh": str(tmp_path / "launch.sh")}},
        "deepspeed_config": {"train_batch_size": 8},
    }
    saved = save_plan(plan, str(tmp_path / "via-save"))
    assert sorted(p.name for p in saved) == ["launch.sh", "report.md"]
    saved_files = [p for p in (tmp_path / "via-save").iterdir() if p.name != MANIFEST]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in saved_files}
    assert modes == {
        "launch.sh": 0o777 & ~mask,
        "report.md": 0o666 & ~mask,
        "ds_config.json": 0o666 & ~mask,
    }
    assert not [p for p in tmp_path.rglob("*.tmp")]


def _users_temps(folder: Path) -> dict[str, bytes]:
    """Files of the user's whose names look like temporary files of ours, two hours old.

    As finding 3c made them: ``.plan.json.abcd1234.tmp`` (an older version's ``mkstemp``
    name) and ``.notes.abcdef-999999.deadbeef.tmp`` (our own pattern, another host's tag),
    plus one with this host's tag and a pid that is gone.
    """
    from tools.core.files import HOST_TAG

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    names = [
        ".plan.json.abcd1234.tmp",
        ".est.json.k3j_9zq1.tmp",
        ".notes.abcdef-999999.deadbeef.tmp",
        f".plan.json.{HOST_TAG}-{int(dead.stdout)}.0123abcd.tmp",
        f".report.md.{HOST_TAG}-{int(dead.stdout)}.89abcdef.tmp",
    ]
    folder.mkdir(parents=True, exist_ok=True)
    two_hours_ago = time.time() - 2 * 3600
    for i, name in enumerate(names):
        (folder / name).write_text(f"the user's draft {i}\n")
        os.utime(folder / name, (two_hours_ago, two_hours_ago))
    return {name: (folder / name).read_bytes() for name in names}


def _still_there(folder: Path, users: dict[str, bytes]) -> None:
    for name, data in users.items():
        assert (folder / name).read_bytes() == data, f"{name} was touched"


def test_temp_cleanup_removes_only_the_temps_it_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, finding 3c: a temp-like name of the user's is the user's, whatever its age."""
    import tools.core.outputs as outputs

    # Outside our folders (an ``estimate --json`` target): nothing is ever cleaned.
    plain = tmp_path / "plain"
    users = _users_temps(plain)
    write_atomic(plain / "plan.json", "{}\n")
    write_atomic(plain / "est.json", "{}\n")
    _still_there(plain, users)
    # A folder shared with ``plan --out D --force``: the same.
    shared = tmp_path / "shared"
    users = _users_temps(shared)
    claim(shared, force=True)
    write_file(shared, "plan.json", "{}\n")
    write_file(shared, "report.md", "# r\n")
    _still_there(shared, users)
    # A write of ours killed between creating its temporary file and the rename (SIGKILL: no
    # clean-up runs) leaves a file the manifest names; the next write removes exactly it.
    real = outputs.write_atomic_bytes
    left: list[Path] = []

    def killed(path: Path, data: bytes, *, executable: bool = False, tmp: Path) -> None:
        tmp.write_bytes(data[:3])
        left.append(tmp)
        raise SystemExit(137)

    monkeypatch.setattr(outputs, "write_atomic_bytes", killed)
    with pytest.raises(SystemExit):
        write_file(shared, "plan.json", '{"new": 1}\n')
    assert len(left) == 1 and left[0].exists()
    assert str(left[0].relative_to(shared)) in json.loads((shared / MANIFEST).read_text())["temps"]
    monkeypatch.setattr(outputs, "write_atomic_bytes", real)
    write_file(shared, "report.md", "# r2\n")
    assert not left[0].exists()
    assert json.loads((shared / MANIFEST).read_text())["temps"] == []
    assert (shared / "plan.json").read_text() == "{}\n"
    _still_there(shared, users)
    leftovers = {p.name for p in shared.iterdir() if p.name.endswith(".tmp")}
    assert leftovers == set(users)


def test_estimate_json_leaves_the_users_temp_like_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 3c through the CLI: ``estimate --json D/est.json`` beside two-hour-old drafts."""
    from app import main

    folder = tmp_path / "D"
    users = _users_temps(folder)
    args = ["estimate", "--model", "llama-3-8b", "--hardware", "1x8xA100-80GB"]
    args += ["--seq-len", "2048", "--global-batch", "8"]
    assert main([*args, "--json", str(folder / "est.json")]) == 0
    assert main([*args, "--json", str(folder / "plan.json")]) == 0
    assert json.loads((folder / "est.json").read_text())["chosen"]
    _still_there(folder, users)
    capsys.readouterr()


# ---- the real CLI --------------------------------------------------------------------------

OLD_BRIEF = ROOT / "examples" / "briefs" / "llama3-8b-finetune-8xa100.yaml"
NEW_BRIEF = ROOT / "examples" / "briefs" / "llama3-70b-2nodes-h100.yaml"
CLI_KILL_POINTS = 4


def _plan_args(brief: Path, json_name: str, *extra: str) -> list[str]:
    args = ["plan", "--brief", str(brief), "--no-smoke", "--out", "D", "--json", f"D/{json_name}"]
    return [*args, *extra]


def _files(folder: Path) -> dict[str, bytes]:
    """The files in ``folder`` (not write_atomic's temporary files: see ``_temps``).

    The output manifest is bookkeeping that changes with every write, so it is checked on its
    own (``_manifest_whole``), not compared with the old and new runs' final versions.
    """
    _manifest_whole(folder)
    return {
        p.name: p.read_bytes()
        for p in folder.iterdir()
        if p.is_file()
        and p.name != MANIFEST
        and not (p.name.startswith(".") and p.name.endswith(".tmp"))
    }


def _manifest_whole(folder: Path) -> None:
    """The manifest, wherever a kill lands, is one complete JSON document listing files."""
    path = folder / MANIFEST
    if path.exists():
        data = json.loads(path.read_text())
        assert isinstance(data.get("files"), dict), data


def _reference(base: Path, brief: Path, json_name: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run ``plan`` in this process, in ``base``, writing D/ (plans are deterministic)."""
    from app import main

    base.mkdir()
    monkeypatch.chdir(base)
    assert main(_plan_args(brief, json_name)) == 0
    return base / "D"


def _wait_replaced(path: Path, inode: int, proc: subprocess.Popen[str], guard_s: float) -> None:
    """Poll until ``path`` is a new file (a rename replaced it), or ``proc`` has ended."""
    deadline = time.monotonic() + guard_s
    while proc.poll() is None:
        try:
            if path.stat().st_ino != inode:
                return
        except FileNotFoundError:
            pass
        assert time.monotonic() < deadline, f"{path} was never rewritten"
        time.sleep(0.001)


def _run_new(base: Path, json_name: str) -> subprocess.Popen[str]:
    """Start ``plan`` of the new brief in ``base`` on the shared thread, stderr piped."""
    return subprocess.Popen(
        cli(*_plan_args(NEW_BRIEF, json_name, "--thread", "atomic")),
        cwd=base,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_plan_cli_killed_while_writing_leaves_each_file_old_or_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old folder; and the complete new one, with both complete versions of plan.json (the
    # report's, then --json's, which keeps hf_config) as --json goes elsewhere. Plans are
    # deterministic, byte for byte; in this process the second run reuses the first's index.
    old_dir = _reference(tmp_path / "old", OLD_BRIEF, "plan.json", monkeypatch)
    old = _files(old_dir)
    new_dir = _reference(tmp_path / "new", NEW_BRIEF, "json-out.json", monkeypatch)
    new = _files(new_dir)
    new_versions = {name: {data} for name, data in new.items() if name != "json-out.json"}
    new_versions["plan.json"].add(new["json-out.json"])

    # Each kill point reruns the new brief's plan in a copy of the folder as the kill before it
    # left it (the first: the old folder), as a user reruns in the same folder: the runs share
    # one thread, so after the first (researcher and all) a run resumes at the node the kill cut
    # short, and only the nodes that write run again. A run that resumes at the reviewer checks
    # the launch files the killed engineer wrote, which this folder holds. The first half of the
    # kills land while the engineer writes the launch files, the second half while the
    # reporter writes (once report.html has been replaced: plan.json, the final checkpoint and
    # --json follow), each after a seeded random delay; a run that resumes past the engineer
    # (the kill came after its checkpoint) takes a reporter kill.
    rng = random.Random(4_8_5)
    kills: list[tuple[int, str, float, int, dict[str, bytes]]] = []
    for point in range(CLI_KILL_POINTS):
        base = tmp_path / "runs" / str(point)
        before = old_dir if point == 0 else tmp_path / "runs" / str(point - 1) / "D"
        shutil.copytree(before, base / "D")
        html_inode = (base / "D" / "report.html").stat().st_ino
        proc = _run_new(base, "plan.json")
        assert proc.stderr is not None
        first = proc.stderr.readline()
        resumed_late = re.match(r"resuming thread atomic at (reviewer|reporter)", first)
        if point < CLI_KILL_POINTS // 2 and not resumed_late:
            where, delay = "engineer", rng.uniform(0.0, 0.05)
            read_until(proc, proc.stderr, "[engineer] emit_launch")
        else:
            where, delay = "reporter", rng.uniform(0.0, 0.05)
            _wait_replaced(base / "D" / "report.html", html_inode, proc, guard_s=300)
        time.sleep(delay)
        kill_group(proc)
        assert proc.returncode in (0, -9), proc.returncode
        kills.append((point, where, delay, proc.returncode, _files(base / "D")))
        temps = [p.name for p in (base / "D").glob(".*.tmp")]
        print(f"\nkill {point}: {delay:.3f} s into the {where}'s writes, temps left {temps}")

    assert json.loads(new["json-out.json"])["model"]["name"] == "llama-3-70b"
    assert old["plan.json"] not in new_versions["plan.json"]
    mask = _umask()
    for name in ("launch.sh", "launch_node0.sh", "launch_node1.sh"):
        assert stat.S_IMODE((new_dir / name).stat().st_mode) == 0o777 & ~mask, name
    for name in ("plan.json", "report.html", "ds_config.json", "hostfile"):
        assert stat.S_IMODE((new_dir / name).stat().st_mode) == 0o666 & ~mask, name

    counts = {"old": 0, "new": 0, "absent": 0}
    plan_json = {"old": 0, "new": 0}
    for point, where, _delay, _rc, left in kills:
        for name in sorted(set(old) | set(new_versions)):
            data = left.get(name)
            if data is None:
                assert name not in old, f"kill {point} ({where}): {name} vanished"
                counts["absent"] += 1
            elif name in old and data == old[name] and data not in new_versions.get(name, ()):
                counts["old"] += 1
            else:
                assert data in new_versions.get(name, ()), (
                    f"kill {point} ({where}): {name} is partial"
                )
                counts["new"] += 1
        json.loads(left["plan.json"])
        assert set(left) <= set(old) | set(new_versions), set(left) - set(old) - set(new)
        plan_json["old" if left["plan.json"] == old["plan.json"] else "new"] += 1
    print(
        f"plan CLI: {CLI_KILL_POINTS} kill points "
        f"({sum(k[1] == 'engineer' for k in kills)} in the engineer's writes); files seen "
        f"old {counts['old']}, new {counts['new']}, not yet written {counts['absent']}; "
        f"plan.json old {plan_json['old']}, new {plan_json['new']}"
    )
