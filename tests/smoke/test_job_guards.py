"""The generated job keeps the user's things: their folders, their checkpoints, their data's errors.

train.py (tools/smoke/scripts/train.py) run in this process on one rank, as a user runs it by hand: a
tiny random GPT-2 on synthetic data, checkpointing every 3 steps. Rotation deletes only what
the job recorded saving; resuming follows ``latest`` only to a complete checkpoint inside the
folder and otherwise says which one it uses; a checkpoint whose files changed is never
loaded; a second job on the folder is refused while the first holds it; bad data is one line
naming the file before any model is built. The same behaviours on 2 real ranks under the
launchers are in tests/smoke/test_train_job.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import harness
import job_checkpoints
import job_data
import pytest
import train as job
import transformers
from specs import GPT2_TINY
from train_fixture import save_model, write_dataset

STEP = "step {n}/"
SCRIPTS = Path(__file__).resolve().parents[2] / "tools" / "smoke" / "scripts"


@pytest.fixture
def run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """``run(steps, *extra)``: train.py's main in this process; (exit code, stdout + stderr)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GPT2_TINY))

    def _run(steps: int, *extra: str) -> tuple[int, str]:
        argv = ["--model-config", str(config), "--seq-len", "16", "--log-every", "1"]
        argv += ["--metrics-dir", str(tmp_path / "metrics"), "--steps", str(steps)]
        argv += ["--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "3", *extra]
        code = job.main(argv)
        out = capsys.readouterr()
        return code, out.out + out.err

    return _run


def _resumed(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("resumed from ")]
    assert len(lines) == 1, output
    return lines[0]


# ---- 3b. rotation deletes only the checkpoints the job saved -----------------------------------


@pytest.mark.slow
def test_rotation_deletes_only_the_checkpoints_the_job_saved(run: Any, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    for mine in ("step6_good", "steps-notes", "step2.bak"):
        (ck / mine).mkdir(parents=True)
        (ck / mine / "keep.txt").write_text("the user's")
    code, output = run(5, "--save-every", "1", "--keep-checkpoints", "2")
    assert code == 0, output
    # The two newest of the five the job saved, and every folder of the user's, untouched.
    assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == [
        "step2.bak",
        "step4",
        "step5",
        "step6_good",
        "steps-notes",
    ]
    for mine in ("step6_good", "steps-notes", "step2.bak"):
        assert (ck / mine / "keep.txt").read_text() == "the user's"


# ---- 4. resuming: only a complete checkpoint inside the folder, said out loud ----------------


@pytest.mark.slow
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_latest_pointing_outside_the_folder_is_not_followed(
    run: Any, tmp_path: Path, where: str
) -> None:
    ck = tmp_path / "ck"
    assert run(6)[0] == 0
    # A loadable checkpoint outside the folder that latest points at.
    other = tmp_path / "other" / "step3"
    shutil.copytree(ck / "step3", other)
    (ck / "latest").write_text(str(other) if where == "absolute" else "../other/step3")
    code, output = run(8)
    assert code == 0, output
    assert _resumed(output) == f"resumed from {ck / 'step6'} at step 6"
    note = next(ln for ln in output.splitlines() if "not a step folder" in ln)
    assert note.endswith(f"resuming from {ck / 'step6'}, the newest complete checkpoint"), note
    assert (ck / "latest").read_text() == "step8"


@pytest.mark.slow
def test_latest_naming_a_missing_step_resumes_from_the_newest_complete_one(
    run: Any, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    assert run(6)[0] == 0
    saved = (ck / "step6" / "manifest.json").read_text()
    (ck / "latest").write_text("step9")
    code, output = run(8)
    assert code == 0, output
    assert f"{ck / 'latest'} names step9, which is missing; resuming from {ck / 'step6'}" in output
    assert _resumed(output) == f"resumed from {ck / 'step6'} at step 6"
    assert STEP.format(n=1) not in output  # not restarted, so step6 was not saved over
    assert (ck / "step6" / "manifest.json").read_text() == saved


def _truncate_shard(folder: Path) -> str:
    shard = sorted(folder.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return f"{shard.name} has 100 bytes"


def _corrupt_state(folder: Path) -> str:
    (folder / "trainer_state.json").write_text('{"step": 6, "sched')
    return "trainer_state.json has"


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate_shard, _corrupt_state])
def test_a_damaged_checkpoint_is_never_loaded(run: Any, tmp_path: Path, damage: Any) -> None:
    ck = tmp_path / "ck"
    assert run(6)[0] == 0
    problem = damage(ck / "step6")
    code, output = run(8)
    assert code == 0, output
    assert "Traceback" not in output
    notes = [ln for ln in output.splitlines() if "is incomplete or corrupt" in ln]
    assert len(notes) == 1 and problem in notes[0], output
    # This job's damaged checkpoint is kept, out of the way; the run goes on from step 3.
    assert f"moved it to {ck / 'step6.corrupt'}; resuming from {ck / 'step3'}" in notes[0]
    assert _resumed(output) == f"resumed from {ck / 'step3'} at step 3"
    assert (ck / "step6.corrupt").is_dir() and (ck / "latest").read_text() == "step8"


def _unloadable(folder: Path) -> None:
    """A checkpoint whose manifest verifies but that does not load (its state lacks a key)."""
    state = json.loads((folder / "trainer_state.json").read_text())
    del state["scheduler"]
    (folder / "trainer_state.json").write_text(json.dumps(state))
    (folder / "manifest.json").unlink()
    job_checkpoints.write_manifest(folder.parent, folder.name, int(state["step"]))


@pytest.mark.slow
def test_a_checkpoint_that_does_not_load_falls_back_to_the_one_before(
    run: Any, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    assert run(6)[0] == 0
    _unloadable(ck / "step6")
    code, output = run(8)
    assert code == 0, output
    note = f"{ck / 'step6'} did not load (KeyError: 'scheduler'); resuming from {ck / 'step3'}"
    assert note in output and "Traceback" not in output
    assert _resumed(output) == f"resumed from {ck / 'step3'} at step 3"
    # Saving step 6 again keeps the earlier one, under another name.
    assert f"moved it to {ck / 'step6.replaced'}" in output
    assert (ck / "step6.replaced" / "manifest.json").is_file()

    # When no complete checkpoint loads, the job stops instead of starting over.
    for tag in ("step6", "step8"):
        _unloadable(ck / tag)
    (ck / "latest").write_text("step8")
    shutil.rmtree(ck / "step6.replaced")
    code, output = run(10)
    assert code == 2, output
    errors = [ln for ln in output.splitlines() if ln.startswith("train.py: error:")]
    assert len(errors) == 1 and "no checkpoint loads" in errors[0], output
    assert STEP.format(n=1) not in output and STEP.format(n=9) not in output


@pytest.mark.slow
def test_saving_never_overwrites_a_complete_checkpoint(run: Any, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert run(6)[0] == 0
    earlier = (ck / "step6" / "manifest.json").read_text()
    (ck / "latest").write_text("step3")  # the user rolls back to step 3
    code, output = run(6)
    assert code == 0, output
    assert _resumed(output) == f"resumed from {ck / 'step3'} at step 3"
    line = f"{ck / 'step6'} exists (a checkpoint an earlier run saved): moved it to"
    assert line in output
    assert (ck / "step6.replaced" / "manifest.json").read_text() == earlier
    assert (ck / "step6" / "manifest.json").is_file() and (ck / "latest").read_text() == "step6"


# ---- 2. one job per checkpoint folder ------------------------------------------------------------

HOLD = (
    "import sys, time; from pathlib import Path; import job_lock; "
    "job_lock.JobLock.take(Path(sys.argv[1])); print('held', flush=True); time.sleep(300)"
)


@pytest.mark.slow
def test_a_second_job_on_the_folder_is_refused_and_a_dead_holders_lock_taken_over(
    run: Any, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(ck)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SCRIPTS)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        code, output = run(3)
        assert code == 2, output
        (line,) = [ln for ln in output.splitlines() if ln.startswith("train.py: error:")]
        host = socket.gethostname()
        assert f"--checkpoint-dir {ck} is in use by another job (pid {holder.pid} on {host}" in line
        assert STEP.format(n=1) not in output and not (ck / "step3").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # The holder died without letting go: the next job takes its lock over, saying so.
    code, output = run(3)
    assert code == 0, output
    assert f"taking over the lock of pid {holder.pid} on {host}" in output
    assert (ck / "job.lock").read_text() == ""  # released at the end

    # A lock file naming a process on another host whose flock is free: taken over as well.
    (ck / "job.lock").write_text(json.dumps({"pid": 7, "host": "elsewhere", "since": "x"}))
    code, output = run(4)
    assert code == 0 and "taking over the lock of pid 7 on elsewhere, since x" in output


# ---- 6. bad data: one line naming the file, before any model is built ---------------------------

BAD_DATA: dict[str, tuple[str, bytes, str]] = {
    "empty": ("train.jsonl", b"", "no text in it"),
    "blank lines": ("train.jsonl", b"\n  \n\n", "no text in it"),
    "empty texts": ("train.jsonl", b'{"text": ""}\n', "no text in it"),
    "latin-1 jsonl": ("train.jsonl", '{"text": "café"}\n'.encode("latin-1"), "not UTF-8 text"),
    "latin-1 text": ("train.txt", "déjà vu".encode("latin-1"), "not UTF-8 text"),
    "binary text": ("train.txt", b"\x7fELF\x02\x01\x00\x00\xff\xfe", "binary data"),
    "binary jsonl": ("train.jsonl", bytes(range(256)), ":1: binary data"),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("model") / "model")


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_data_is_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    name, content, problem = BAD_DATA[case]
    data = tmp_path / name
    data.write_bytes(content)
    with pytest.raises(harness.UsageError) as caught:
        job_data.read_texts(data, "text")
    message = str(caught.value)
    assert message.startswith(f"--data {data}") and problem in message
    assert "\n" not in message


@pytest.mark.parametrize("case", ["empty", "latin-1 jsonl", "binary text"])
def test_bad_data_stops_the_job_before_the_model_with_exit_2(
    tmp_path: Path, model_dir: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name, content, problem = BAD_DATA[case]
    data = tmp_path / name
    data.write_bytes(content)
    argv = ["--model-path", str(model_dir), "--data", str(data), "--metrics-dir", str(tmp_path)]
    code = job.main([*argv, "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "2"])
    out = capsys.readouterr()
    assert code == 2, out.err
    errors = [ln for ln in out.err.splitlines() if ln.startswith("train.py: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"train.py: error: --data {data}"), out.err
    assert problem in errors[0] and "Traceback" not in out.err and "step 1/" not in out.out


def test_split_text_cuts_before_a_space_and_keeps_every_character() -> None:
    text = "word " * 50 + "x" * 130 + " end"
    pieces = job_data.split_text(text, limit=64)
    assert "".join(pieces) == text
    assert all(len(piece) <= 64 for piece in pieces)
    # Cut before the last space within the limit, so no word is split ...
    assert pieces[0] == "word " * 11 + "word" and pieces[1].startswith(" word ")
    # ... but a run without spaces is cut at the limit.
    assert "x" * 64 in pieces


class _Recorder:
    """The real tokenizer, recording the longest text it is handed in one call."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.longest = 0

    def __call__(self, texts: Any, **kwargs: Any) -> Any:
        batch = [texts] if isinstance(texts, str) else texts
        self.longest = max([self.longest, *(len(text) for text in batch)])
        return self.tokenizer(texts, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def test_a_long_line_is_tokenized_in_bounded_pieces(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    recorder = _Recorder(tokenizer)
    monkeypatch.setattr(
        job_data.transformers.AutoTokenizer, "from_pretrained", lambda *_a, **_k: recorder
    )
    sentence = "the cat trains on the mat all night. "
    text = sentence * 30_000  # ~1.1 MB on one line
    data = write_dataset(tmp_path / "small.jsonl")
    with open(data, "a") as fh:
        fh.write(json.dumps({"text": text}) + "\n")
    args = job.parse_args(
        ["--model-path", str(model_dir), "--data", str(data), "--seq-len", "32"]
        + ["--metrics-dir", str(tmp_path)]
    )
    _, tokens = job_data.load_token_data(args, 0, 2)
    assert recorder.longest <= 1 << 16, recorder.longest
    # The pieces give the tokens of the whole line (cut between words), and the small records'.
    whole = len(tokenizer(text)["input_ids"])
    small = sum(
        len(ids) + 1 for ids in tokenizer(job_data.read_texts(data, "text")[:-1])["input_ids"]
    )
    assert abs(tokens - (small + whole + 1)) < 32 + 3 * len(text) // (1 << 16)
