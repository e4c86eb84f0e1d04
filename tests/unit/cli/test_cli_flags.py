"""Each command's flags, frozen, and the config objects the estimate and smoke flags map onto.

A new flag (or a removed one) fails here until it is added on purpose, as torchtitan's
test_no_new_cli_options does: the estimate flags are EstimateRequest's fields one for one, and
the smoke flags land in the SmokeSpec that app.py ``smoke_spec`` builds.
"""

from __future__ import annotations

import argparse

import pytest
from specs import GPT2

import app
from tools.core.settings import Settings
from tools.core.setup import Setup
from tools.planning.estimate import EstimateRequest
from tools.research import gpu_probe
from tools.smoke import DeepSpeedRun, LayoutRun, SmokeSpec, TensorFlowRun, TorchrunRun

FLAGS = {
    "plan": {
        "--answer", "--base-url", "--brief", "--force", "--hardware", "--interconnect", "--json",
        "--llm", "--no-smoke", "--out", "--smoke", "--thread", "--wait",
    },
    "chat": {"--base-url", "--llm", "--no-smoke", "--smoke", "--thread"},
    "profile": {"--hardware", "--json"},
    "estimate": {
        "--activation-offload", "--batch", "--brief", "--checkpointing", "--cp", "--ep", "--framework",
        "--global-batch", "--grad-accum", "--hardware", "--interconnect", "--json",
        "--lora-rank", "--micro-batch", "--model", "--optimizer", "--pp", "--precision",
        "--qlora", "--seq-len", "--strategy", "--task", "--tp",
    },
    "size": {
        "--budget", "--deadline-days", "--global-batch", "--gpus", "--json", "--max-gpus",
        "--model", "--one-node", "--refuse", "--seq-len", "--task", "--tokens",
    },
    "smoke": {
        "--dp", "--force", "--framework", "--fsdp-sharding", "--inject", "--inject-step",
        "--json", "--memory-cap", "--micro-batch", "--model", "--nodes", "--pp", "--pp-schedule",
        "--recompute", "--run-dir", "--seq-len", "--steps", "--strategy", "--timeout", "--tp",
        "--world-size",
    },
    "report": {"--base-url", "--force", "--jobs", "--llm", "--no-smoke", "--out", "--smoke"},
}  # fmt: skip
POSITIONAL = {"plan": ["text"], "report": ["paths"]}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = app.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_each_command_has_exactly_its_flags() -> None:
    commands = _commands()
    assert set(commands) == set(FLAGS)
    for name, sub in commands.items():
        flags = {o for a in sub._actions for o in a.option_strings} - {"-h", "--help"}
        assert flags == FLAGS[name], name
        positional = [a.dest for a in sub._actions if not a.option_strings]
        assert positional == POSITIONAL.get(name, []), name


def test_estimate_flags_are_the_request_fields_one_for_one() -> None:
    """Each estimate flag is a field of EstimateRequest, spelled ``--`` + the field with dashes.

    A flag added without a field, or a field without a flag, fails here. ``--json`` and
    ``--batch`` say where the answers go and where many requests come from, not a request's
    field (a batch line's keys are these fields).
    """
    sub = _commands()["estimate"]
    actions = [
        a for a in sub._actions if a.option_strings and a.dest not in ("help", "json_path", "batch")
    ]
    assert {a.dest for a in actions} == set(EstimateRequest.model_fields)
    for action in actions:
        assert action.option_strings == ["--" + action.dest.replace("_", "-")], action.dest
    args = app.build_parser().parse_args(
        ["estimate", "--model", "llama-3-8b", "--tp", "2", "--seq-len", "4096", "--qlora"]
    )
    request = app.estimate_request(args)
    assert request == EstimateRequest(model="llama-3-8b", tp=2, seq_len=4096, qlora=True)


def test_size_flags_are_the_request_fields_one_for_one() -> None:
    """Each size flag is a field of SizeRequest, spelled ``--`` + the field with dashes."""
    from tools.planning.size_request import SizeRequest

    sub = _commands()["size"]
    actions = [a for a in sub._actions if a.option_strings and a.dest not in ("help", "json_path")]
    assert {a.dest for a in actions} == set(SizeRequest.model_fields)
    for action in actions:
        assert action.option_strings == ["--" + action.dest.replace("_", "-")], action.dest


