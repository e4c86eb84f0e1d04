"""Consistency invariants of the memory and speed models, over a sweep of 2,000+ setups.

Every GPU in the catalog x dense models from 124M to 405B, mixtures of experts (Mixtral,
Qwen3-MoE, DeepSeek), an encoder, a vision transformer and a CNN x precision x strategy and
tensor x pipeline x context layout x micro-batch x sequence length x recompute, through the
library functions (tools/planning/memory.py estimate_strategy, speed.py estimate_speed; the
search for the rows a plan shows). For each setup:

- MFU is never above the large-GEMM efficiency the speed model uses for that GPU
  (tools/planning/kernels.py ``KernelFacts.gemm``): no kernel runs faster than a large GEMM;
  nor is the executed FLOPs' share of peak while computing (recomputation included);
- tokens/s is never above the roofline, world x peak / (6N + 12·L·h·s) FLOPs per token;
- the memory terms add up to the total (params + gradients + optimizer + activations +
  buffers - the part of activations and gradients never live together), and torch's allocated
  <= reserved <= device used = total;
- a setup the memory model calls fits always has a speed (a step time, tokens/s, MFU), and so
  does every row and candidate of a searched plan that fits;
- with fp8 linears, on every GPU with an FP8 peak, MFU against the FP8 peak (``fp8_mfu``) is
  never above the fp8 GEMM share (tools/planning/fp8.py), nor is the executed FLOPs' rate.

One test per GPU type keeps each under the unit tier's 2 s; the setups are a fixed, strided
walk through the axes (no randomness), about 300 per GPU, 7,600 in all; each GPU's test
requires its share of the 2,000 the sweep must cover.
"""

from __future__ import annotations

import itertools
from dataclasses import astuple
from functools import cache

import pytest

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec, StrategyEstimate
from tools.core.strategies import check_strategy
from tools.planning.estimate import EstimateRequest, estimate
from tools.planning.experts import expert_shape
from tools.planning.fp8 import gemm_efficiency
from tools.planning.kernels import KERNEL_FACTS, kernel_class
from tools.planning.memory import estimate_strategy
from tools.planning.recipe import FRAMEWORKS, OPTIMIZERS, Recipe
from tools.planning.speed import estimate_speed
from tools.research.architectures import is_convolutional
from tools.research.hardware import load_gpu_catalog, parse_hardware
from tools.research.model_catalog import lookup_model

GPUS = sorted(load_gpu_catalog())
FP8_GPUS = [g for g in GPUS if load_gpu_catalog()[g].fp8_tflops]
# (catalog id, the longest sequence it takes): dense, mixture of experts, encoder, vision.
MODELS = (
    ("gpt2", 1024), ("qwen2.5-0.5b", 32768), ("llama-3.2-1b", 32768), ("phi-3-mini", 4096),
    ("llama-3-8b", 8192), ("gemma-2-9b", 8192), ("qwen2.5-32b", 32768), ("llama-3-70b", 8192),
    ("llama-3.1-405b", 32768), ("mixtral-8x7b", 32768), ("qwen3-30b-a3b", 32768),
    ("deepseek-v2-lite", 32768), ("mixtral-8x22b", 32768), ("bert-large", 512),
    ("vit-large", 197), ("resnet-50", 1),
)  # fmt: skip
PRECISIONS = ("bf16", "fp16", "fp32")
# (strategy, tensor, pipeline, context) on 2 nodes x 8 GPUs.
LAYOUTS = (
    ("ddp", 1, 1, 1), ("zero1", 1, 1, 1), ("zero2", 1, 1, 1), ("zero3", 1, 1, 1),
    ("zero2_offload_optimizer", 1, 1, 1), ("zero3_offload_all", 1, 1, 1), ("zero1", 2, 1, 1),
    ("ddp", 8, 1, 1), ("zero1", 2, 2, 1), ("zero1", 4, 4, 1), ("zero1", 1, 1, 2),
    ("zero2", 2, 1, 4), ("zero1", 4, 2, 2), ("ddp", 1, 16, 1),
)  # fmt: skip
MICRO = (1, 2, 4, 8)
SEQS = (512, 2048, 8192, 32768)
RECOMPUTE = ("none", "selective", "full")
ACCUMULATION = 4
# Every STRIDE-th point of the axes' product for each GPU (co-prime with the axes' sizes, so
# the walk visits every value of every axis).
STRIDE = 97
# The sweep's size: setups both models priced, over all GPUs; each GPU's test requires its
# share, so the sweep passes only when it covered at least this many.
MIN_SETUPS = 2000


