"""Megatron-DeepSpeed commands build the model the plan names, and its own parser accepts them.

A table of plans (a dense Llama, a Mixtral mixture of experts, a long context, a fine-tune and a
continued pretraining) goes through ``megatron_args``; each command is checked against the
model's Hugging Face config, then parsed and validated by Megatron-DeepSpeed's own
``parse_args``/``validate_args`` (tests/data/megatron_deepspeed_arguments.py, copied from the
cited commit: Megatron-DeepSpeed is not on PyPI and megatron-core's wheel has no training
arguments).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from launch_checks import MEGATRON_PARSER, megatron_parser

from tools.artifacts import megatron
from tools.artifacts.megatron_model import architecture_note
from tools.core.schemas import ModelSpec, TrainingBrief
from tools.research.megatron_arch import convert_refusal
from tools.research.model_catalog import lookup_model

# The copied parser's help strings hold an upstream "\\ " escape.
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")


def _config(stage: int, dp: int) -> dict[str, Any]:
    return {
        "train_batch_size": 4 * dp,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }


# id, catalog model, task, sequence length, (tensor, pipeline), GPUs
PLANS = [
    ("dense-llama", "llama-3-70b", "pretrain", 4096, (4, 2), 16),
    ("moe-mixtral", "mixtral-8x7b", "pretrain", 4096, (2, 2), 8),
    ("long-context", "mistral-7b", "pretrain", 32768, (4, 1), 8),
    ("fine-tune", "llama-2-13b", "finetune", 2048, (2, 2), 8),
    ("continued-pretraining", "mixtral-8x22b", "continued-pretraining", 4096, (8, 4), 64),
    # 126 layers over 16 stages: uneven, the first 14 of 8 layers and the last 2 of 7.
    ("uneven-stages", "llama-3.1-405b", "pretrain", 8192, (8, 16), 512),
]


def _plan(name: str, task: str, seq: int, split: tuple[int, int], gpus: int) -> Any:
    model = lookup_model(name, seq)
    # Continued pretraining is the pretrain task from the model's weights.
    kind = (
        {"task": "pretrain", "objective": task}
        if task == "continued-pretraining"
        else {"task": task}
    )
    brief = TrainingBrief(goal="x", model=name, seq_len=seq, global_batch_size=64, **kind)  # type: ignore[arg-type]
    dp = gpus // (split[0] * split[1])
    config = _config(1, dp)
    return model, brief, megatron.megatron_args(brief, model, split, config, 100, "bf16"), dp


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _expected(model: ModelSpec) -> dict[str, str | None]:
    """What the config says, as flag -> value (None: a switch that must be there)."""
    cfg = model.hf_config or {}
    want: dict[str, str | None] = {
        "--num-layers": str(cfg["num_hidden_layers"]),
        "--hidden-size": str(cfg["hidden_size"]),
        "--num-attention-heads": str(cfg["num_attention_heads"]),
        "--ffn-hidden-size": str(cfg["intermediate_size"]),
        "--swiglu": None,
        "--normalization": "rmsnorm",
        "--layernorm-epsilon": f"{cfg['rms_norm_eps']:g}",
        "--use-rotary-position-embeddings": None,
        "--rotary-position-embeddings-theta": str(int(cfg.get("rope_theta") or 10000)),
        "--untie-embeddings-and-output-weights": None,
        "--disable-bias-linear": None,
    }
    if cfg.get("num_key_value_heads", cfg["num_attention_heads"]) != cfg["num_attention_heads"]:
        want["--num-key-value-heads"] = str(cfg["num_key_value_heads"])
    if cfg.get("num_local_experts"):
        want |= {
            "--num-experts": str(cfg["num_local_experts"]),
            "--topk": str(cfg["num_experts_per_tok"]),
            "--moe-loss-coeff": f"{cfg['router_aux_loss_coef']:g}",
            "--expert-interval": "1",
            "--moe-expert-parallel-size": "1",
            "--disable-moe-token-dropping": None,
        }
    return want


@pytest.mark.parametrize(
    ("name", "task", "seq", "split", "gpus"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS]
)
def test_megatron_flags_follow_the_model_config(
    name: str, task: str, seq: int, split: tuple[int, int], gpus: int
) -> None:
    model, _, argv, _ = _plan(name, task, seq, split, gpus)
    for flag, value in _expected(model).items():
        assert flag in argv, (name, flag)
        if value is not None:
            assert _flag(argv, flag) == value, (name, flag)
    if not (model.hf_config or {}).get("num_local_experts"):
        assert "--num-experts" not in argv
    # The padded vocabulary is the model's own: multiple x tensor degree divides it.
    multiple = int(_flag(argv, "--make-vocab-size-divisible-by"))
    assert model.vocab % (multiple * split[0]) == 0
    assert int(_flag(argv, "--seq-length")) == seq


@pytest.mark.parametrize(
    ("name", "task", "seq", "split", "gpus"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS]
)
def test_megatron_deepspeed_parser_accepts_every_command(
    name: str,
    task: str,
    seq: int,
    split: tuple[int, int],
    gpus: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, brief, argv, _ = _plan(name, task, seq, split, gpus)
    argv = [str(a) for a in megatron.first_run(argv)[1:]]
    if brief.loads_weights:
        # Weights come first from the converted checkpoint, model only: not random.
        assert argv[argv.index("--load") + 1] == megatron.FINETUNE_CHECKPOINT
        assert "--finetune" in argv
    parser = megatron_parser()
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    monkeypatch.setenv("WORLD_SIZE", str(gpus))
    monkeypatch.setenv("RANK", "0")
    args = parser.validate_args(parser.parse_args())
    assert args.num_layers == model.layers and args.hidden_size == model.hidden
    assert args.num_key_value_heads == (model.kv_heads or model.heads)
    assert args.swiglu and args.normalization == "rmsnorm" and not args.add_bias_linear
    assert args.untie_embeddings_and_output_weights and not args.add_position_embedding
    cfg = model.hf_config or {}
    assert args.rope_theta == int(cfg.get("rope_theta") or 10000)
    assert args.num_experts == [cfg.get("num_local_experts", 1)]
    assert args.topk == cfg.get("num_experts_per_tok", 1)


def test_mixtral_fine_tune_is_not_converted_as_a_dense_llama() -> None:
    mixtral = lookup_model("mixtral-8x7b", 4096)
    assert convert_refusal(mixtral) is not None and "experts" in str(convert_refusal(mixtral))
    assert convert_refusal(lookup_model("llama-2-13b", 2048)) is None
    assert "8 experts in every layer, top-2 routing" in architecture_note(mixtral)


def test_what_megatron_cannot_build_is_said() -> None:
    note = architecture_note(lookup_model("llama-3.1-8b", 4096))
    assert "RoPE scaling (llama3)" in note and "cannot express" in note
    assert "cannot express" not in architecture_note(lookup_model("llama-3-8b", 4096))


@pytest.mark.parametrize(
    ("name", "pp"),
    [("llama-3.1-405b", 16), ("llama-3.1-405b", 8), ("mixtral-8x7b", 3), ("llama-3-70b", 4)],
)
def test_deepspeed_splits_the_pipeline_model_as_the_plan_priced(name: str, pp: int) -> None:
    """DeepSpeed's own partition of GPTModelPipe's layers is the plan's ``pipeline_split``.

    Megatron-DeepSpeed (megatron/model/gpt_model.py at the parser's commit) lists the pipeline
    model's layers as a bf16 cast, the embedding, one spec per transformer layer, the final
    norm, the output layer and an fp32 cast (an MoE model adds its loss hook after the layers),
    and builds a ``PipelineModule`` with ``partition_method='type:transformer'``: DeepSpeed's
    ``partition_balanced`` over one unit per transformer layer. No flag sets the split.
    """
    from deepspeed.runtime.utils import partition_balanced

    from tools.planning.parallel import pipeline_split

    model = lookup_model(name, 4096)
    moe = 1 if (model.hf_config or {}).get("num_local_experts") else 0
    weights = [0, 0] + [1] * model.layers + [0] * moe + [0, 0, 0]
    bounds = partition_balanced(weights, pp)
    stages = [sum(weights[bounds[i] : bounds[i + 1]]) for i in range(pp)]
    assert list(pipeline_split(model.layers, pp) or [model.layers // pp] * pp) == stages
    # The guide says the split, and that no flag sets it (the parser has none).
    note = megatron.stages_note(model, pp)
    assert ("do not divide" in note) == (model.layers % pp != 0)
    assert "--decoder-first-pipeline-num-layers" not in MEGATRON_PARSER.read_text()


def test_fp8_linears_are_transformer_engine_flags_the_parser_accepts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = lookup_model("llama-3-70b", 4096)
    brief = TrainingBrief(goal="x", model="llama-3-70b", seq_len=4096, global_batch_size=64)
    bf16 = megatron.megatron_args(brief, model, (4, 2), _config(1, 2), 100, "bf16")
    argv = megatron.megatron_args(brief, model, (4, 2), _config(1, 2), 100, "bf16", fp8=True)
    assert "--fp8-hybrid" not in bf16 and "--transformer-impl" not in bf16
    assert _flag(argv, "--transformer-impl") == "transformer_engine" and "--fp8-hybrid" in argv
    parser = megatron_parser()
    first = [str(a) for a in megatron.first_run(argv)[1:]]
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *first])
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("RANK", "0")
    args = parser.validate_args(parser.parse_args())  # TE is required for fp8: it is there
    assert args.fp8_hybrid and not args.fp8_e4m3 and args.transformer_impl == "transformer_engine"
    assert args.bf16  # everything but the linears stays bf16


@pytest.mark.parametrize(
    ("gpu", "fp8", "kernel"),
    [
        ("A100-80GB", False, "sdpa"),
        ("H100-80GB", False, "sdpa"),
        ("V100-32GB", False, "eager"),
        ("T4", False, "eager"),
        ("H100-80GB", True, "cudnn"),  # Transformer Engine's layers: cuDNN fused attention
        ("L4", True, "sdpa"),  # Ada: Transformer Engine falls back to FlashAttention
    ],
)
def test_attention_runs_the_kernel_the_plan_priced(gpu: str, fp8: bool, kernel: str) -> None:
    """Megatron-DeepSpeed computes the scores unfused unless told: the flag goes where FA2 runs."""
    from tools.planning.attention_kernels import FLASH2_FLAG, megatron_attention
    from tools.research.hardware import parse_hardware

    model, brief, _, dp = _plan("llama-3-8b", "pretrain", 4096, (2, 1), 8)
    hardware = parse_hardware(f"1x8x{gpu}")
    config = _config(1, dp)
    argv = megatron.megatron_args(
        brief, model, (2, 1), config, 100, "bf16", fp8=fp8, gpu=hardware.gpu
    )
    assert megatron_attention(hardware.gpu, fp8=fp8).kernel == kernel
    assert (FLASH2_FLAG in argv) == (kernel == "sdpa"), argv
    guide = megatron.megatron_md(argv, hardware, model, (2, 1), config)
    assert "Attention: " in guide
    assert ("Attention: unfused" in guide) == (kernel == "eager")
    assert ("cuDNN fused attention" in guide) == (kernel == "cudnn")


def _converter_arguments(parser: Any) -> Any:
    """tools/hf2megads_weight_converter.py's add_extra_args (Megatron-DeepSpeed 4efb479d), which
    its initialize_megatron passes to parse_args."""
    group = parser.add_argument_group(title="hf2mega")
    group.add_argument("--hf-ckpt-dir", type=str, default="")
    group.add_argument("--hf-ckpt-num-shards", type=int, default=-1)
    group.add_argument(
        "--load-mode", type=str, default=None, choices=["torchbin", "safetensor", "auto"]
    )
    group.add_argument("--to-hf-ckpt", action="store_true")
    return parser


def test_converter_command_passes_megatron_validate_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """convert_checkpoint.sh's arguments through parse_args and validate_args, as the converter
    runs them: validate_args asserts a --save-interval wherever --save is given."""
    import shlex

    from tools.research.hardware import parse_hardware

    model, brief, _, dp = _plan("llama-2-7b", "finetune", 4096, (2, 1), 8)
    files = megatron.convert_files(
        "# Launch for: x",
        brief,
        parse_hardware("1x8xH100-80GB"),
        8,
        model,
        (2, 1),
        _config(1, dp),
        "bf16",
    )
    script = files[megatron.CONVERT_SCRIPT]
    line = next(row for row in script.splitlines() if row.startswith("torchrun "))
    words = shlex.split(line.replace('"$HF_MODEL"', "/hf"))
    argv = words[next(i for i, w in enumerate(words) if w.endswith(".py")) + 1 :]
    parser = megatron_parser()
    monkeypatch.setattr(sys, "argv", ["hf2megads_weight_converter.py", *argv])
    monkeypatch.setenv("WORLD_SIZE", _flag(words, "--nproc_per_node"))
    monkeypatch.setenv("RANK", "0")
    args = parser.validate_args(parser.parse_args(_converter_arguments))
    assert args.save == megatron.FINETUNE_CHECKPOINT and args.hf_ckpt_dir == "/hf"
