"""Memory model v2: the recipe's terms as each framework implements them, and the CLI flags."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from inproc import run_main

from tools.core.errors import InputError
from tools.planning.footprint import ADAM8BIT_BYTES, NF4_BYTES, block_params, native_layer_bytes
from tools.planning.memory import GB, estimate_strategy
from tools.planning.recipe import Recipe, resolve_recipe
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model

ROOT = Path(__file__).resolve().parents[3]
LLAMA8 = lookup_model("llama-3.1-8b", 8192)
PSI = LLAMA8.params


def _est(hw: str, strategy: str = "zero3", **kw: object):
    recipe = kw.pop("recipe", Recipe())
    return estimate_strategy(
        LLAMA8,
        parse_hardware(hw),
        strategy,  # type: ignore[arg-type]
        task=str(kw.pop("task", "pretrain")),  # type: ignore[arg-type]
        seq_len=int(kw.pop("seq_len", 8192)),  # type: ignore[arg-type]
        recipe=recipe,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_unknown_recipe_values_name_their_field() -> None:
    for field, change in (
        ("framework", {"framework": "jax"}),
        ("precision", {"precision": "int4"}),
        ("optimizer", {"optimizer": "lion"}),
        ("grad_accum", {"gradient_accumulation_steps": 0}),
        ("qlora", {"qlora": True, "precision": "fp32"}),
    ):
        with pytest.raises(InputError) as err:
            resolve_recipe(Recipe(**change))  # type: ignore[arg-type]
        assert err.value.field == field


def test_framework_defaults_are_filled_and_stated() -> None:
    titan = resolve_recipe(Recipe(framework="torchtitan"))
    assert titan.checkpointing == "selective-op" and titan.sequence_parallel
    assert any("torchtitan's default" in a for a in titan.assumed)
    tune = resolve_recipe(Recipe(framework="torchtune"))
    assert tune.loss == "chunked" and tune.checkpointing == "full"
    assert resolve_recipe(Recipe(framework="megatron")).distributed_optimizer


def test_fsdp2_states_are_16_bytes_per_parameter_sharded() -> None:
    """fp32 sharded params (their own master copy), fp32 sharded grads, fp32 Adam moments."""
    recipe = Recipe(framework="torchtitan", checkpointing="full")
    small, large = _est("1x8xH100-80GB", recipe=recipe), _est("16x8xH100-80GB", recipe=recipe)

    def states(e) -> int:  # type: ignore[no-untyped-def]
        return e.per_gpu_bytes.gradients + e.per_gpu_bytes.optimizer

    assert states(small) - states(large) == pytest.approx(12 * PSI * (1 / 8 - 1 / 128), rel=1e-6)
    # DeepSpeed ZeRO-3 adds its fp32 gradient copy: more per parameter than FSDP2.
    ds = _est("1x8xH100-80GB", recipe=Recipe(checkpointing="full"))
    assert ds.per_gpu_bytes.gradients > small.per_gpu_bytes.gradients


def test_megatron_distributed_optimizer_is_6_plus_12_over_d() -> None:
    """Megatron-LM docs: 18 bytes per parameter, 6 + 12/d with the distributed optimizer."""
    hw = "1x8xH100-80GB"
    dist = _est(hw, "zero1", recipe=Recipe(framework="megatron", checkpointing="full"))
    plain = _est(
        hw,
        "ddp",
        recipe=Recipe(framework="megatron", checkpointing="full", distributed_optimizer=False),
    )

    def per_param(e) -> float:  # type: ignore[no-untyped-def]
        b = e.per_gpu_bytes
        return (b.params + b.gradients + b.optimizer) / PSI

    assert per_param(dist) == pytest.approx(6 + 12 / 8, rel=1e-6)
    assert per_param(plain) == pytest.approx(18, rel=1e-6)
    # Megatron's gradient buffer persists: it lives with the activations.
    assert dist.per_gpu_bytes.not_concurrent == 0


def test_megatron_fp16_keeps_its_gradient_buffer_in_fp16() -> None:
    """Megatron forces fp32 gradient accumulation for bf16 only (training/arguments.py).

    With --fp16 the buffer takes the parameters' dtype: 2 bytes per parameter, not 4; the fp32
    master weights and moments are the same.
    """
    hw = "1x8xH100-80GB"
    bf16, fp16 = (
        _est(hw, "zero1", recipe=Recipe(framework="megatron", checkpointing="full", precision=p))
        for p in ("bf16", "fp16")
    )
    assert bf16.per_gpu_bytes.gradients == 4 * PSI
    assert fp16.per_gpu_bytes.gradients == 2 * PSI
    assert fp16.per_gpu_bytes.optimizer == bf16.per_gpu_bytes.optimizer
    # The same flag under DeepSpeed is not Megatron's buffer: unchanged there.
    ds16, ds_bf16 = (
        _est(hw, "zero1", recipe=Recipe(checkpointing="full", precision=p))
        for p in ("fp16", "bf16")
    )
    assert ds16.per_gpu_bytes.gradients == ds_bf16.per_gpu_bytes.gradients


def test_gradient_accumulation_keeps_gradients_with_activations() -> None:
    one = _est("1x8xH100-80GB", "zero1", micro_batch_size=1, gradient_accumulation_steps=1)
    four = _est("1x8xH100-80GB", "zero1", micro_batch_size=1, gradient_accumulation_steps=4)
    a, b = one.per_gpu_bytes, four.per_gpu_bytes
    assert a.not_concurrent == min(a.activations, a.gradients) > 0
    # Through accumulation DeepSpeed keeps the 16-bit gradients (ZeRO-1: all of them, 2 bytes
    # per parameter); the fp32 copy is made at the step, when the activations are gone.
    assert b.peak_allocated - a.peak_allocated == 2 * PSI
    assert b.not_concurrent == b.gradients - 2 * PSI


def test_recompute_policies_order_and_torchtitan_op_policy_counts() -> None:
    h, i = LLAMA8.hidden, LLAMA8.intermediate or 0
    kv = h * (LLAMA8.kv_heads or LLAMA8.heads) / LLAMA8.heads
    none, _ = native_layer_bytes(LLAMA8, "none")
    op, op_work = native_layer_bytes(LLAMA8, "selective-op")
    full, full_work = native_layer_bytes(LLAMA8, "full")
    assert none == 26 * h + 8 * i
    # block input, wq, wv, w1, w2 outputs and the SDPA output
    assert op == 2 * h + 2 * h + 2 * kv + 2 * i + 2 * h + 2 * h
    assert full == 2 * h and op_work == full_work == none
    compiled, _ = native_layer_bytes(LLAMA8, "none", compiled=True)
    assert compiled == 18 * h + 6 * i


def test_tensor_parallel_without_sequence_parallel_keeps_the_boundaries_whole() -> None:
    hw = "1x8xH100-80GB"
    sp = _est(hw, "zero1", tensor_parallel=8, recipe=Recipe(sequence_parallel=True))
    no_sp = _est(hw, "zero1", tensor_parallel=8, recipe=Recipe(sequence_parallel=False))
    assert no_sp.per_gpu_bytes.activations > 1.5 * sp.per_gpu_bytes.activations


def test_pure_bf16_8bit_and_paged_optimizers() -> None:
    hw = "1x1xH100-80GB"
    kw = {"seq_len": 512, "micro_batch_size": 1}
    base = Recipe(framework="torchtune", precision="pure-bf16", checkpointing="full")
    pure = _est(hw, "ddp", recipe=base, **kw)
    assert pure.per_gpu_bytes.params == 2 * PSI
    assert pure.per_gpu_bytes.optimizer == 4 * PSI  # AdamW moments in bf16
    eight = _est(hw, "ddp", recipe=Recipe(**{**base.__dict__, "optimizer": "adam8bit"}), **kw)
    assert eight.per_gpu_bytes.optimizer == int(ADAM8BIT_BYTES * PSI)
    paged = _est(hw, "ddp", recipe=Recipe(**{**base.__dict__, "optimizer": "paged-adam8bit"}), **kw)
    assert paged.per_gpu_bytes.optimizer == 0  # unified memory: outside the allocator


def test_qlora_keeps_the_blocks_in_nf4_and_the_embeddings_in_16_bit() -> None:
    recipe = Recipe(framework="torchtune", precision="pure-bf16", qlora=True, lora_rank=8)
    est = _est("1x1xRTX4090", "ddp", recipe=recipe, task="finetune", seq_len=2048)
    quantized = block_params(LLAMA8) * LLAMA8.layers
    expected = quantized * NF4_BYTES + (PSI - quantized) * 2
    assert est.per_gpu_bytes.params == pytest.approx(expected, rel=0.01)
    assert any("QLoRA" in n for n in est.notes)


def test_the_three_quantities_and_context_parallel() -> None:
    recipe = Recipe(framework="torchtitan", checkpointing="full")
    one = _est("1x8xH100-80GB", recipe=recipe, seq_len=32768)
    cp = _est(
        "1x8xH100-80GB", recipe=Recipe(**{**recipe.__dict__, "context_parallel": 4}), seq_len=32768
    )
    for e in (one, cp):
        b = e.per_gpu_bytes
        assert b.peak_allocated < b.peak_reserved < b.device_used == b.total
    assert cp.context_parallel == 4
    assert cp.per_gpu_bytes.activations < one.per_gpu_bytes.activations / 3
    with pytest.raises(InputError) as err:
        _est("1x8xH100-80GB", recipe=Recipe(context_parallel=3), seq_len=32768)
    assert err.value.field == "cp"


def _cli(*args: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp / "e.json"
    proc = run_main("estimate", *args, "--json", str(out), cwd=ROOT)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def test_estimate_cli_takes_the_recipe_and_reports_the_three_quantities(tmp_path: Path) -> None:
    proc, data = _cli(
        "--model", "llama-3.1-8b", "--hardware", "1x8xH100-80GB", "--seq-len", "8192",
        "--global-batch", "32", "--framework", "torchtitan", "--precision", "pure-bf16",
        "--optimizer", "adam8bit", "--grad-accum", "4", "--checkpointing", "selective-op",
        "--strategy", "zero3", "--tp", "1", "--pp", "1",
        tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    setup = data["setup"]
    assert setup["gradient_accumulation_steps"] == 4 and setup["micro_batch_size"] == 1
    assert 0 < setup["peak_allocated_bytes"] < setup["peak_reserved_bytes"]
    assert setup["peak_reserved_bytes"] < setup["device_used_bytes"]
    assert setup["device_used_bytes"] == setup["per_gpu_bytes"]["total"]
    assert "memory priced for: torchtitan, pure-bf16, adam8bit" in proc.stdout
    assert "fit check: fits" in proc.stdout and "margin" in proc.stdout
    # QLoRA and LoRA: the plan's task becomes LoRA and the base is frozen.
    proc, data = _cli(
        "--model", "llama-3.1-8b", "--hardware", "1x1xRTX4090", "--seq-len", "2048",
        "--global-batch", "2", "--framework", "torchtune", "--qlora", "--activation-offload",
        tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert data["setup"]["fits"] and data["setup"]["device_used_bytes"] < 0.9 * 24 * GB


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--framework", "jax"], "--framework"),
        (["--optimizer", "lion"], "--optimizer"),
        (["--precision", "int4"], "--precision"),
        (["--grad-accum", "3"], "--grad-accum"),
        (["--grad-accum", "0"], "--grad-accum"),
        (["--cp", "0"], "--cp"),
    ],
)
def test_bad_recipe_flags_are_one_line_and_exit_2(
    args: list[str], flag: str, tmp_path: Path
) -> None:
    base = ["--model", "llama-3.1-8b", "--hardware", "1x8xH100-80GB", "--global-batch", "16"]
    proc, _ = _cli(*base, *args, tmp=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], proc.stderr


def test_a_brief_names_the_recipe_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    brief = tmp_path / "b.yaml"
    text = (
        "model: llama-3.1-8b\ntask: finetune\nhardware: 1x1xRTX4090\nseq_len: 2048\n"
        "global_batch_size: 2\nrecipe:\n  framework: torchtune\n  precision: pure-bf16\n"
        "  optimizer: paged-adam8bit\n  optimizer_in_backward: true\n"
    )
    brief.write_text(text)
    out = tmp_path / "e.json"
    proc = run_main("estimate", "--brief", str(brief), "--json", str(out), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # An 8B full fine-tune fits a 24 GB card only with torchtune's recipe (DeepSpeed's
    # default, 18 bytes per parameter, needs 145 GB).
    assert json.loads(out.read_text())["setup"]["fits"]
    assert "memory priced for: torchtune, pure-bf16, paged-adam8bit" in proc.stdout
    brief.write_text(text.replace("paged-adam8bit", "lion"))
    proc = run_main("estimate", "--brief", str(brief), cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "recipe.optimizer" in proc.stderr


@pytest.mark.slow  # a real T5 block forward and backward under autograd (seconds)
@pytest.mark.parametrize("ffn", ["relu", "gated-gelu"])
def test_encoder_decoder_activations_match_what_autograd_saves_for_t5(ffn: str) -> None:
    """The bytes saved_tensors_hooks sees for Hugging Face T5 (fp32 on CPU, dropout on)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from tools.core.schemas import ModelSpec
    from tools.planning.activations import encoder_decoder_bytes

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=128, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_decoder_layers=3,
        num_heads=4, dropout_rate=0.1, feed_forward_proj=ffn, decoder_start_token_id=0,
        pad_token_id=0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config).train()
    b, s, t = 2, 32, 16
    saved: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=torch.randint(0, 128, (b, s)), labels=torch.randint(0, 128, (b, t)))
    measured = sum(n for ptr, n in saved.items() if ptr not in weights)
    spec = ModelSpec(
        name="t5-tiny", params=sum(p.numel() for p in model.parameters()), layers=5, hidden=64,
        heads=4, intermediate=256, vocab=128, seq_len=s, largest_layer_params=128 * 64,
        hf_config=config.to_dict(),
    )  # fmt: skip
    predicted = encoder_decoder_bytes(
        spec, source_len=s, target_len=t, micro_batch_size=b, precision="fp32",
        activation_checkpointing=False, mask_bytes=4,  # CPU dropout keeps fp32 noise
    )  # fmt: skip
    # The fp32 loss term counts the logits and their gradient (8 bytes); autograd saves the
    # log-softmax output (4).
    body = predicted - 8 * b * t * 128
    assert body == pytest.approx(measured - 4 * b * t * 128, rel=0.05)


