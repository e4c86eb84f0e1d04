"""The training recipe the memory model prices: framework, precision, optimizer, recompute, extras.

Memory depends on what a framework does, not only on the parallel layout: DeepSpeed keeps an
fp32 gradient copy, FSDP2 keeps fp32 sharded parameters and no separate master copy, Megatron
keeps a persistent fp32 gradient buffer, torchtune steps the optimizer inside backward. A
``Recipe`` names those choices; ``resolve_recipe`` fills what the user left out with the
framework's own defaults and says which it assumed, so the plan can state them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tools.core.errors import InputError
from tools.core.schemas import ModelSpec, TrainingBrief
from tools.research.titan_wish import recipe_framework

# deepspeed: DeepSpeed ZeRO 0-3 (the planner's default); fsdp: PyTorch FSDP1/FSDP2 as in a plain
# training loop or the Hugging Face Trainer; torchtitan: FSDP2 + TP/PP/CP as torchtitan runs
# them; torchtune: torchtune's recipes (FSDP2, or one GPU); megatron: Megatron-LM / Megatron
# Core; nanotron: Hugging Face nanotron.
FRAMEWORKS = ("deepspeed", "fsdp", "torchtitan", "torchtune", "megatron", "nanotron")
# bf16/fp16: mixed precision with fp32 master weights; fp32; pure-bf16: bf16 weights, gradients
# and optimizer states, no fp32 copy; fp8: fp8 linears (torchao Float8Linear / Transformer
# Engine) over bf16 mixed precision; tf32: fp32 training whose matmuls and convolutions run on
# TF32 tensor cores (allow_tf32), memory as fp32.
PRECISIONS = ("bf16", "fp16", "fp32", "pure-bf16", "fp8", "tf32", "auto")
OPTIMIZERS = ("adamw", "adam", "adam8bit", "paged-adam8bit", "adafactor", "sgd")
# none; selective: Megatron's (Korthikanti et al. 2022 sec. 5: the attention core only);
# selective-op: torchtitan's per-op policy (saves matmul outputs except every second one, and
# the attention kernel's outputs); full: every layer keeps only its input.
CHECKPOINTING = ("none", "selective", "selective-op", "full")
# standard: logits upcast to fp32 and a log-softmax saved for backward; chunked: torchtune's
# CEWithChunkedOutputLoss (8 chunks); fused: a compiled or fused kernel (Liger, torch.compile'd
# loss) that never materialises fp32 logits.
LOSSES = ("standard", "chunked", "fused")

# What each framework does when the recipe does not say (its own docs / default configs).
_DEFAULTS: dict[str, dict[str, object]] = {
    # DeepSpeed's ZeRO configs the planner emits: bf16 mixed precision, fused AdamW; its
    # tensor-parallel setups launch through Megatron or torchtitan, both with sequence
    # parallelism (DeepSpeed AutoTP alone has none: name sequence_parallel=False for it).
    "deepspeed": {"loss": "standard", "sequence_parallel": True},
    "fsdp": {"loss": "standard", "sequence_parallel": False},
    # torchtitan's llama3 train configs: selective per-op AC, TP with sequence parallelism
    # (its parallelize plan shards norms with SequenceParallel), cross-entropy on fp32 logits.
    "torchtitan": {"loss": "standard", "sequence_parallel": True, "checkpointing": "selective-op"},
    # torchtune's llama3.x configs: CEWithChunkedOutputLoss, activation checkpointing on.
    "torchtune": {"loss": "chunked", "sequence_parallel": False, "checkpointing": "full"},
    # Megatron-LM: sequence parallelism is the norm with TP (Korthikanti et al. 2022), the
    # distributed optimizer likewise in its example scripts.
    "megatron": {"loss": "standard", "sequence_parallel": True, "distributed_optimizer": True},
    "nanotron": {"loss": "standard", "sequence_parallel": True},
}


@dataclass(frozen=True)
class Recipe:
    """One training recipe; ``None`` fields take the framework's default (``resolve_recipe``)."""

    framework: str = "deepspeed"
    precision: str = "bf16"
    optimizer: str = "adamw"
    checkpointing: str | None = None
    loss: str | None = None
    gradient_accumulation_steps: int = 1
    lora_rank: int | None = None
    qlora: bool = False
    context_parallel: int = 1
    activation_offload: bool = False
    sequence_parallel: bool | None = None
    distributed_optimizer: bool | None = None
    # torchtune's optimizer_in_bwd: each parameter's step runs as its gradient is ready, so no
    # full set of gradients ever exists.
    optimizer_in_backward: bool = False
    # torch.compile'd blocks (fewer saved tensors, tools/planning/footprint.py); a compiled
    # chunked loss fuses each chunk's upcast.
    compile: bool = False
    # Encoder-decoder models: decoder (target) tokens per sequence; None: the sequence length.
    target_len: int | None = None
    assumed: tuple[str, ...] = field(default=(), compare=False)

    @property
    def mixed(self) -> bool:
        """fp32 master weights next to 16-bit working weights."""
        return self.precision in ("bf16", "fp16", "fp8")

    @property
    def fsdp_like(self) -> bool:
        """Parameters kept in fp32 and cast on all-gather (FSDP's MixedPrecisionPolicy)."""
        return self.framework in ("fsdp", "torchtitan", "torchtune")

    def describe(self) -> str:
        """One line for the plan: what was priced."""
        parts = [
            self.framework,
            self.precision,
            self.optimizer,
            f"recompute {self.checkpointing}",
            f"{self.loss} loss",
        ]
        if self.gradient_accumulation_steps > 1:
            parts.append(f"grad accum {self.gradient_accumulation_steps}")
        if self.qlora:
            parts.append(f"QLoRA rank {self.lora_rank}")
        elif self.lora_rank:
            parts.append(f"LoRA rank {self.lora_rank}")
        if self.context_parallel > 1:
            parts.append(f"CP {self.context_parallel}")
        if self.activation_offload:
            parts.append("activation offload")
        if self.optimizer_in_backward:
            parts.append("optimizer in backward")
        return ", ".join(parts)


