"""Nothing of the user's is ever lost (issue 15, findings 1, 2, 4 and 9).

Output folders keep a manifest of what trainwright wrote (tools/core/outputs.py): a file of
the user's is never deleted or overwritten, a folder of the user's is refused before any work,
``--json`` writes through devices, FIFOs and symlinks (tools/core/files.py ``write_through``),
every brief of a ``report`` gets its own folder, ``smoke --run-dir`` follows the same rule, and
a served graph's ``out_dir`` stays inside the host's root. Real files, real CLI processes.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from inproc import run_main

from tools.core.errors import InputError
from tools.core.outputs import (
    MANIFEST,
    OutputRefused,
    check_files,
    claim,
    listed,
    remove_file,
    write_file,
)
from tools.core.paths import confined
from tools.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
BRIEFS = ROOT / "examples" / "briefs"
TENSORFLOW = (
    "Our company serves a stable ViT-base image-recognition model in production with "
    "TensorFlow; retrain it on 8 A100s"
)
# The user's own files, as finding 1 found them deleted or overwritten.
USERS = {
    "train.py": "print('my own training script')\n",
    "trainer/train.py": "print('my own trainer')\n",
    "hostfile": "gpu-a slots=8\ngpu-b slots=8\n",
    "launch_node0.sh": "#!/bin/sh\necho mine\n",
    "MEGATRON.md": "# my notes\n",
}


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A real ``python app.py`` process: for output to devices, FIFOs and the process's stdout,
    and the smoke runs; the other tests call the CLI's main in process (``run_main``)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("trainwright: error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def users_folder(folder: Path) -> dict[str, tuple[str, int, int]]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in USERS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return snapshot(folder)


def snapshot(folder: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under ``folder``: content, inode and mtime (a replace changes the inode)."""
    return {
        str(p.relative_to(folder)): (p.read_text(), p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# Finding 1: plan --out into a folder of the user's.


def test_deepspeed_plan_never_touches_the_users_files(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    before = users_folder(out)
    brief = str(BRIEFS / "llama3-70b-2nodes-h100.yaml")  # trainer/, hostfile, launch_node*.sh
    res = run_main("plan", "--brief", brief, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "not written by trainwright" in error_line(res) and "--force" in error_line(res)
    assert snapshot(out) == before  # refused before any work: nothing added, nothing changed
    # --force shares the folder; the plan needs trainer/train.py, which is the user's: refused,
    # named.
    res = run_main(
        "plan", "--brief", brief, "--no-smoke", "--out", str(out), "--force", cwd=tmp_path
    )
    assert res.returncode == 2, res.stderr
    line = error_line(res)
    assert "trainer/train.py" in line and "never overwrites" in line, line
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k != MANIFEST} == before
    assert listed(out) == []  # trainwright wrote nothing there


def test_tensorflow_plan_leaves_the_users_train_py(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    before = users_folder(out)
    res = run_main("plan", TENSORFLOW, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert snapshot(out) == before
    res = run_main("plan", TENSORFLOW, "--no-smoke", "--out", str(out), "--force", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    after = snapshot(out)
    assert {k: after[k] for k in before} == before  # the user's four files, untouched
    assert "TF_CONFIG.md" in after and "report.md" in after
    assert set(listed(out)) == set(after) - set(before) - {MANIFEST}
    # A rerun into the now shared folder replaces only its own files.
    res = run_main("plan", TENSORFLOW, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert {k: v for k, v in snapshot(out).items() if k in before} == before


def test_rerun_replaces_its_files_but_not_one_the_user_edited(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    brief = str(BRIEFS / "llama3-8b-finetune-8xa100.yaml")
    json_path = out / "plan.json"
    args = ("plan", "--brief", brief, "--no-smoke", "--out", str(out), "--json", str(json_path))
    assert run_main(*args, cwd=tmp_path).returncode == 0
    first = snapshot(out)
    assert set(listed(out)) == set(first) - {MANIFEST}
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr  # an owned folder: no --force needed
    second = snapshot(out)
    assert second["report.md"][1] != first["report.md"][1]  # replaced (a new inode)
    # The user edits the report: the next run refuses it, naming it, before any work.
    (out / "report.md").write_text("# my edits\n")
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "report.md" in error_line(res) and "changed after" in error_line(res)
    assert (out / "report.md").read_text() == "# my edits\n"


def test_launch_files_obey_the_manifest(tmp_path: Path) -> None:
    from test_launch import DEEPSPEED, DS_CONFIG, brief, gpus, model

    from tools.artifacts.launch import emit_launch

    emit_launch(tmp_path, brief(), gpus(2, 8), model(), DEEPSPEED, DS_CONFIG)
    assert {"hostfile", "launch_node0.sh", "launch_node1.sh"} <= set(listed(tmp_path))
    # The user edits one node script and adds a file of theirs under a name of ours.
    (tmp_path / "launch_node1.sh").write_text("#!/bin/sh\necho edited\n")
    # One node: the stale hostfile and node0 script (ours, unchanged) go; the edited one stays.
    emit_launch(tmp_path, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG)
    assert not (tmp_path / "hostfile").exists() and not (tmp_path / "launch_node0.sh").exists()
    assert (tmp_path / "launch_node1.sh").read_text() == "#!/bin/sh\necho edited\n"
    assert "launch_node1.sh" not in listed(tmp_path)  # the user's now
    # Two nodes again: launch_node1.sh is the user's: the whole launch is refused, none written.
    before = snapshot(tmp_path)
    with pytest.raises(OutputRefused, match="launch_node1.sh"):
        emit_launch(tmp_path, brief(), gpus(2, 8), model(), DEEPSPEED, DS_CONFIG)
    assert snapshot(tmp_path) == before


def test_out_empty_string_is_refused(tmp_path: Path) -> None:
    brief = str(BRIEFS / "llama3-8b-finetune-8xa100.yaml")
    for flags in (
        ("plan", "--brief", brief, "--no-smoke", "--out", ""),
        ("report", brief, "--out", ""),
    ):
        res = run_main(*flags, cwd=tmp_path)
        assert res.returncode == 2, res.stderr
        assert "--out" in res.stderr and "empty" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written in the cwd


def test_two_config_json_models_get_different_default_folders(tmp_path: Path) -> None:
    from agents.intake import default_out_dir
    from tools.intake.brief import brief_from_dict

    settings = Settings(out_dir=tmp_path / "out")
    folders = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        b = brief_from_dict(
            {"model": str(tmp_path / name / "config.json"), "hardware": "1x8xA100-80GB"}
        )
        folders.append(default_out_dir(b, settings))
    assert folders[0] != folders[1]
    assert folders[0].name.startswith("a-") and folders[1].name.startswith("b-")  # readable
    again = brief_from_dict(
        {"model": str(tmp_path / "a" / "config.json"), "hardware": "1x8xA100-80GB"}
    )
    assert default_out_dir(again, settings) == folders[0]  # same request, same folder
    other = brief_from_dict({"model": "llama-3-8b", "hardware": "1x8xA100-80GB"})
    bigger = brief_from_dict({"model": "llama-3-8b", "hardware": "2x8xA100-80GB"})
    assert default_out_dir(other, settings) != default_out_dir(bigger, settings)
    assert default_out_dir(other, settings).name.startswith("llama-3-8b-")


# The manifest itself.


def test_concurrent_writers_keep_every_manifest_entry(tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for j in range(20):
                write_file(tmp_path, f"f{i}-{j}.txt", f"{i} {j}\n")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(listed(tmp_path)) == 120
    # Another process writing into the same folder at once (the lock is an OS flock).
    code = (
        "import sys; from pathlib import Path; from tools.core.outputs import write_file\n"
        "for j in range(30): write_file(Path(sys.argv[1]), f'p{sys.argv[2]}-{j}', 'x')\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(k)], cwd=ROOT)
        for k in range(3)
    ]
    for p in procs:
        assert p.wait(timeout=60) == 0
    assert len(listed(tmp_path)) == 120 + 90


def test_a_foreign_file_is_never_removed_or_replaced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputRefused, match="not empty"):
        write_file(tmp_path, "report.md", "x")
    claim(tmp_path, force=True)  # shared from now on
    write_file(tmp_path, "report.md", "x")
    with pytest.raises(OutputRefused, match="notes.txt"):
        write_file(tmp_path, "notes.txt", "replaced")
    assert not remove_file(tmp_path, "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    # Identical bytes are not a loss: the file is adopted.
    write_file(tmp_path, "notes.txt", "mine\n")
    assert "notes.txt" in listed(tmp_path)
    # Symlinks and non-regular files in the folder are never written through.
    (tmp_path / "elsewhere.txt").write_text("keep\n")
    (tmp_path / "link.md").symlink_to(tmp_path / "elsewhere.txt")
    with pytest.raises(OutputRefused, match="not a regular file"):
        write_file(tmp_path, "link.md", "x")
    with pytest.raises(OutputRefused):
        check_files(tmp_path, ["link.md"])
    assert (tmp_path / "elsewhere.txt").read_text() == "keep\n"


def test_a_write_cut_short_leaves_the_file_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between the manifest and the file (either order): the next run still owns it."""
    import tools.core.outputs as outputs

    write_file(tmp_path, "a.txt", "one")
    real_write, real_manifest = outputs.write_atomic_bytes, outputs.write_manifest

    def killed(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "write_atomic_bytes", killed)  # the manifest went first
    with pytest.raises(KeyboardInterrupt):
        write_file(tmp_path, "a.txt", "two")
    assert (tmp_path / "a.txt").read_text() == "one"
    monkeypatch.setattr(outputs, "write_atomic_bytes", real_write)
    calls: list[int] = []

    def second_fails(folder: Path, files: dict[str, object], temps: tuple[str, ...] = ()) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the file is written, its final entry is not
        real_manifest(folder, files, temps)  # type: ignore[arg-type]

    monkeypatch.setattr(outputs, "write_manifest", second_fails)
    with pytest.raises(KeyboardInterrupt):
        write_file(tmp_path, "a.txt", "three")
    assert (tmp_path / "a.txt").read_text() == "three"
    monkeypatch.setattr(outputs, "write_manifest", real_manifest)
    write_file(tmp_path, "a.txt", "four")  # still ours in both cases
    assert (tmp_path / "a.txt").read_text() == "four"
    # Files our child processes write (a smoke run's logs) are reserved before they start.
    outputs.reserve(tmp_path, ["smoke.log"])
    (tmp_path / "smoke.log").write_text("written by a rank, then SIGKILL\n")
    check_files(tmp_path, ["smoke.log"])
    assert remove_file(tmp_path, "smoke.log")


def test_save_refuses_a_folder_of_the_users(tmp_path: Path) -> None:
    from tools.artifacts.save import save_plan

    (tmp_path / "report.md").write_text("# plan\n")
    plan = {"report": {"markdown": str(tmp_path / "report.md")}, "launch": {"files": {}}}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my report\n")
    with pytest.raises(InputError, match="not empty"):
        save_plan(plan, str(mine))
    assert (mine / "report.md").read_text() == "my report\n"
    saved = tmp_path / "saved"
    save_plan(plan, str(saved))
    save_plan(plan, str(saved))  # its own folder: replaced
    (saved / "report.md").write_text("edited\n")
    with pytest.raises(InputError, match="changed after"):
        save_plan(plan, str(saved))
    assert (saved / "report.md").read_text() == "edited\n"


# Finding 2: --json writes through what the user named.


def test_json_to_a_fifo_is_written_through(tmp_path: Path) -> None:
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    got = tmp_path / "got.json"
    with open(got, "wb") as sink:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=sink)
        try:
            res = run_cli(
                "estimate",
                "--model",
                "llama-3-8b",
                "--hardware",
                "1x1xA100-80GB",
                "--json",
                str(fifo),
                cwd=tmp_path,
                timeout=120,
            )
            assert res.returncode == 0, res.stderr
            assert reader.wait(timeout=30) == 0
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, not a regular file
    assert json.loads(got.read_text())["chosen"]


def test_json_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    target = tmp_path / "data" / "estimate.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    dangling = tmp_path / "next.json"
    dangling.symlink_to(tmp_path / "data" / "new.json")
    for path in (link, dangling):
        res = run_cli(
            "estimate",
            "--model",
            "llama-3-8b",
            "--hardware",
            "1x1xA100-80GB",
            "--json",
            str(path),
            cwd=tmp_path,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert path.is_symlink()
        assert json.loads(path.read_text())["chosen"]
    assert json.loads(target.read_text())["chosen"]
    assert json.loads((tmp_path / "data" / "new.json").read_text())["chosen"]


def test_json_to_a_character_device_leaves_the_device(tmp_path: Path) -> None:
    # A private null device first (mknod needs root): the old code replaced it with a file.
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root; /dev/null is only checked after a private device passes")
    est = ("estimate", "--model", "llama-3-8b", "--hardware", "1x1xA100-80GB", "--json")
    res = run_cli(*est, str(dev), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    # Only now, with the behaviour proven on the private device, the real /dev/null.
    res = run_cli(*est, "/dev/null", cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_json_to_dev_stdout_prints_the_json(tmp_path: Path) -> None:
    res = run_cli(
        "estimate",
        "--model",
        "llama-3-8b",
        "--hardware",
        "1x1xA100-80GB",
        "--json",
        "/dev/stdout",
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    start = res.stdout.index("{")
    data, _ = json.JSONDecoder().raw_decode(res.stdout[start:])
    assert data["chosen"]


# Finding 4: report folders and smoke --run-dir.


def _brief(path: Path, model: str) -> Path:
    brief = {"model": model, "hardware": "1x8xA100-80GB", "seq_len": 512, "smoke": False}
    path.write_text(json.dumps(brief))
    return path


def test_report_gives_every_brief_its_own_folder(tmp_path: Path) -> None:
    briefs = tmp_path / "briefs"
    briefs.mkdir()
    models = {"a b.json": "gpt2", "a_b.json": "gpt2-medium", "a_b-2.json": "llama-3-8b"}
    for name, model in models.items():
        _brief(briefs / name, model)
    out = tmp_path / "r"
    res = run_main("report", str(briefs), "--out", str(out), "--jobs", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    planned = {}
    for folder in sorted(p for p in out.iterdir() if p.is_dir()):
        plan = json.loads((folder / "plan.json").read_text())
        planned[folder.name] = plan["brief"]["model"]
    assert sorted(planned.values()) == sorted(models.values()), (
        planned
    )  # three folders, three plans
    index = (out / "index.md").read_text()
    for name in planned:
        assert f"]({name}/report.md)" in index
    # A later batch into the same --out with another brief that wants the a_b folder.
    kept = snapshot(out / "a_b")
    later = _brief(tmp_path / "a_b.json", "llama-3-70b")
    res = run_main("report", str(later), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert snapshot(out / "a_b") == kept  # the earlier brief's plan is not mixed or lost
    new = [p for p in out.iterdir() if p.is_dir() and p.name not in planned]
    assert len(new) == 1 and new[0].name.startswith("a_b-")
    assert json.loads((new[0] / "plan.json").read_text())["brief"]["model"] == "llama-3-70b"
    assert f"]({new[0].name}/report.md)" in (out / "index.md").read_text()


def test_report_refuses_a_folder_of_the_users(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    before = users_folder(out)
    brief = _brief(tmp_path / "b.json", "gpt2")
    res = run_main("report", str(brief), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "not written by trainwright" in error_line(res)
    assert snapshot(out) == before


@pytest.mark.slow
def test_smoke_run_dir_keeps_the_users_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine\n")
    (run_dir / "smoke.log").write_text("my log\n")
    before = snapshot(run_dir)
    args = ("smoke", "--model", "gpt2", "--strategy", "ddp", "--steps", "3", "--timeout", "240")
    res = run_cli(*args, "--run-dir", str(run_dir), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "not written by trainwright" in error_line(res)
    res = run_cli(*args, "--run-dir", str(run_dir), "--force", cwd=tmp_path)
    assert res.returncode == 2, res.stderr  # smoke.log is the user's and the run writes one
    assert "smoke.log" in error_line(res)
    assert {k: v for k, v in snapshot(run_dir).items() if k != MANIFEST} == before
    (run_dir / "smoke.log").rename(tmp_path / "smoke.log")
    res = run_cli(*args, "--run-dir", str(run_dir), "--force", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (run_dir / "notes.txt").read_text() == "mine\n"
    assert {"result.json", "smoke.log", "metrics/rank0.json", "logs/rank0.log"} <= set(
        listed(run_dir)
    )
    assert "notes.txt" not in listed(run_dir)


# Finding 9: a served graph's out_dir stays inside the host's root.


def test_confined_refuses_what_leaves_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "out-link").symlink_to(tmp_path)
    assert confined(root, "team/llama") == (root / "team" / "llama").resolve()
    for bad in ("/etc", str(tmp_path / "x"), "../x", "a/../../x", "out-link/x", "~/x", "a\x00b"):
        with pytest.raises(InputError) as info:
            confined(root, bad)
        assert "\n" not in str(info.value)
    assert confined(root, str(root / "a"), absolute_inside=True) == (root / "a").resolve()


def test_served_graph_refuses_an_out_dir_outside_its_root(tmp_path: Path) -> None:
    """graphs/serve.py's own graph object, in a process that loads it as the server does."""
    root = tmp_path / "served"
    outside = tmp_path / "outside"
    code = (
        "import json, sys\n"
        "from graphs.serve import graph\n"
        "brief = {'model': 'gpt2', 'hardware': '1x8xA100-80GB', 'seq_len': 512, 'smoke': False}\n"
        "for out in sys.argv[1:]:\n"
        "    try:\n"
        "        state = graph.invoke({'brief': brief, 'out_dir': out})\n"
        "        print(json.dumps({'out': out, 'ok': state['out_dir']}))\n"
        "    except Exception as exc:\n"
        "        print(json.dumps({'out': out, 'error': str(exc)}))\n"
    )
    env = {**os.environ, "TRAINWRIGHT_SERVE_ROOT": str(root)}
    res = subprocess.run(
        [sys.executable, "-c", code, str(outside), "../outside", "team/gpt2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    results = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert [("error" in r) for r in results] == [True, True, False], results
    assert "output root" in results[0]["error"] and "'..'" in results[1]["error"]
    assert not outside.exists()
    assert Path(results[2]["ok"]) == (root / "team" / "gpt2").resolve()
    assert (root / "team" / "gpt2" / "report.md").is_file()


def test_cli_still_writes_where_the_user_names(tmp_path: Path) -> None:
    from graphs.graph import build_graph

    s = Settings(home=tmp_path / "home", out_dir=tmp_path / "out")
    assert s.serve_root is None  # the CLI's settings: no root
    out = tmp_path / "anywhere" / "plan"
    state = build_graph(settings=s).invoke(
        {
            "brief": {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 512, "smoke": False},
            "out_dir": str(out),
        }
    )
    assert Path(state["out_dir"]) == out and (out / "report.md").is_file()


def test_a_calling_model_cannot_choose_the_adapters_out_dir(
    tmp_path: Path, settings: Settings
) -> None:
    from graphs.adapters.langchain_tool import make_plan_training_tool

    host = tmp_path / "host"
    tool = make_plan_training_tool(settings=settings, out_dir=str(host))
    evil = tmp_path / "evil"
    reply = json.loads(
        tool.invoke(
            {
                "brief": {
                    "model": "gpt2",
                    "hardware": "1x8xA100-80GB",
                    "seq_len": 512,
                    "smoke": False,
                },
                "out_dir": str(evil),
            }
        )
    )
    assert reply["status"] == "planned"
    assert not evil.exists() and (host / "report.md").is_file()


# Issue 26, finding 3a: a reservation owns only what its run wrote while it was alive.


def test_a_reserved_file_the_user_wrote_after_the_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import tools.core.manifest as manifest
    import tools.core.outputs as outputs

    # A shorter grace than the real 3 s, so "after the run" is half a second here.
    monkeypatch.setattr(manifest, "RESERVED_GRACE_S", 0.2, raising=False)
    outputs.reserve(tmp_path, ["smoke.log", "logs/rank0.log", "metrics/rank0.json"])
    # The run's launcher wrote part of its log, then the run was killed before ``record``.
    (tmp_path / "smoke.log").write_text("launching 2 cpu rank(s)\n")
    check_files(tmp_path, ["smoke.log"])  # what the killed run wrote: a rerun may replace it
    time.sleep(0.5)  # later
    (tmp_path / "smoke.log").write_text("my notes on this run\n")  # the user edits it
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.log").write_text("my own log\n")  # or writes a reserved name
    for name in ("smoke.log", "logs/rank0.log"):
        with pytest.raises(OutputRefused, match="changed after"):
            check_files(tmp_path, [name])
        with pytest.raises(OutputRefused):
            write_file(tmp_path, name, "the rerun's\n")
        assert not remove_file(tmp_path, name)
    assert (tmp_path / "smoke.log").read_text() == "my notes on this run\n"
    assert (tmp_path / "logs" / "rank0.log").read_text() == "my own log\n"
    assert "smoke.log" not in listed(tmp_path)  # the user's now


def test_a_smoke_rerun_after_a_kill_keeps_what_the_user_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding's path: ``smoke --run-dir R`` killed before it recorded, edits, a rerun."""
    import time

    from specs import GPT2

    import tools.core.manifest as manifest
    import tools.smoke.runner as runner
    from tools.smoke import SmokeSpec

    monkeypatch.setattr(manifest, "RESERVED_GRACE_S", 0.2, raising=False)
    settings = Settings(home=tmp_path / "home", out_dir=tmp_path / "out")
    run_dir = tmp_path / "run"
    launched: list[int] = []

    class Killed(Exception):
        """Stands for SIGKILL here: the run ends before it records its files."""

    def killed(commands: object, env: object, folder: Path, *a: object, **kw: object) -> None:
        launched.append(1)
        keep_alive = kw.get("keep_alive")
        (folder / "smoke.log").write_text("launching\n")
        (folder / "logs").mkdir(exist_ok=True)
        (folder / "logs" / "rank0.log").write_text("step 1 loss 10.8\n")
        if callable(keep_alive):
            keep_alive()
        raise Killed

    monkeypatch.setattr(runner, "launch_and_wait", killed)
    monkeypatch.setattr(runner, "record", lambda *args: None)
    for _ in range(2):  # the second run replaces what the killed first one wrote
        with pytest.raises(Killed):
            runner.run_smoke_test(GPT2, SmokeSpec(run_dir=run_dir, steps=3), settings)
    assert len(launched) == 2
    time.sleep(0.5)
    (run_dir / "smoke.log").write_text("my notes on the killed run\n")
    (run_dir / "result.json").write_text('{"status": "mine"}\n')
    before = snapshot(run_dir)
    with pytest.raises(OutputRefused) as info:
        runner.run_smoke_test(GPT2, SmokeSpec(run_dir=run_dir, steps=3), settings)
    assert "result.json" in str(info.value) or "smoke.log" in str(info.value)
    assert len(launched) == 2
    assert snapshot(run_dir) == before


# Issue 26, finding 3d: no write follows a symlink out of an output folder.


def test_a_symlinked_subfolder_of_an_output_folder_is_never_written_through(
    tmp_path: Path,
) -> None:
    import tools.core.outputs as outputs
    from app import write_json

    rep = tmp_path / "rep"
    claim(rep, create=True, force_flag=None)  # a report folder
    outside = tmp_path / "outside"
    outside.mkdir()
    (rep / "a").symlink_to(outside)
    with pytest.raises(OutputRefused, match="symbolic link") as info:
        write_file(rep / "a", "report.md", "# plan\n")
    assert "\n" not in str(info.value)
    for call in (
        lambda: claim(rep / "a", names=["report.md"]),
        lambda: check_files(rep / "a", ["report.md"]),
        lambda: outputs.reserve(rep / "a", ["smoke.log"]),
        lambda: remove_file(rep / "a", "report.md"),
        lambda: outputs.subfolder(rep, "a"),
        lambda: write_file(rep / "a" / "deeper", "report.md", "# plan\n"),
        lambda: write_json(rep / "a" / "plan.json", {"x": 1}),
    ):
        with pytest.raises(OutputRefused):
            call()
    # A link to a file inside our folder is not written through either, --json included.
    (rep / "latest.json").symlink_to(outside / "latest.json")
    with pytest.raises(OutputRefused):
        write_json(rep / "latest.json", {"x": 1})
    assert list(outside.iterdir()) == []


def test_report_refuses_a_brief_folder_that_is_a_link_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --out rep --force`` with ``rep/a`` a symlink wrote 10 files outside."""
    from app import main

    briefs = tmp_path / "briefs"
    briefs.mkdir()
    _brief(briefs / "a.json", "gpt2")
    _brief(briefs / "b.json", "gpt2-medium")
    rep = tmp_path / "rep"
    claim(rep, create=True, force_flag=None)  # an earlier report's folder
    outside = tmp_path / "outside"
    outside.mkdir()
    (rep / "a").symlink_to(outside)
    capsys.readouterr()
    rc = main(["report", str(briefs), "--out", str(rep), "--force", "--no-smoke"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("trainwright: error:")]
    assert len(lines) == 1 and "symbolic link" in lines[0] and "Traceback" not in err, err
    assert list(outside.iterdir()) == []
    assert not (rep / "b").exists()  # refused before any brief ran
    # The index files are checked up front too: a link there stops the batch before work.
    (rep / "a").unlink()
    (rep / "index.md").symlink_to(outside / "index.md")
    rc = main(["report", str(briefs), "--out", str(rep), "--force", "--no-smoke"])
    err = capsys.readouterr().err
    assert rc == 2 and "index.md" in err, err
    assert list(outside.iterdir()) == [] and not (rep / "a").exists()