@cache
def _model(name: str, seq: int) -> ModelSpec:
    return lookup_model(name, seq)


@cache
def _hardware(gpu: str) -> HardwareSpec:
    return parse_hardware(f"2x8x{gpu}")


def _points(offset: int) -> list[tuple[int, ...]]:
    axes = (MODELS, PRECISIONS, LAYOUTS, MICRO, SEQS, RECOMPUTE)
    grid = list(itertools.product(*(range(len(a)) for a in axes)))
    return grid[offset % STRIDE :: STRIDE]


def _roofline(model: ModelSpec, seq: int, hardware: HardwareSpec, peak_tflops: float) -> float:
    """Tokens/s if every GPU ran the model's FLOPs (6N + 12·L·h·s per token) at peak."""
    n = model.active_params or model.params
    attention = 0 if is_convolutional(model.hf_config or {}) else 12 * model.layers * model.hidden
    return hardware.world_size * peak_tflops * 1e12 / (6 * n + attention * seq)


def _check_memory(row: StrategyEstimate, what: str) -> None:
    t = row.per_gpu_bytes
    terms = (t.params, t.gradients, t.optimizer, t.activations, t.buffers, t.not_concurrent)
    assert min(terms) >= 0, what
    assert sum(terms[:5]) - t.not_concurrent == t.total, (what, t)
    assert 0 < t.peak_allocated <= t.peak_reserved <= t.device_used == t.total, (what, t)


@pytest.mark.parametrize("gpu", GPUS)
def test_memory_and_speed_invariants_hold_over_the_sweep(gpu: str) -> None:
    hardware = _hardware(gpu)
    assert hardware.gpu is not None
    gemm = KERNEL_FACTS[kernel_class(hardware.gpu)].gemm
    counted = 0
    for m, p, lay, mi, s, r in _points(GPUS.index(gpu)):
        (name, longest), precision = MODELS[m], PRECISIONS[p]
        family, tp, pp, cp = LAYOUTS[lay]
        strategy = check_strategy(family)
        seq = min(SEQS[s], longest)
        what = f"{name} on {gpu}, {precision}, {strategy} t{tp} p{pp} c{cp}, mb {MICRO[mi]}, "
        what += f"seq {seq}, recompute {RECOMPUTE[r]}"
        model = _model(name, seq)
        try:
            memory = estimate_strategy(
                model, hardware, strategy, task="pretrain", precision=precision,
                micro_batch_size=MICRO[mi], seq_len=seq // cp, tensor_parallel=tp,
                pipeline_parallel=pp, activation_checkpointing=RECOMPUTE[r] == "full",
                selective_recompute=RECOMPUTE[r] == "selective",
                gradient_accumulation_steps=ACCUMULATION,
            )  # fmt: skip
            speed = estimate_speed(
                model, hardware, strategy, micro_batch_size=MICRO[mi],
                gradient_accumulation_steps=ACCUMULATION, precision=precision, seq_len=seq,
                tensor_parallel=tp, pipeline_parallel=pp, context_parallel=cp,
                recompute=RECOMPUTE[r],  # type: ignore[arg-type]
            )  # fmt: skip
        except InputError:
            continue  # a layout the model or cluster cannot take (heads, layers, world)
        counted += 1
        _check_memory(memory, what)
        if memory.fits:
            assert speed.tokens_per_s is not None and speed.mfu is not None, what
        if speed.tokens_per_s is None or speed.mfu is None or speed.peak_tflops is None:
            continue
        assert speed.mfu <= gemm * (1 + 1e-9), (what, speed.mfu, gemm)
        assert speed.efficiency is not None and speed.efficiency <= gemm * (1 + 1e-9), what
        assert speed.tokens_per_s <= _roofline(model, seq, hardware, speed.peak_tflops), what
    # Most points of the walk are layouts that run (about 300 of 333 per GPU).
    assert counted * len(GPUS) >= MIN_SETUPS, (gpu, counted)


# Searched plans: every row the plan shows and every candidate, on each GPU family.
SEARCHED = (
    ("llama-3.2-1b", "1x4x{gpu}", 8192, 32),
    ("mixtral-8x7b", "4x8x{gpu}", 4096, 256),
    ("llama-3-8b", "1x8x{gpu}", 4096, 64),
)


