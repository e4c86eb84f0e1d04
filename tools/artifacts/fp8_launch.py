"""Which launcher applies a plan's fp8 linears, and what the plan trains in when none can.

Two launches here apply fp8 (tools/artifacts/launch.py): torchtitan's TOML (the
``quantize.linear.float8`` converter) for the Llama 3.1 shapes a torchtitan flavor builds
exactly (tools/research/titan_flavors.py), and Megatron-DeepSpeed (Transformer Engine,
``--fp8-hybrid``) for a GPT-3-style model (LayerNorm, GeLU, biases, full multi-head attention)
trained as its plain model, without pipeline stages or context parallelism
(tools/artifacts/megatron_fp8.py); the search's setup is checked too (``setup_refusal``).
The DeepSpeed, torchrun/FSDP and other train.py launches have no fp8 path. So an fp8 recipe runs
on torchtitan where it builds the model, else on Megatron-DeepSpeed, unless the request names
another framework; when no launch can apply fp8, the plan trains and is priced as bf16 mixed
precision, and says so in one line (never an fp8 speed quoted for a bf16 run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.artifacts.headline import FP8_NOT_APPLIED
from tools.artifacts.megatron_fp8 import fp8_refusal, te_gaps
from tools.core.request_account import RequestAccount, mark_wish
from tools.core.schemas import TRAINING_TASKS, MemoryPlan, ModelSpec, TrainingBrief
from tools.intake.fp8_wish import FP8_WISH
from tools.research.megatron_arch import convert_refusal, unexpressed
from tools.research.splits import refused_in
from tools.research.titan_flavors import build_refusal, titan_refusal, torchtitan_flavor
from tools.research.titan_wish import IN_ITS_PLACE

# The recipe frameworks whose launch applies fp8 linears.
FP8_FRAMEWORKS = ("torchtitan", "megatron")
# A brief framework's recipe framework, for the ones that name a launcher with no fp8 path.
_NO_FP8_PATH = {
    "deepspeed": "DeepSpeed",
    "pytorch_fsdp": "PyTorch FSDP (torchrun)",
    "pytorch_ddp": "PyTorch DDP (torchrun)",
    "pytorch": "plain PyTorch",
    "horovod": "Horovod",
    "tensorflow": "TensorFlow",
    "fsdp": "PyTorch FSDP (torchrun)",
    "torchtune": "torchtune",
    "nanotron": "nanotron",
}


@dataclass(frozen=True)
class Fp8Launch:
    """Where an fp8 recipe runs: ``framework`` applies it, or ``note`` says why none does."""

    framework: str | None
    note: str | None = None


def _not_applied(why: str) -> Fp8Launch:
    return Fp8Launch(
        None,
        f"{FP8_NOT_APPLIED}: {why}, so the plan trains bf16 mixed precision and its speed is "
        "priced as bf16 (torchtitan and Megatron-DeepSpeed launches apply fp8)",
    )


def pinned_framework(brief: TrainingBrief) -> str | None:
    """The framework the request pins a launch to: the brief's, else its recipe's (None: free)."""
    if brief.framework is not None:
        return str(brief.framework)
    return brief.recipe.framework if brief.recipe is not None else None


def fp8_launch(brief: TrainingBrief, model: ModelSpec) -> Fp8Launch | None:
    """Where the brief's fp8 recipe runs (None: the brief asks no fp8 for training).

    A pinned framework keeps its launch: torchtitan and Megatron apply fp8 (torchtitan only for
    a model one of its flavors builds, Megatron only for a GPT-3-style model its Transformer
    Engine layers build, never a fine-tune's pipeline model), any other trains bf16. Unpinned:
    torchtitan for its flavors, else Megatron-DeepSpeed where its GPT and its Transformer
    Engine layers build the model, neither refused by the request; a LoRA job runs train.py
    (peft). The setup the search picks can still rule Megatron's fp8 out (``setup_refusal``).
    """
    recipe = brief.recipe
    if recipe is None or recipe.precision != "fp8" or brief.task not in TRAINING_TASKS:
        return None
    pinned = pinned_framework(brief)
    if pinned in _NO_FP8_PATH:
        return _not_applied(
            f"the request asks for {_NO_FP8_PATH[pinned]}, whose launch here has no fp8 path"
        )
    if pinned == "torchtitan" and (why := titan_refusal(model, brief.task)) is not None:
        if brief.framework == "torchtitan":
            # The framework line says why torchtitan is not used (tools/research/titan_wish.py).
            return _not_applied(
                f"torchtitan cannot run this job, and {_NO_FP8_PATH[IN_ITS_PLACE]}, which runs "
                "in its place, has no fp8 path"
            )
        return _not_applied(f"torchtitan was asked for and cannot run {model.name} ({why})")
    # Megatron-DeepSpeed's fp8 runs in Transformer Engine's GPT-3-style layers only, and a
    # fine-tune loads the converter's checkpoint into its pipeline model (megatron_fp8.py).
    te_missing = te_gaps(model, pipeline_model=brief.loads_weights)
    if pinned == "megatron" and te_missing:
        return Fp8Launch(
            None, fp8_refusal(model, 1, pipeline_model=brief.loads_weights, priced_bf16=True)
        )
    if pinned is not None:
        return Fp8Launch(pinned)
    if brief.task == "lora":
        return _not_applied(
            "LoRA adapters train with the Hugging Face job (train.py with peft), which has no "
            "fp8 path"
        )
    # torchtitan is FSDP2's trainer: refusing FSDP refuses it too.
    titan_refused = {"torchtitan", "pytorch_fsdp"} & set(brief.avoid_frameworks)
    if torchtitan_flavor(model) is not None and not titan_refused:
        return Fp8Launch("torchtitan")
    gaps = unexpressed(model)
    convert = convert_refusal(model) if brief.loads_weights else None
    megatron_refused = refused_in("megatron", brief.avoid_frameworks)
    if not gaps and convert is None and not megatron_refused and not te_missing:
        return Fp8Launch("megatron")
    titan = (
        "the request refuses it"
        if titan_refused
        else build_refusal(model) or "no torchtitan flavor builds it"
    )
    megatron = (
        f"the request refuses {', '.join(megatron_refused)}"
        if megatron_refused
        else convert
        or (f"it cannot express {'; '.join(gaps)}" if gaps else None)
        or "its fp8 runs only in Transformer Engine's GPT-3-style layers, and this plan has "
        + "; ".join(te_missing)
    )
    return _not_applied(
        f"neither fp8 launch runs {model.name}: torchtitan ({titan}), Megatron-DeepSpeed "
        f"({megatron})"
    )


def setup_refusal(brief: TrainingBrief, model: ModelSpec, memory: MemoryPlan) -> str | None:
    """Why the searched setup's Megatron launch would not apply the recipe's fp8 (None: it would).

    Pipeline stages build Megatron-DeepSpeed's pipeline model, and context parallelism is
    DeepSpeed-Ulysses around Megatron's own attention: neither runs Transformer Engine's fp8
    layers (tools/artifacts/megatron_fp8.py). None too for a recipe that is not fp8 on Megatron.
    """
    recipe = brief.recipe
    if recipe is None or recipe.precision != "fp8" or recipe.framework != "megatron":
        return None
    setup = memory.chosen_setup
    return fp8_refusal(
        model,
        setup.tp,
        pipeline_model=setup.pp > 1 or brief.loads_weights,
        context_parallel=setup.cp,
        expert_parallel=setup.ep,
        priced_bf16=True,
    )


def mark_fp8_wish(
    account: dict[str, Any] | None,
    *,
    primary: str | None,
    gemm_precision: str | None,
    launch_notes: list[str],
    precision_note: str | None,
) -> dict[str, Any] | None:
    """The account with the request's fp8 wish marked from the plan made (the reporter's).

    Refused with the plan's own line when fp8 is not applied (no launch applies it, or the
    launch has no fp8 path); honoured when the speed is the fp8 path's and the launch applies
    it. A wish intake already decided (no FP8 tensor cores) keeps its mark.
    """
    wish = RequestAccount.model_validate(account).wish(FP8_WISH) if account else None
    if wish is None or wish.honoured is not None:
        return account
    missed = precision_note or next(
        (n for n in launch_notes if n.startswith(FP8_NOT_APPLIED)), None
    )
    if missed is not None:
        return mark_wish(account, FP8_WISH, False, missed)
    if gemm_precision == "fp8":
        return mark_wish(
            account,
            FP8_WISH,
            True,
            f"planned: fp8 linears on {primary}, whose launch files apply them; the speed is "
            "the fp8 path's",
        )
    return account
