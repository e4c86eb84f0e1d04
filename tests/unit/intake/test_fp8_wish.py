"""A request's fp8 wish becomes the recipe precision on FP8 tensor cores, else a one-line refusal."""

from __future__ import annotations

from tools.core.request_account import AssumedFact, RequestAccount, Wish
from tools.core.schemas import GPUSpec, HardwareSpec
from tools.intake.brief import brief_from_dict
from tools.intake.fp8_wish import apply_fp8_wish

H100 = GPUSpec(name="NVIDIA H100 SXM5 80GB", memory_gb=80, bf16_tflops=989, fp8_tflops=1979)
A100 = GPUSpec(name="NVIDIA A100 80GB SXM", memory_gb=80, bf16_tflops=312)
V100 = GPUSpec(name="NVIDIA V100 16GB", memory_gb=16, fp16_tflops=125)


def _hw(gpu: GPUSpec | None) -> HardwareSpec:
    return HardwareSpec(source="described", nodes=1, gpus_per_node=8 if gpu else 0, gpu=gpu)


def _account() -> RequestAccount:
    return RequestAccount(
        text="fine-tune llama-3-8b with fp8",
        wishes=[Wish(wish="technique:fp8", quote="with fp8")],
        assumed=[AssumedFact(field="precision", value="auto", why="not stated")],
    )


def _brief(**extra):  # type: ignore[no-untyped-def]
    return brief_from_dict({"model": "llama-3-8b", "task": "finetune", **extra})


def test_fp8_tensor_cores_set_the_recipe_precision_read_from_the_words() -> None:
    brief, account = apply_fp8_wish(_brief(), _account(), _hw(H100))
    assert brief.recipe is not None and brief.recipe.precision == "fp8"
    assert brief.recipe.framework is None  # the planner puts it on a launcher that applies it
    read = [r for r in account.read if r.field == "recipe.precision"]
    assert [(r.value, r.quote) for r in read] == [("fp8", "with fp8")]
    assert not any(a.field == "precision" for a in account.assumed)
    wish = account.wish("technique:fp8")
    assert wish is not None and wish.honoured is None  # the reporter marks it from the plan


def test_no_fp8_tensor_cores_keep_16_bit_and_refuse_naming_the_gpu() -> None:
    for gpu, sixteen in ((A100, "bf16"), (V100, "fp16"), (None, "fp32")):
        brief, account = apply_fp8_wish(_brief(), _account(), _hw(gpu))
        assert brief.recipe is None
        wish = account.wish("technique:fp8")
        assert wish is not None and wish.honoured is False
        assert "FP8 tensor cores (Hopper, Ada, Blackwell)" in wish.how
        assert (gpu.name if gpu else "no GPU") in wish.how and f"trains {sixteen}" in wish.how
        assert "\n" not in wish.how


def test_stated_precision_serving_and_no_wish_are_left_alone() -> None:
    stated = _brief(recipe={"precision": "bf16"})
    assert apply_fp8_wish(stated, _account(), _hw(H100))[0] == stated
    serving = _brief(task="inference")
    assert apply_fp8_wish(serving, _account(), _hw(H100))[0] == serving
    plain = RequestAccount(text="x")
    assert apply_fp8_wish(_brief(), plain, _hw(A100)) == (_brief(), plain)
    qlora = _brief(task="lora", recipe={"qlora": True})
    brief, account = apply_fp8_wish(qlora, _account(), _hw(H100))
    assert (
        brief == qlora and "QLoRA" in (account.wish("technique:fp8") or Wish(wish="", quote="")).how
    )
