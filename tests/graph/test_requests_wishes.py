"""Issue 16, parts 3 and 4: defaults that scale, and the request's wishes honoured.

A table of requests and the wish fields each must yield (framework, refused frameworks, pins,
global batch), the default global batch rule, the pinned search, and real CLI runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main

from tools.core.errors import InputError
from tools.core.schemas import TrainingBrief
from tools.intake.brief import brief_from_dict, parse_request, request_fields
from tools.intake.wishes import pin_fields
from tools.planning import search_strategy
from tools.planning.batch import default_global_batch, resolve_batch
from tools.research.framework import select_framework
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import list_models, lookup_model

ROOT = Path(__file__).resolve().parents[2]
MODELS = list_models()

# request -> (framework, avoid_frameworks, pins, global_batch_size); None: the field is absent.
TABLE: list[tuple[str, str | None, list[str] | None, dict[str, Any] | None, int | None]] = [
    (
        "fine-tune llama-3-8b on 8 H100, we want to use FSDP, no deepspeed",
        "pytorch_fsdp",
        ["deepspeed"],
        None,
        None,
    ),
    ("fine-tune llama-3-8b on 8 A100 with Megatron", "megatron", None, None, None),
    ("pretrain llama-3-8b on 2 nodes of 8 H100 with torchtitan", "torchtitan", None, None, None),
    (
        "our team uses TensorFlow; use Horovod with Keras to fine-tune gpt2 on 4 A100",
        "horovod",
        None,
        None,
        None,
    ),
    ("fine-tune mistral-7b on 8 A100, PyTorch DDP only", "pytorch_ddp", None, None, None),
    ("fine-tune llama-3-8b on 8 A100 with ZeRO-2", None, None, {"zero_stage": 2}, None),
    (
        "fine-tune llama-3-8b on 8 A100 using ZeRO stage 3 and no offload",
        None,
        None,
        {"zero_stage": 3, "offload": False},
        None,
    ),
    (
        "pretrain llama-3-70b on 4 nodes of 8 H100 with TP 4 and PP 2",
        None,
        None,
        {"tensor_parallel": 4, "pipeline_parallel": 2},
        None,
    ),
    (
        "train qwen2.5-72b on 2 nodes of 8 H100, tensor parallel 8, global batch 512",
        None,
        None,
        {"tensor_parallel": 8},
        512,
    ),
    (
        "fine-tune llama-3-8b on 4 A100 with offload, batch size 64",
        None,
        None,
        {"offload": True},
        64,
    ),
    ("fine-tune llama-3-8b on 8 A100 without deepspeed", None, ["deepspeed"], None, None),
    (
        "we do not want megatron; pretrain gpt2 on 8 A100 with deepspeed ZeRO-1",
        "deepspeed",
        ["megatron"],
        {"zero_stage": 1},
        None,
    ),
    (
        "fine-tune llama-3-8b on 8 H100 with FSDP rather than deepspeed",
        "pytorch_fsdp",
        ["deepspeed"],
        None,
        None,
    ),
    (
        "pretrain a 1.3B model on 8 A100 with 4-way tensor parallelism",
        None,
        None,
        {"tensor_parallel": 4},
        None,
    ),
    (
        "fine-tune llama-3-8b on 8 A100 with Megatron-LM, 2 stage pipeline",
        "megatron",
        None,
        {"pipeline_parallel": 2},
        None,
    ),
    ("fine-tune llama-3.1-405b on 32 nodes of 8 H100", None, None, None, None),
    (
        "fine-tune llama-3-70b on 2 nodes of 8 A100 with ZeRO-3, no tensor parallelism",
        None,
        None,
        {"zero_stage": 3, "tensor_parallel": 1},
        None,
    ),
    (
        "pretrain mixtral-8x7b on 4 nodes of 8 H100 with Megatron, ZeRO-1 and EP 8",
        "megatron",
        None,
        {"zero_stage": 1, "expert_parallel": 8},
        None,
    ),
    (
        "fine-tune llama-3.1-8b on 8 H100 at 128k, context parallelism 4, no expert parallelism",
        None,
        None,
        {"expert_parallel": 1, "context_parallel": 4},
        None,
    ),
]


@pytest.mark.parametrize(("request_text", "framework", "avoided", "pins", "batch"), TABLE)
def test_request_wishes(
    request_text: str,
    framework: str | None,
    avoided: list[str] | None,
    pins: dict[str, Any] | None,
    batch: int | None,
) -> None:
    fields = request_fields(request_text, MODELS)
    assert fields.get("framework") == framework
    assert fields.get("avoid_frameworks") == avoided
    assert fields.get("pins") == pins
    assert fields.get("global_batch_size") == batch
    brief = parse_request(request_text, MODELS)  # the same fields validate as a brief
    assert brief.global_batch_size == batch


def test_table_is_large_enough() -> None:
    assert len(TABLE) >= 12


@pytest.mark.parametrize(
    "text", ["tp" + " " * 3990 + "x", "pp" + " " * 3990 + "x", "no " * 1333, "zero " * 800]
)
def test_wishes_read_a_long_request_in_linear_time(text: str) -> None:
    # "tp" then 4000 spaces took 0.64 s with two adjacent \s* (quadratic); now milliseconds.
    start = time.perf_counter()
    request_fields("fine-tune gpt2 " + text[:3900], MODELS)
    assert time.perf_counter() - start < 0.2


def test_a_tensorflow_team_asking_for_horovod_keeps_its_stack() -> None:
    fields = request_fields("use Horovod with Keras to fine-tune gpt2 on 2 nodes of 4 A100", MODELS)
    assert fields["team"]["existing_stack"] == "tensorflow"


# ---- part 3: the default global batch ---------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "hardware", "task", "seq", "expected"),
    [
        # 64K fine-tuning tokens at 2048 = 32 sequences, raised to a multiple of 256 GPUs.
        ("llama-3.1-405b", "32x8xH100-80GB", "finetune", 2048, 256),
        ("llama-3-8b", "1x8xA100-80GB", "finetune", 2048, 32),
        ("llama-3-8b", "1x8xA100-80GB", "lora", 4096, 16),
        # GPT-3 Table 2.1 / Llama 2: 4M tokens at 70B = 1024 sequences of 4096.
        ("llama-3-70b", "8x8xH100-80GB", "pretrain", 4096, 1024),
        # 0.5M tokens below 1B: gpt2 at 1024 = 512 sequences.
        ("gpt2", "1x8xA100-80GB", "pretrain", 1024, 512),
        ("llama-3-8b", "12x8xH100-80GB", "pretrain", 2048, 1056),
    ],
)
def test_default_global_batch_rule(
    model: str, hardware: str, task: str, seq: int, expected: int
) -> None:
    hw = parse_hardware(hardware)
    spec = lookup_model(model, seq)
    brief = TrainingBrief(model=model, task=task, seq_len=seq, hardware=hardware)  # type: ignore[arg-type]
    batch = default_global_batch(spec, hw, brief)
    assert batch == expected
    assert batch % hw.world_size == 0


def test_a_users_batch_is_kept_and_a_bad_one_names_the_field() -> None:
    hw = parse_hardware("32x8xH100-80GB")
    spec = lookup_model("llama-3-8b", 2048)
    mine = TrainingBrief(model="llama-3-8b", global_batch_size=512, hardware="32x8xH100-80GB")
    assert resolve_batch(mine, spec, hw) == (mine, None)
    # The batch divides by the data-parallel degree, not the world: 300 sequences do not split
    # over 256 GPUs, but over the data-parallel ranks of some tensor x pipeline layout.
    odd = search_strategy(spec, hw, mine.model_copy(update={"global_batch_size": 300}))
    assert odd.setup is not None and 300 % odd.setup.data_parallel == 0
    # On 3 nodes of 8, 100 sequences split over 4 data-parallel ranks of tensor 2 x pipeline 3
    # (32 layers in uneven stages); a divisor-only pipeline kept 3, 6, 12 or 24 ranks.
    three = parse_hardware("3x8xH100-80GB")
    hundred = mine.model_copy(update={"global_batch_size": 100, "hardware": "3x8xH100-80GB"})
    kept = search_strategy(spec, three, hundred)
    assert kept.setup is not None and 100 % kept.setup.data_parallel == 0
    assert kept.setup.pipeline_parallel > 1 and 32 % kept.setup.pipeline_parallel
    # GPT-2 (12 heads, 12 layers) on 256 GPUs keeps at least 8 data-parallel ranks (tensor 4 x
    # pipeline 8): 100 splits over none, and the nearest batches that do are multiples of 8.
    gpt2 = lookup_model("gpt2", 1024)
    wide = parse_hardware("32x8xH100-80GB")
    bad = TrainingBrief(
        model="gpt2", global_batch_size=100, seq_len=1024, hardware="32x8xH100-80GB"
    )
    with pytest.raises(InputError) as err:
        search_strategy(gpt2, wide, bad)
    assert err.value.field == "global_batch_size"
    assert "the requested 100" in err.value.message and "try 96 or 104" in err.value.message


def test_the_default_is_stated_in_the_plan() -> None:
    hw = parse_hardware("32x8xH100-80GB")
    spec = lookup_model("llama-3-8b", 2048)
    plan = search_strategy(spec, hw, TrainingBrief(model="llama-3-8b", hardware="32x8xH100-80GB"))
    note = next(a for a in plan.assumptions if a.startswith("global batch 256: default"))
    assert "not given in the request" in note and "seq 2048" in note


# ---- part 4: framework wishes and pins ----------------------------------------------------------


def _framework(request_text: str, hardware: str | None = None):  # type: ignore[no-untyped-def]
    brief = parse_request(request_text, MODELS)
    hw = parse_hardware(hardware or brief.hardware)
    spec = lookup_model(brief.model, brief.seq_len)  # type: ignore[arg-type]
    return brief, select_framework(brief, hw, spec, search_strategy(spec, hw, brief))


def test_a_refused_framework_is_never_chosen_nor_offered() -> None:
    brief, fw = _framework("fine-tune llama-3-70b on 2 nodes of 8 H100, no deepspeed")
    assert fw.primary != "deepspeed"
    assert "deepspeed" not in [a.name for a in fw.alternatives]
    assert "refuses them: deepspeed" in fw.rationale


def test_a_wish_that_cannot_run_is_said_not_honoured() -> None:
    # DDP replicates 70B of model states on every GPU: it cannot run, and the plan says so.
    _, fw = _framework("fine-tune llama-3-70b on 2 nodes of 8 H100 with PyTorch DDP only")
    assert fw.primary != "pytorch_ddp"
    assert "Wish not honoured: pytorch_ddp was asked for" in fw.rationale


def test_horovod_for_tensorflow_has_a_tensorflow_stack() -> None:
    _, fw = _framework("our Keras team wants Horovod to fine-tune gpt2 on 2 nodes of 4 A100")
    assert fw.primary == "horovod" and fw.stack == ["tensorflow", "horovod"]


def test_brief_fields_are_validated() -> None:
    with pytest.raises(InputError) as err:
        brief_from_dict({"model": "gpt2", "pins": {"zero_stage": 5}})
    assert err.value.field == "brief.pins.zero_stage"
    with pytest.raises(InputError) as err:
        brief_from_dict({"model": "gpt2", "framework": "jax"})
    assert err.value.field == "brief.framework"
    with pytest.raises(InputError) as err:
        brief_from_dict(
            {"model": "gpt2", "framework": "deepspeed", "avoid_frameworks": ["deepspeed"]}
        )
    assert "also in avoid_frameworks" in err.value.message


def _plan(request_text: str) -> Any:
    brief = parse_request(request_text, MODELS)
    hw = parse_hardware(brief.hardware)
    spec = lookup_model(brief.model, brief.seq_len)  # type: ignore[arg-type]
    return search_strategy(spec, hw, brief)


def test_a_pinned_zero_stage_reaches_the_search() -> None:
    free = _plan("fine-tune llama-3-8b on 8 H100")
    pinned = _plan("fine-tune llama-3-8b on 8 H100 with ZeRO stage 3")
    assert free.chosen != "zero3" and pinned.chosen == "zero3"
    assert "pinned by the request: ZeRO stage 3" in pinned.assumptions


def test_a_pinned_tensor_degree_reaches_the_search() -> None:
    plan = _plan("fine-tune llama-3-8b on 8 H100 with TP 4")
    assert plan.tensor_parallel == 4 and plan.chosen_row is not None and plan.chosen_row.fits


def test_no_offload_is_honoured() -> None:
    # Nothing fits 70B on 8 A100 without offload, nor with it: the plan keeps the pin.
    plan = _plan("fine-tune llama-3-70b on 8 A100 with no offload")
    assert "offload" not in plan.chosen
    assert "nothing fits without it either" in plan.assumptions[0]


@pytest.mark.parametrize(
    ("words", "offload"),
    [
        ("with ZeRO-3 and CPU offload", True),
        ("on ZeRO-3, NVMe offloading", True),
        ("offloading the optimizer states to CPU", True),
        ("without offloading to the CPU", False),
        ("no cpu offload", False),
    ],
)
def test_offload_in_any_spelling_is_a_pin(words: str, offload: bool) -> None:
    assert pin_fields(f"fine-tune llama-3-8b on 8 A100 40GB {words}")["offload"] is offload


def test_a_pin_that_does_not_fit_says_so_and_what_does() -> None:
    # 8B of full fine-tuning states (~128 GB) over two 80 GB GPUs: ZeRO-1 does not fit.
    plan = _plan("fine-tune llama-3-8b on 2 H100 with ZeRO-1")
    note = plan.assumptions[0]
    assert note.startswith("the pinned choice (ZeRO stage 1) does not fit"), note
    assert f"planned {plan.chosen_label} instead, which fits" in note
    assert plan.chosen != "zero1" and plan.chosen_row is not None and plan.chosen_row.fits


# ---- real CLI runs -------------------------------------------------------------------------------


def _cli(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    res = run_main("plan", *args, "--no-smoke", "--out", "o", "--json", "p.json", cwd=tmp_path)
    plan = json.loads((tmp_path / "p.json").read_text()) if res.returncode == 0 else {}
    return res, plan


def test_cli_405b_on_256_gpus_plans_with_a_stated_default_batch(tmp_path: Path) -> None:
    res, plan = _cli(
        tmp_path, "fine-tune llama-3.1-405b on 32 nodes of 8 H100", "--hardware", "32x8xH100-80GB"
    )
    assert res.returncode == 0, res.stderr
    assert plan["brief"]["global_batch_size"] == 256
    report = (tmp_path / "o" / "report.md").read_text()
    assert "global batch 256: default for a 405.9B model at seq 2048" in report


def test_cli_a_users_batch_the_cluster_cannot_split_exits_2(tmp_path: Path) -> None:
    res, _ = _cli(
        tmp_path,
        "fine-tune gpt2 on 32 nodes of 8 H100 with global batch 100",
        "--hardware",
        "32x8xH100-80GB",
    )
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[-1]
    assert "global_batch_size" in line and "try 96 or 104" in line


def test_cli_fsdp_no_deepspeed_gives_an_fsdp_plan(tmp_path: Path) -> None:
    res, plan = _cli(tmp_path, "fine-tune llama-3-8b on 8 H100, we want to use FSDP, no deepspeed")
    assert res.returncode == 0, res.stderr
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    assert plan["deepspeed_config"] is None
    assert (tmp_path / "o" / "FSDP.md").is_file()


def test_cli_with_megatron_gives_megatron(tmp_path: Path) -> None:
    res, plan = _cli(tmp_path, "fine-tune llama-3-8b on 8 H100 with Megatron")
    assert res.returncode == 0, res.stderr
    assert plan["framework"]["primary"] == "megatron"
    assert any(a.endswith('/pretrain_gpt.py"') for a in plan["launch"]["command"])
    assert plan["review"]["verdict"] == "approved"


def test_cli_horovod_for_a_tensorflow_team_is_the_keras_binding(tmp_path: Path) -> None:
    res, plan = _cli(
        tmp_path,
        "our TensorFlow team wants Horovod with Keras to fine-tune gpt2 on 2 nodes of 4 A100",
    )
    assert res.returncode == 0, res.stderr
    assert plan["framework"]["primary"] == "horovod"
    guide = (tmp_path / "o" / "HOROVOD.md").read_text()
    assert "import horovod.tensorflow.keras as hvd" in guide and "horovod.torch as" not in guide


def test_cli_zero2_pins_stage_2(tmp_path: Path) -> None:
    res, plan = _cli(tmp_path, "fine-tune llama-3-8b on 8 H100 with ZeRO-2")
    assert res.returncode == 0, res.stderr
    assert plan["memory"]["chosen"].startswith("zero2")
    assert plan["deepspeed_config"]["zero_optimization"]["stage"] == 2