@pytest.mark.parametrize("gpu", GPUS)
def test_every_searched_row_that_fits_has_a_speed_within_the_invariants(gpu: str) -> None:
    hardware = _hardware(gpu)
    assert hardware.gpu is not None
    gemm = KERNEL_FACTS[kernel_class(hardware.gpu)].gemm
    for name, spec, seq, batch in SEARCHED:
        request = EstimateRequest(
            model=name, hardware=spec.format(gpu=gpu), seq_len=seq, global_batch=batch
        )
        plan = estimate(request).memory
        for row in plan.strategies:
            _check_memory(row, f"{name} on {gpu}: {row.label}")
            if row.fits:
                assert row.tokens_per_s is not None, (name, gpu, row.label)
        for cand in [*plan.candidates, *([plan.setup] if plan.setup else [])]:
            if cand.fits:
                assert cand.tokens_per_s is not None and cand.mfu is not None, (name, gpu)
            if cand.mfu is not None:
                assert cand.mfu <= gemm * (1 + 1e-9), (name, gpu, cand.label, cand.mfu)


@pytest.mark.parametrize(
    ("name", "shape"),
    [
        # (routed experts, top-k, expert width, shared width, MoE layers), from the configs.
        ("mixtral-8x7b", (8, 2, 14336, 0, 32)),
        ("qwen3-30b-a3b", (128, 8, 768, 0, 48)),
        ("deepseek-v2-lite", (64, 6, 1408, 2 * 1408, 26)),  # layer 0 is dense
        ("deepseek-v3", (256, 8, 2048, 2048, 58)),  # layers 0-2 are dense
        ("llama-3-8b", None),
    ],
)
def test_moe_shape_is_read_from_the_config(name: str, shape: tuple[int, ...] | None) -> None:
    found = expert_shape(_model(name, 4096))
    assert (None if found is None else astuple(found)) == shape


def test_mixtral_runs_its_two_experts_per_token() -> None:
    """Mixtral 8x7B, TP 2 x PP 4 on 64 H100: 61.8% MFU when one dense MLP was timed, now 39.5%."""
    model, hardware = _model("mixtral-8x7b", 4096), parse_hardware("8x8xH100-80GB")
    speed = estimate_speed(
        model, hardware, "zero1", micro_batch_size=2, gradient_accumulation_steps=32,
        seq_len=4096, tensor_parallel=2, pipeline_parallel=4,
    )  # fmt: skip
    assert speed.mfu is not None and 0.3 < speed.mfu < 0.5
    assert not any(a.startswith("compute raised") for a in speed.assumptions)


def test_compute_faster_than_the_gemm_rate_is_raised_to_it_and_said() -> None:
    """Where the kernel shapes count less than 6N + 12·L·h·s, the GEMM rate bounds the time."""
    model, hardware = _model("llama-3-8b", 2048), _hardware("H20")
    speed = estimate_speed(
        model, hardware, "ddp", micro_batch_size=8, gradient_accumulation_steps=4, seq_len=2048
    )
    assert hardware.gpu is not None and speed.mfu is not None
    gemm = KERNEL_FACTS[kernel_class(hardware.gpu)].gemm
    assert any(a.startswith("compute raised") for a in speed.assumptions)
    assert 0.9 * gemm < speed.mfu <= gemm


def test_more_context_ranks_than_tokens_is_refused_not_a_crash() -> None:
    with pytest.raises(InputError, match="cannot split a sequence of 4 tokens"):
        estimate_speed(
            _model("gpt2", 4), _hardware("H100-80GB"), "zero1", micro_batch_size=1,
            gradient_accumulation_steps=1, seq_len=4, context_parallel=8,
        )  # fmt: skip


