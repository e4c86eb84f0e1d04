"""The search space: what one strategy search ranges over and the estimates every setup shares.

``SearchSpace`` holds the model, hardware, brief and the dimensions left open (strategies,
micro-batches, recompute policies, model-parallel layouts); it prices one setup's memory
(tools/planning/memory.py) and speed (tools/planning/speed.py) and writes a row in the plan's
contract form. tools/planning/layouts.py builds it; tools/planning/search.py searches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tools.core.schemas import (
    HardwareSpec,
    ModelSpec,
    ResolvedPrecision,
    SetupCandidate,
    SpeedEstimate,
    StrategyEstimate,
    StrategyName,
    TrainingBrief,
)
from tools.core.setup import Setup
from tools.core.strategies import MIN_HEADROOM, RECOMPUTE_POLICIES, Recompute, check_strategy
from tools.planning.attention_kernels import LaunchAttention, launch_attention
from tools.planning.memory import capacity_bytes, estimate_strategy
from tools.planning.recipe import Recipe
from tools.planning.speed import estimate_speed
from tools.planning.vision import image_model
from tools.research.splits import split_framework

# The memory-only choice tries these micro-batches, largest first.
MICRO_BATCH_CANDIDATES = (8, 4, 2, 1)
# The speed search tries every divisor of the per-rank batch up to this many sequences
# (Megatron-LM's and torchtitan's published recipes run micro-batches of 1-16 sequences).
MAX_MICRO_BATCH = 16
# For an image model, images: NVIDIA's DeepLearningExamples ResNet-50 recipes run 128-256
# images per GPU, timm's training benchmarks 64-512.
MAX_IMAGE_MICRO_BATCH = 256
# Strategies a pipeline takes: DeepSpeed's PipelineEngine refuses ZeRO-2/3
# (runtime/pipe/engine.py); Megatron's distributed optimizer is ZeRO-1 (parallel.py).
PIPELINE_STRATEGIES: tuple[StrategyName, ...] = ("ddp", "zero1")
# The layout without model parallelism: every GPU holds the whole model.
DATA_PARALLEL = Setup()


@dataclass
class SearchSpace:
    """What one search ranges over, the inputs every estimate shares, and what it found."""

    model: ModelSpec
    hardware: HardwareSpec
    brief: TrainingBrief
    precision: ResolvedPrecision
    names: list[StrategyName]
    micro: int | None
    ckpts: list[bool]
    notes: list[str]
    # The recompute policies searched, lightest first.
    policies: list[Recompute] = field(default_factory=lambda: list(RECOMPUTE_POLICIES))
    # The speed estimate behind each row's tokens/s, by the row's id.
    speeds: dict[int, SpeedEstimate] = field(default_factory=dict)
    # The (tensor, pipeline) degrees the request pinned; None: searched.
    pinned: tuple[int | None, int | None] = (None, None)
    # The context- and expert-parallel degrees the caller pinned; None: searched.
    cp_pin: int | None = None
    ep_pin: int | None = None
    # The model-parallel layouts searched (t x p x c, as setups of no strategy of their own).
    layouts: list[Setup] = field(default_factory=list)
    # The fewest data-parallel ranks any layout leaves (what a refused batch must divide by).
    smallest_dp: int = 1
    # The framework recipe memory is priced for (tools/planning/recipe.py); None: DeepSpeed's.
    recipe: Recipe | None = None
    # Splits only Megatron runs searched for a model it cannot build as it is (pinned degrees,
    # or nothing else fits: tools/planning/search.py); else kept out (splits.runs_setup).
    inexact_megatron: bool = False

    @property
    def fp8(self) -> bool:
        """Whether the recipe trains with fp8 linears (tools/planning/fp8.py)."""
        return self.recipe is not None and self.recipe.precision == "fp8"

    def attention(self, setup: Setup) -> LaunchAttention:
        """The attention kernel ``setup``'s launch runs (tools/planning/attention_kernels.py).

        The recipe's framework, or where none is named the one that runs the split
        (tools/research/splits.py: Megatron-DeepSpeed for most model-parallel layouts).
        """
        if self.recipe is not None and self.recipe.framework is not None:
            framework: str | None = self.recipe.framework
        else:
            framework = split_framework(
                self.model, setup.strategy, setup.tp, setup.pp, setup.cp, setup.ep
            )
        return launch_attention(framework, self.hardware.gpu, fp8=self.fp8)

    @property
    def tf32(self) -> bool:
        """Whether the recipe trains fp32 tensors on TF32 tensor cores (tools/planning/flops.py)."""
        return self.recipe is not None and self.recipe.precision == "tf32"

    def dp(self, layout: Setup = DATA_PARALLEL) -> int:
        """Data-parallel ranks of ``layout``: world / (t x p x c)."""
        return max(1, self.hardware.world_size // layout.split)

    def per_rank(self, layout: Setup = DATA_PARALLEL) -> int:
        """Sequences per data-parallel rank per optimizer step."""
        return self.brief.batch // self.dp(layout)

    def micro_options(self, per_rank: int) -> list[int]:
        """The memory-only choice's micro-batches, largest first (or the pinned one)."""
        if self.micro:
            return [self.micro]
        return [m for m in MICRO_BATCH_CANDIDATES if per_rank % m == 0]

    def micro_range(self, per_rank: int) -> list[int]:
        """The speed search's micro-batches, smallest first (or the pinned one)."""
        if self.micro:
            return [self.micro] if per_rank % self.micro == 0 else []
        most = MAX_IMAGE_MICRO_BATCH if image_model(self.model) else MAX_MICRO_BATCH
        return [m for m in range(1, min(per_rank, most) + 1) if per_rank % m == 0]

    def estimate(self, name: StrategyName, micro: int, ckpt: bool) -> StrategyEstimate:
        """The memory estimate of one data-parallel setup (full or no recompute)."""
        recompute: Recompute = "full" if ckpt else "none"
        return self.estimate_setup(Setup(name, micro_batch=micro, recompute=recompute))

    def estimate_setup(self, setup: Setup) -> StrategyEstimate:
        """The memory estimate of one setup, recording its recompute policy and layout.

        Context parallelism splits every sequence over c GPUs, so a rank's activations are those
        of seq / c tokens (Megatron-Core context_parallel docs); the model states are sharded by
        ZeRO over the d x c ranks that hold the same weights (Megatron's data-and-context group).
        """
        name, micro, policy, layout = setup.strategy, setup.micro_batch, setup.recompute, setup
        steps = self.per_rank(layout) // micro
        recipe = None
        if self.recipe is not None:
            recipe = replace(
                self.recipe,
                checkpointing=recipe_policy(self.recipe, policy),
                gradient_accumulation_steps=max(1, steps),
                context_parallel=1,  # the sequence below is already one rank's share
            )
        est = estimate_strategy(
            self.model,
            self.hardware,
            check_strategy(name),
            task=self.brief.task,
            precision=self.precision,
            micro_batch_size=micro,
            activation_checkpointing=policy == "full",
            selective_recompute=policy == "selective",
            seq_len=self.brief.seq_len // layout.cp,
            tensor_parallel=layout.tp,
            pipeline_parallel=layout.pp,
            gradient_accumulation_steps=steps,
            recipe=recipe,
            expert_parallel=layout.ep,
            attention=self.attention(setup).kernel,
        )
        return est.model_copy(
            update={
                "activation_checkpointing": policy != "none",
                "checkpointing": policy,
                "context_parallel": layout.cp,
                "data_parallel": self.dp(layout),
                "gradient_accumulation_steps": max(1, steps),
            }
        )

    def with_speed(self, est: StrategyEstimate) -> StrategyEstimate:
        """``est`` with the speed model's tokens/s; the estimate itself is kept in ``speeds``."""
        tp, pp, cp = est.tensor_parallel, est.pipeline_parallel, est.context_parallel
        speed = estimate_speed(
            self.model,
            self.hardware,
            est.name,
            micro_batch_size=est.micro_batch_size,
            gradient_accumulation_steps=self.per_rank(est.setup) // est.micro_batch_size,
            activation_checkpointing=est.activation_checkpointing,
            precision="fp8" if self.fp8 else "tf32" if self.tf32 else self.precision,
            seq_len=self.brief.seq_len,
            dataset_tokens=self.brief.dataset_tokens,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            recompute=est.checkpointing,
            virtual_stages=est.virtual_stages,
            context_parallel=cp,
            expert_parallel=est.expert_parallel,
            # torchtitan's launch file turns FSDP2's float8 all-gather on with fp8 linears.
            fp8_all_gather=self.fp8
            and self.recipe is not None
            and self.recipe.framework == "torchtitan",
            attention=self.attention(est.setup).kernel,
        )
        row = est.model_copy(update={"tokens_per_s": speed.tokens_per_s})
        self.speeds[id(row)] = speed
        return row

    def candidate(self, row: StrategyEstimate) -> SetupCandidate:
        """``row`` in the contract's form, with its speed estimate's step time and MFU."""
        layout = row.setup
        per_rank = self.per_rank(layout)
        speed = self.speeds.get(id(row))
        t = row.per_gpu_bytes
        return SetupCandidate(
            strategy=row.name,
            tensor_parallel=layout.tp,
            pipeline_parallel=layout.pp,
            data_parallel=self.dp(layout),
            virtual_stages=row.virtual_stages,
            context_parallel=layout.cp,
            micro_batch_size=row.micro_batch_size,
            gradient_accumulation_steps=max(1, per_rank // row.micro_batch_size),
            checkpointing=row.checkpointing,
            stage_layers=row.stage_layers,
            expert_parallel=row.expert_parallel,
            per_gpu_bytes={
                "params": t.params,
                "gradients": t.gradients,
                "optimizer": t.optimizer,
                "activations": t.activations,
                "buffers": t.buffers,
                "total": t.total,
            },
            peak_allocated_bytes=t.peak_allocated,
            peak_reserved_bytes=t.peak_reserved,
            device_used_bytes=t.device_used,
            fits=row.fits and t.total <= (1 - MIN_HEADROOM) * (capacity_bytes(self.hardware) or 0)
            if self.hardware.gpu is not None
            else row.fits,
            step_time_s=speed.step_time_s if speed else None,
            tokens_per_s=speed.tokens_per_s if speed else row.tokens_per_s,
            mfu=speed.mfu if speed else None,
        )


def recipe_policy(recipe: Recipe, policy: Recompute) -> str:
    """The recipe's flavour of the search's policy: selective is per-op in torchtitan."""
    if policy != "selective":
        return policy
    if recipe.checkpointing == "selective-op" or recipe.framework == "torchtitan":
        return "selective-op"
    return "selective"
