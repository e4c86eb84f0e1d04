"""Property-based fuzzing: any input yields a result or a typed one-line project error.

Over the brief parser, the hardware parser, the free-text request parser, the planner and the
DeepSpeed config emitter: never another exception, a multi-line message or a changed file.
Run with ``--hypothesis-show-statistics`` to see how many examples each property ran.
"""

from __future__ import annotations

import string
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.core.errors import InputError, TrainwrightError
from tools.core.schemas import HardwareSpec, TrainingBrief
from tools.intake.brief import brief_from_dict, load_brief, parse_request
from tools.planning import data_parallel_size, search_strategy
from tools.research.hardware import load_gpu_catalog, parse_hardware
from tools.research.model_catalog import list_models, lookup_model

# Examples each property actually ran, for the closing note.
RUN: Counter[str] = Counter()

FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
GPU_IDS = sorted(load_gpu_catalog())
MODEL_IDS = list_models()
SHELL = "; | & $ ` ' \" \\ > < ( ) { } * ? ! # ~ \n \r \t \x00 ../ /etc/passwd $(rm -rf ~)".split(
    " "
)


def assert_one_line(exc: TrainwrightError) -> None:
    """The CLI prints a project error as one line: non-empty, no line breaks."""
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} has an empty message"
    assert "\n" not in text and "\r" not in text, f"multi-line message: {text!r}"
    if isinstance(exc, InputError):
        assert exc.field, f"InputError names no field: {text!r}"


# --- 1. parse_hardware ----------------------------------------------------------------------


def _not_local(text: str) -> bool:
    # "local" profiles this machine (torch); that path is covered by test_hardware.
    return text.strip().lower() != "local"


@pytest.mark.slow  # many examples, seconds each: the full run (make test), not test-fast
@FAST
@given(spec=st.text(max_size=200).filter(_not_local), interconnect=st.none() | st.text(max_size=20))
def test_parse_hardware_arbitrary_text(spec: str, interconnect: str | None) -> None:
    RUN["parse_hardware text"] += 1
    try:
        hw = parse_hardware(spec, interconnect)
    except TrainwrightError as exc:
        assert_one_line(exc)
    else:
        assert isinstance(hw, HardwareSpec) and hw.gpu is not None


counts = st.one_of(
    st.integers(min_value=-5, max_value=20),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 4096, 4097, 16, 17, 10**400]),
)
gpu_names = st.one_of(
    st.sampled_from(GPU_IDS),
    st.sampled_from(GPU_IDS).map(str.lower),
    st.text(alphabet=string.printable + "×é\x00", min_size=0, max_size=30),
    st.sampled_from(SHELL),
)


@FAST
@given(
    nodes=st.none() | counts,
    gpus=counts,
    name=gpu_names,
    sep=st.sampled_from(["x", "X", "×", " x ", "*"]),
)
def test_parse_hardware_structured(nodes: int | None, gpus: int, name: str, sep: str) -> None:
    RUN["parse_hardware structured"] += 1
    spec = f"{gpus}{sep}{name}" if nodes is None else f"{nodes}{sep}{gpus}{sep}{name}"
    assume(_not_local(spec))
    try:
        hw = parse_hardware(spec)
    except TrainwrightError as exc:
        assert_one_line(exc)
    else:
        assert 1 <= hw.nodes <= 4096 and 1 <= hw.gpus_per_node <= 16
        if nodes is not None and sep != "*":
            assert (hw.nodes, hw.gpus_per_node) == (nodes, gpus)


# --- 2. brief_from_dict ---------------------------------------------------------------------

junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.sampled_from([0, -1, 10**400, 2**63])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(SHELL),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "goal": junk,
    "model": st.sampled_from(MODEL_IDS) | junk | st.fixed_dictionaries({"params": junk}),
    "task": st.sampled_from(["pretrain", "finetune", "lora", "inference", "agent-app"]) | junk,
    "seq_len": junk,
    "global_batch_size": junk,
    "hardware": st.sampled_from(["1x8xA100-80GB", "local"]) | junk,
    "interconnect": junk,
    "precision": st.sampled_from(["bf16", "fp16", "fp32", "auto"]) | junk,
    "team": st.fixed_dictionaries({}, optional={"experience": junk, "existing_stack": junk}) | junk,
    "deployment": junk,
    "smoke": junk,
    "dataset_tokens": junk,
}
brief_dicts = st.fixed_dictionaries(
    {"model": FIELD_VALUES["model"]},
    optional={**{k: v for k, v in FIELD_VALUES.items() if k != "model"}, "bogus; rm -rf ~": junk},
)