def test_every_estimate_flag_reaches_its_request_field() -> None:
    """Each flag given alone sets its field and only its field (none is dropped or renamed)."""
    sub = _commands()["estimate"]
    for action in sub._actions:
        if not action.option_strings or action.dest in ("help", "json_path", "batch"):
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:
            argv, expected = [flag], True
        elif action.type is int:
            argv, expected = [flag, "3"], 3
        else:
            argv, expected = [flag, "x.yaml"], "x.yaml"
        request = app.estimate_request(app.build_parser().parse_args(["estimate", *argv]))
        given = request.model_dump(exclude_defaults=True)
        got = given.get(action.dest)
        assert list(given) == [action.dest] and str(got) == str(expected), (flag, given)


@pytest.fixture(autouse=True)
def _no_gpu_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with no GPU driver, without starting nvidia-smi or rocm-smi (a unit test)."""
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda *_a, **_k: gpu_probe.GPUProbe())


def _spec(*flags: str) -> SmokeSpec:
    args = app.build_parser().parse_args(["smoke", "--model", "gpt2", *flags])
    return app.smoke_spec(args, Settings.load(), GPT2, app.check_smoke_args(args))


@pytest.mark.parametrize(
    ("flags", "mode", "strategy"),
    [
        (["--strategy", "ddp", "--recompute"], TorchrunRun(recompute=True), "ddp"),
        (["--strategy", "fsdp"], TorchrunRun(fsdp="full"), "fsdp"),
        (["--strategy", "fsdp", "--fsdp-sharding", "hybrid"], TorchrunRun(fsdp="hybrid"), "fsdp"),
        (["--framework", "horovod"], TorchrunRun(), "ddp"),
        (["--tp", "2"], LayoutRun(Setup("ddp", tp=2)), "ddp"),
        (
            ["--tp", "2", "--pp", "2", "--dp", "2", "--pp-schedule", "gpipe"],
            LayoutRun(Setup("zero1", tp=2, pp=2, dp=2), "gpipe"),
            "zero1",
        ),
        (["--framework", "tensorflow"], TensorFlowRun(), None),
    ],
)
def test_smoke_flags_map_onto_one_mode(flags: list[str], mode: object, strategy: str) -> None:
    spec = _spec(*flags)
    assert spec.mode == mode
    assert spec.strategy == strategy


def test_smoke_flags_reach_the_spec(tmp_path: object) -> None:
    spec = _spec(
        "--strategy", "zero3", "--steps", "7", "--micro-batch", "2", "--seq-len", "64",
        "--world-size", "4", "--nodes", "2", "--inject", "nan", "--inject-step", "2",
        "--timeout", "30", "--memory-cap", "1GiB", "--run-dir", f"{tmp_path}/r", "--force",
    )  # fmt: skip
    assert isinstance(spec.mode, DeepSpeedRun)
    assert spec.mode.config["zero_optimization"]["stage"] == 3
    assert (spec.steps, spec.micro_batch_size, spec.seq_len, spec.world_size) == (7, 2, 64, 4)
    assert (spec.nodes, spec.inject, spec.inject_step, spec.timeout_s) == (2, "nan", 2, 30.0)
    assert spec.memory_cap == 2**30 and spec.force and str(spec.run_dir).endswith("/r")
    assert spec.strategy == "zero3"


def test_a_dash_path_is_refused_not_written_as_a_file_named_dash(tmp_path) -> None:
    # `plan --json -` wrote a plan JSON to a file named '-' (one was committed by mistake).
    from inproc import run_main

    done = run_main(
        "estimate", "--model", "gpt2", "--hardware", "1x1xA100-80GB", "--json", "-", cwd=tmp_path
    )
    assert done.returncode == 2 and "standard input/output" in done.stderr
    assert not (tmp_path / "-").exists()