def test_the_fit_check_says_fits_tight_or_does_not_fit_with_its_margin() -> None:
    from tools.core.schemas import MemoryBreakdown
    from tools.core.strategies import MIN_HEADROOM, SAFE_HEADROOM
    from tools.planning.outcome import fit_verdict

    def line(share: float) -> str:
        used = int(share * 80 * GB)
        b = MemoryBreakdown(
            params=used // 4, gradients=used // 8, optimizer=used // 2, activations=used // 8,
            buffers=0, total=used, peak_allocated=used, peak_reserved=used, device_used=used,
        )  # fmt: skip
        return fit_verdict(b, 80 * GB)

    assert line(1 - SAFE_HEADROOM - 0.01).startswith("fit check: fits with a 19% margin")
    assert "tight" in line(1 - (SAFE_HEADROOM + MIN_HEADROOM) / 2)
    assert "does not fit" in line(1 - MIN_HEADROOM + 0.01)
    assert "largest term: optimizer states" in line(0.5)


def test_fsdp_shard_grad_op_keeps_the_16_bit_weights_gathered_over_sharded_states() -> None:
    recipe = Recipe(framework="fsdp", checkpointing="full")
    zero2 = _est("1x8xH100-80GB", "zero2", recipe=recipe, seq_len=2048)
    # fp32 shards (4 bytes over 8 ranks) plus the gathered bf16 compute copy (2 bytes).
    assert zero2.per_gpu_bytes.params == pytest.approx(4 * PSI / 8 + 2 * PSI, rel=1e-6)
    assert zero2.per_gpu_bytes.gradients == pytest.approx(4 * PSI / 8, rel=1e-6)
    fp32 = _est(
        "1x1xH100-80GB", "ddp", recipe=Recipe(framework="fsdp", precision="fp32"), seq_len=512
    )
    assert fp32.per_gpu_bytes.params == 4 * PSI  # no cast copies in fp32


def test_a_brief_naming_fsdp_or_megatron_is_priced_as_that_framework() -> None:
    from tools.intake.brief import brief_from_dict
    from tools.planning import search_strategy

    base = {"model": "llama-3.1-8b", "hardware": "1x8xH100-80GB", "seq_len": 4096}
    base["global_batch_size"] = 16
    for framework, priced in (("pytorch_fsdp", "fsdp"), ("megatron", "megatron")):
        brief = brief_from_dict({**base, "framework": framework})
        plan = search_strategy(LLAMA8, parse_hardware("1x8xH100-80GB"), brief)
        assert any(a.startswith(f"memory priced for: {priced},") for a in plan.assumptions)
    plain = search_strategy(LLAMA8, parse_hardware("1x8xH100-80GB"), brief_from_dict(base))
    assert not any(a.startswith("memory priced for") for a in plain.assumptions)