@pytest.mark.slow  # many examples, seconds each: the full run (make test), not test-fast
@FAST
@given(data=brief_dicts | junk)
def test_brief_from_dict(data: Any) -> None:
    RUN["brief_from_dict"] += 1
    try:
        brief = brief_from_dict(data)
    except InputError as exc:
        assert_one_line(exc)
        assert exc.field.startswith("brief")
    else:
        assert isinstance(brief, TrainingBrief)


# --- 3. parse_request -----------------------------------------------------------------------

request_words = st.sampled_from(
    [
        "fine-tune",
        "pretrain",
        "lora",
        "llama-3-8b",
        "gpt2",
        "a 7B model",
        "on 8 A100s",
        "2 nodes of 8 H100",
        "seq len 4096",
        "8k context",
        "batch size 64",
        "seq_len 99999999999999999999",
        "batch 0",
        "0 x A100",
        "assistant",
        "for production",
        "no smoke",
        "\x00",
        "; rm -rf ~",
        "../../etc/passwd",
    ]
)
requests = st.one_of(
    st.text(max_size=300),
    st.lists(request_words | st.text(max_size=10), max_size=12).map(" ".join),
)


@pytest.mark.slow  # many examples, seconds each: the full run (make test), not test-fast
@FAST
@given(text=requests)
def test_parse_request(text: str) -> None:
    RUN["parse_request"] += 1
    try:
        brief = parse_request(text, MODEL_IDS)
    except TrainwrightError as exc:
        assert_one_line(exc)
    else:
        assert isinstance(brief, TrainingBrief)


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune gpt2 " + "9" * 100_000,
        "seq len " * 20_000 + "gpt2",
        "1" * 200_000 + " nodes of 8 A100",
        "\x00" * 100_000,
        "é" * 300_000 + " gpt2",
    ],
)
def test_parse_request_long_text(text: str) -> None:
    """Very long requests finish (no catastrophic regex backtracking) with a result or error."""
    RUN["parse_request long"] += 1
    try:
        parse_request(text, MODEL_IDS)
    except TrainwrightError as exc:
        assert_one_line(exc)


# --- 4. planner + DeepSpeed config ----------------------------------------------------------

PLAN_MODELS = {"gpt2": 1024, "qwen2.5-0.5b": 32768, "llama-3-8b": 8192, "mistral-7b": 32768}
# Datacenter GPUs that the planner's speed model knows; any catalog id is fair game.
PLAN_GPUS = GPU_IDS


@st.composite
def plan_inputs(draw: st.DrawFn) -> tuple[str, str, TrainingBrief]:
    model_id = draw(st.sampled_from(sorted(PLAN_MODELS)))
    nodes = draw(st.integers(1, 8))
    gpus = draw(st.integers(1, 8))
    gpu = draw(st.sampled_from(PLAN_GPUS))
    world = nodes * gpus
    seq_len = draw(st.sampled_from([2**k for k in range(7, 16) if 2**k <= PLAN_MODELS[model_id]]))
    batch = world * draw(st.integers(1, 64))
    brief = TrainingBrief(
        model=model_id,
        task=draw(st.sampled_from(["pretrain", "finetune", "lora"])),
        seq_len=seq_len,
        global_batch_size=batch,
        hardware=f"{nodes}x{gpus}x{gpu}",
        precision=draw(st.sampled_from(["auto", "bf16", "fp16", "fp32"])),
        dataset_tokens=draw(st.none() | st.floats(1e3, 1e12)),
    )
    return model_id, brief.hardware, brief