# The memory terms for every framework's recipe (tools/planning/memory_terms.py prices each
# its own way): precision x optimizer x LoRA/QLoRA x activation offload x recompute x strategy
# x layout, a strided walk as above.
RECIPE_MODELS = (
    "gpt2", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b", "t5-base", "vit-large", "resnet-50",
    "llama-3-70b",
)  # fmt: skip
ADAPTERS = ((None, False), (16, False), (16, True))  # full training, LoRA, QLoRA
RECIPE_PRECISIONS = ("bf16", "fp16", "fp32", "pure-bf16", "fp8")
RECIPE_STRATEGIES = ("ddp", "zero1", "zero3", "zero2_offload_optimizer", "zero3_offload_all")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_memory_terms_add_up_for_every_recipe(framework: str) -> None:
    """Before, QLoRA with zero3_offload_all was a KeyError (``estimate --qlora`` exit 1)."""
    hardware = _hardware("H100-80GB")
    axes = (
        RECIPE_MODELS, RECIPE_PRECISIONS, OPTIMIZERS, ADAPTERS, (False, True),
        (None, "full", "selective", "selective-op"), RECIPE_STRATEGIES, ((1, 1), (2, 2)),
    )  # fmt: skip
    grid = list(itertools.product(*axes))
    counted = 0
    for point in grid[FRAMEWORKS.index(framework) :: STRIDE]:
        name, precision, optimizer, (rank, qlora), offload, ckpt, family, (tp, pp) = point
        recipe = Recipe(
            framework=framework, precision=precision, optimizer=optimizer, lora_rank=rank,
            qlora=qlora, activation_offload=offload, checkpointing=ckpt,
            gradient_accumulation_steps=4,
        )  # fmt: skip
        try:
            row = estimate_strategy(
                _model(name, 1 if name == "resnet-50" else 512), hardware, check_strategy(family),
                task="lora" if rank else "pretrain", micro_batch_size=2, tensor_parallel=tp,
                pipeline_parallel=pp, recipe=recipe, gradient_accumulation_steps=4,
            )  # fmt: skip
        except InputError:
            continue  # a combination the recipe refuses (e.g. QLoRA's base under fp32)
        counted += 1
        _check_memory(row, f"{name}, {recipe.describe()}, {family} t{tp} p{pp}")
    assert counted >= 250, (framework, counted)


# The sweep on the fp8 path (tools/planning/fp8.py): every GPU with an FP8 peak x models x
# layouts x micro-batch x sequence x recompute, a strided walk (every 7th point per GPU).
FP8_MODELS = (("gpt2", 1024), ("llama-3.2-1b", 32768), ("llama-3-8b", 8192),
                ("qwen2.5-32b", 32768), ("mixtral-8x7b", 32768), ("qwen3-30b-a3b", 32768))  # fmt: skip
FP8_LAYOUTS = (("zero3", 1, 1, 1), ("zero1", 2, 1, 1), ("ddp", 8, 1, 1), ("zero1", 2, 2, 1),
                 ("zero2", 2, 1, 4), ("zero1", 4, 2, 2), ("zero3_offload_all", 1, 1, 1))  # fmt: skip
FP8_SWEEP = list(itertools.product(FP8_MODELS, FP8_LAYOUTS, (1, 2, 4), (512, 4096, 32768),
                               ("none", "selective", "full")))  # fmt: skip


@pytest.mark.parametrize("gpu", FP8_GPUS)
def test_fp8_mfu_never_above_the_fp8_gemm_share_over_the_sweep(gpu: str) -> None:
    hardware = _hardware(gpu)
    assert hardware.gpu is not None and hardware.gpu.fp8_tflops
    share, _ = gemm_efficiency(hardware.gpu)
    counted = 0
    for (name, longest), (strategy, tp, pp, cp), micro, seq, recompute in FP8_SWEEP[
        FP8_GPUS.index(gpu) :: 7
    ]:
        seq = min(seq, longest)
        what = f"{name} on {gpu}, {strategy} t{tp} p{pp} c{cp}, mb {micro}, seq {seq}, {recompute}"
        try:
            speed = estimate_speed(
                _model(name, seq), hardware, strategy, micro_batch_size=micro,  # type: ignore[arg-type]
                gradient_accumulation_steps=4, precision="fp8", seq_len=seq, tensor_parallel=tp,
                pipeline_parallel=pp, context_parallel=cp, recompute=recompute,  # type: ignore[arg-type]
                fp8_all_gather=strategy == "zero3",
            )  # fmt: skip
        except InputError as exc:
            assert exc.field != "precision", what  # only layouts the model cannot take
            continue
        counted += 1
        assert speed.fp8_mfu is not None and speed.mfu is not None, what
        assert speed.fp8_mfu <= share * (1 + 1e-9), (what, speed.fp8_mfu, share)
        assert speed.fp8_peak_tflops == hardware.gpu.fp8_tflops
        # The executed FLOPs' rate while computing is bounded by the fp8 GEMM rate too.
        assert speed.efficiency is not None and speed.peak_tflops is not None
        rate = speed.efficiency * speed.peak_tflops
        assert rate <= share * hardware.gpu.fp8_tflops * (1 + 1e-9), what
    assert counted >= 25, (gpu, counted)