def _check(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise InputError(name, f"unknown {name} {value!r}; use {' | '.join(allowed)}")
    return value


def resolve_recipe(recipe: Recipe | None = None, **changes: object) -> Recipe:
    """Validate a recipe and fill its framework's defaults, recording each one assumed."""
    base = replace(recipe or Recipe(), **changes)  # type: ignore[arg-type]
    _check(base.framework, FRAMEWORKS, "framework")
    _check(base.precision, PRECISIONS, "precision")
    _check(base.optimizer, OPTIMIZERS, "optimizer")
    if base.gradient_accumulation_steps < 1:
        raise InputError("grad_accum", "must be at least 1")
    if base.context_parallel < 1:
        raise InputError("cp", "must be at least 1")
    if base.target_len is not None and base.target_len < 1:
        raise InputError("target_len", "must be at least 1")
    if base.lora_rank is not None and base.lora_rank < 1:
        raise InputError("lora_rank", "must be at least 1")
    if base.qlora and base.precision in ("fp32", "fp8", "tf32"):
        raise InputError("qlora", "QLoRA trains 16-bit adapters over a 4-bit base: use bf16")
    defaults = _DEFAULTS[base.framework]
    assumed = list(base.assumed)
    updates: dict[str, object] = {}
    for key in ("checkpointing", "loss", "sequence_parallel", "distributed_optimizer"):
        if getattr(base, key) is None:
            value = defaults.get(key, "none" if key == "checkpointing" else False)
            updates[key] = value
            if key in defaults or (key == "loss" and value != "standard"):
                assumed.append(f"{key.replace('_', ' ')} {value} ({base.framework}'s default)")
    if base.qlora and base.lora_rank is None:
        updates["lora_rank"] = 8  # torchtune's qlora configs and the QLoRA paper use r = 8..64
        assumed.append("LoRA rank 8 for QLoRA")
    resolved = replace(base, **updates, assumed=tuple(assumed))  # type: ignore[arg-type]
    _check(str(resolved.checkpointing), CHECKPOINTING, "checkpointing")
    _check(str(resolved.loss), LOSSES, "loss")
    return resolved


# The brief's framework ids whose memory behaviour a recipe framework describes.
_BRIEF_FRAMEWORKS = {
    "deepspeed": "deepspeed",
    "pytorch_fsdp": "fsdp",
    "pytorch": "fsdp",
    "pytorch_ddp": "fsdp",
    "megatron": "megatron",
}


def recipe_from_brief(brief: TrainingBrief, model: ModelSpec | None = None) -> Recipe | None:
    """The brief's ``recipe`` block as a resolved Recipe (None when the brief has none).

    A torchtitan wish is priced as torchtitan where it runs the job (``model``), else as the
    FSDP that runs in its place (tools/research/titan_wish.py).
    """
    spec = brief.recipe
    brief_frameworks = {**_BRIEF_FRAMEWORKS, "torchtitan": recipe_framework(brief, model)}
    if brief.task == "lora":
        # Megatron-DeepSpeed's launch trains every weight: a LoRA job runs (and is priced)
        # elsewhere (tools/research/framework.py says why).
        brief_frameworks["megatron"] = "deepspeed"
    if spec is None:
        # A framework the request names whose memory differs from DeepSpeed's is priced as
        # it runs (FSDP's fp32 shards, Megatron's gradient buffer) with its defaults.
        named = brief_frameworks.get(str(brief.framework))
        moe = model is not None and (model.active_params or model.params) < model.params
        if brief.framework == "megatron" and moe:
            # Megatron-DeepSpeed trains a mixture of experts with DeepSpeed-MoE under the
            # DeepSpeed engine's ZeRO (its launch here): priced as DeepSpeed, so its expert
            # parallelism is searched (tools/planning/layouts.py prices it for ZeRO only).
            return None
        if brief.framework not in ("pytorch_fsdp", "megatron", "torchtitan") or named in (
            None,
            "deepspeed",
        ):
            return None
        precision = brief.precision if brief.precision != "auto" else "bf16"
        return resolve_recipe(Recipe(framework=named, precision=precision))
    fields = spec.model_dump(exclude_none=True)
    framework = fields.pop("framework", None) or brief_frameworks.get(
        str(brief.framework), "deepspeed"
    )
    if framework == "torchtitan" and brief.framework == "torchtitan":
        # Priced as what runs: FSDP in torchtitan's place where torchtitan cannot run the job.
        framework = brief_frameworks["torchtitan"]
    precision = fields.pop("precision", None) or (
        brief.precision if brief.precision != "auto" else "bf16"
    )
    try:
        return resolve_recipe(Recipe(framework=framework, precision=precision, **fields))
    except InputError as exc:
        raise InputError(f"brief.recipe.{exc.field}", exc.message) from None