def _plan(model_id: str, hardware: str, brief: TrainingBrief) -> tuple[Any, Any, Any] | None:
    """The plan, or None after checking the planner's InputError is one line."""
    model = lookup_model(model_id, brief.seq_len)
    hw = parse_hardware(hardware)
    try:
        plan = search_strategy(model, hw, brief)
    except InputError as exc:
        assert_one_line(exc)
        return None
    return plan, model, hw


def _chosen_fits(plan: Any) -> bool:
    row = next(
        s
        for s in plan.strategies
        if s.name == plan.chosen
        and (s.tensor_parallel, s.pipeline_parallel)
        == (plan.tensor_parallel, plan.pipeline_parallel)
    )
    return row.fits


@pytest.mark.slow  # many examples, seconds each: the full run (make test), not test-fast
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=plan_inputs())
def test_planner_and_emitter(inputs: tuple[str, str, TrainingBrief]) -> None:
    """The planner returns a plan or an InputError; a fitting plan emits a consistent config."""
    RUN["planner"] += 1
    result = _plan(*inputs)
    if result is None:
        RUN["planner InputError"] += 1
        return
    plan, model, hw = result
    if not _chosen_fits(plan):
        RUN["planner no fit"] += 1
        return
    RUN["planner fits"] += 1
    brief = inputs[2]
    config = emit_deepspeed_config(plan, model, hw, brief)
    world = data_parallel_size(
        hw, plan.tensor_parallel, plan.pipeline_parallel, plan.context_parallel
    )
    assert config["train_batch_size"] == brief.global_batch_size
    assert (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * world
        == brief.global_batch_size
    )


@pytest.mark.slow  # many examples, seconds each: the full run (make test), not test-fast
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=plan_inputs())
def test_emitted_config_accepted_by_deepspeed(inputs: tuple[str, str, TrainingBrief]) -> None:
    """A fitting plan's ds_config passes DeepSpeed's own DeepSpeedConfig at its DP size."""
    pytest.importorskip("deepspeed")
    RUN["deepspeed"] += 1
    result = _plan(*inputs)
    assume(result is not None)
    assert result is not None
    plan, model, hw = result
    assume(_chosen_fits(plan))
    RUN["deepspeed validated"] += 1
    config = emit_deepspeed_config(plan, model, hw, inputs[2])
    world = data_parallel_size(
        hw, plan.tensor_parallel, plan.pipeline_parallel, plan.context_parallel
    )
    validate_deepspeed_config(config, world)


# --- 5. load_brief --------------------------------------------------------------------------

yaml_docs = st.one_of(
    st.binary(max_size=400),
    st.text(max_size=400).map(lambda s: s.encode("utf-8", "surrogatepass")),
    junk.map(lambda v: repr(v).encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"model: gpt2\nseq_len: -1\n",
            b"model: gpt2\nseq_len: 1e400\n",
            b"- a\n- b\n",
            b"model: [1, 2\n",
            b"model: &a [*a]\n",
            b"model: !!python/object:os.system 'echo hi'\n",
            b"\xff\xfe\x00m",
            b"model: gpt2\nglobal_batch_size: .inf\n",
            b'model: gpt2\nhardware: "1x8xA100\\nrm -rf ~"\n',
            b"model: gpt2\n? [a, b]\n: c\n",
            b"model: 2001-01-01\n",
        ]
    ),
)


@pytest.mark.slow  # 150 files written and read: ~4 s, over the unit tier's 2 s
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(content=yaml_docs, suffix=st.sampled_from([".yaml", ".json", ".yml", ""]))
def test_load_brief_bad_files(tmp_path: Path, content: bytes, suffix: str) -> None:
    """A file that is not a valid brief is an InputError in one line, and is left as it was."""
    RUN["load_brief"] += 1
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # one folder per example
    path = folder / f"brief{suffix}"
    path.write_bytes(content)
    try:
        brief = load_brief(path)
    except InputError as exc:
        assert_one_line(exc)
    else:
        assert isinstance(brief, TrainingBrief)
    assert path.read_bytes() == content
    assert [p.name for p in folder.iterdir()] == [path.name]


def test_zz_report_counts() -> None:
    """Print the examples each property ran (pytest -s shows them)."""
    print("fuzz examples run:", dict(RUN))
