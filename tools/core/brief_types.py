"""The brief's types: what a TrainingBrief holds, its vocabularies and its bounds.

Part of the plan contract (tools/core/schemas.py re-exports every name here).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from tools.core.inference_types import ServingEngine, WeightDtype

Task = Literal["pretrain", "finetune", "lora", "inference", "agent-app"]
# The tasks that train weights (a recipe, a schedule and a launch apply to them).
TRAINING_TASKS = ("pretrain", "finetune", "lora")
Precision = Literal["bf16", "fp16", "fp32", "auto"]
# What training really runs in once "auto" and CPU-only machines are resolved.
ResolvedPrecision = Literal["bf16", "fp16", "fp32"]
Bottleneck = Literal["compute", "communication", "offload", "unknown"]
Experience = Literal["beginner", "intermediate", "expert"]
Stack = Literal["pytorch", "tensorflow", "none"]
Deployment = Literal["none", "research", "production-serving", "mobile"]
FrameworkId = Literal[
    "pytorch",
    "pytorch_ddp",
    "pytorch_fsdp",
    "deepspeed",
    "horovod",
    "tensorflow",
    "megatron",
    "torchtitan",
    "langchain",
    "langgraph",
    "crewai",
    "autogen",
]

# The launch a recipe framework (MemoryRecipe.framework) plans on when the brief names no
# framework (tools/intake/recipe_framework.py): its own where trainwright writes one, PyTorch
# FSDP for torchtune's recipes (FSDP2 is what they shard with); nanotron has none here.
RECIPE_LAUNCH: dict[str, FrameworkId] = {
    "deepspeed": "deepspeed",
    "fsdp": "pytorch_fsdp",
    "torchtune": "pytorch_fsdp",
    "torchtitan": "torchtitan",
    "megatron": "megatron",
}
# The recipe frameworks that price what each brief framework's launch runs; a brief naming
# another beside it contradicts itself (nanotron, with no launch, is replaced and said).
RECIPES_OF: dict[str, tuple[str, ...]] = {
    "deepspeed": ("deepspeed",),
    "pytorch_fsdp": ("fsdp", "torchtune"),
    "pytorch": ("fsdp",),
    "pytorch_ddp": ("fsdp",),
    "megatron": ("megatron",),
    "torchtitan": ("torchtitan",),
}


def recipe_contradiction(
    framework: str | None, recipe_framework: str | None, avoided: list[str]
) -> str | None:
    """Why a brief's ``framework`` and ``recipe.framework`` cannot both hold (None: they can).

    The plan launches one framework and prices memory as it runs, so the two must name the same
    run; a recipe framework whose launch ``avoid_frameworks`` refuses contradicts it too.
    """
    if recipe_framework is None or recipe_framework == "nanotron":
        return None
    launch = RECIPE_LAUNCH[recipe_framework]
    if framework is None:
        if launch in avoided:
            return (
                f"recipe.framework {recipe_framework} plans on {launch}, which avoid_frameworks "
                "refuses"
            )
        return None
    agree = RECIPES_OF.get(framework, ())
    if recipe_framework in agree:
        return None
    fix = (
        f"set recipe.framework to {' or '.join(agree)}, or leave it out"
        if agree
        else "leave recipe.framework out"
    )
    return (
        f"recipe.framework {recipe_framework} contradicts framework {framework}: the plan "
        f"launches {framework} and prices memory as it runs; {fix} (or drop framework to "
        f"plan on {launch})"
    )


# The brief precision (the launch's tensors) each recipe precision trains under: pure-bf16 keeps
# no fp32 master copy and fp8 runs its linears in fp8 around bf16 tensors (tools/planning/fp8.py).
RECIPE_PRECISION_BASE: dict[str, ResolvedPrecision] = {
    "bf16": "bf16",
    "pure-bf16": "bf16",
    "fp8": "bf16",
    "fp16": "fp16",
    "fp32": "fp32",
    # fp32 tensors whose matmuls and convolutions run on TF32 tensor cores.
    "tf32": "fp32",
}


def precision_contradiction(precision: str, recipe_precision: str | None) -> str | None:
    """Why a brief's ``precision`` and ``recipe.precision`` cannot both hold (None: they can).

    The launch trains in ``precision`` and memory is priced for ``recipe.precision``: the two
    must name the same run, or the plan would price one and launch the other.
    """
    if recipe_precision is None or precision == "auto":
        return None
    base = RECIPE_PRECISION_BASE[recipe_precision]
    if base == precision:
        return None
    return (
        f"recipe.precision {recipe_precision} contradicts precision {precision}: the launch "
        f"trains in {precision} and memory would be priced for {recipe_precision}; set "
        f"precision to {base} or auto, or leave recipe.precision out"
    )


def _not_a_bool(value: Any) -> Any:
    # YAML reads `true` as a boolean and pydantic would take it as 1: a count is a number.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not the boolean {str(value).lower()}")
    return value


# An integer or float field of a brief: the numbers pydantic accepts, but never true/false.
Count = Annotated[int, BeforeValidator(_not_a_bool)]
Amount = Annotated[float, BeforeValidator(_not_a_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The largest model a brief may describe, by shape or by size; a config.json gets the same
# bounds (tools/research/model_catalog.py), checked before anything is built.
MAX_LAYERS = 1000
MAX_HIDDEN = 1_000_000
MAX_HEADS = 10_000
MAX_VOCAB = 10_000_000
MAX_INTERMEDIATE = 10_000_000
MAX_EXPERTS = 1024
MAX_PARAMS = 1e14
# The bounds of a brief's counts (and of the CLI flags that set them, app.py NUMBER_FLAGS).
MAX_SEQ_LEN = 1_048_576
MAX_GLOBAL_BATCH = 1_000_000
MAX_LORA_RANK = 4096
MAX_TENSOR_PARALLEL = 64
MAX_PIPELINE_PARALLEL = 1024
# An expert split is at most one expert per rank; a context split at most 1024 ranks a sequence.
MAX_EXPERT_PARALLEL = MAX_EXPERTS
MAX_CONTEXT_PARALLEL = 1024


class Team(_Strict):
    """Who will run the training."""

    experience: Experience = "intermediate"
    existing_stack: Stack = "pytorch"


class ModelShape(_Strict):
    """A model given by its dimensions instead of a catalog id or config file."""

    layers: Count = Field(gt=0, le=MAX_LAYERS)
    hidden: Count = Field(gt=0, le=MAX_HIDDEN)
    heads: Count = Field(gt=0, le=MAX_HEADS)
    vocab: Count = Field(gt=0, le=MAX_VOCAB)
    intermediate: Count | None = Field(default=None, gt=0, le=MAX_INTERMEDIATE)
    # Grouped-query attention: the KV heads (None: as many as heads).
    kv_heads: Count | None = Field(default=None, gt=0, le=MAX_HEADS)
    # A catalog id whose config gives everything but these sizes (norms, activation, RoPE,
    # tied embeddings): "a 20B llama" is a llama-2-13b config at 20B's sizes. None: llama-style.
    like: str | None = Field(default=None, min_length=1, max_length=100)


class ModelParams(_Strict):
    """A model given only by its parameter count."""

    params: Amount = Field(gt=0, le=MAX_PARAMS)


class Pins(_Strict):
    """Setup dimensions the request fixed ("ZeRO-2", "TP 4", "EP 8", "no offload"); None: searched."""

    zero_stage: Count | None = Field(default=None, ge=0, le=3)
    tensor_parallel: Count | None = Field(default=None, ge=1, le=MAX_TENSOR_PARALLEL)
    pipeline_parallel: Count | None = Field(default=None, ge=1, le=MAX_PIPELINE_PARALLEL)
    # A mixture of experts' expert-parallel degree (1: every expert on each rank).
    expert_parallel: Count | None = Field(default=None, ge=1, le=MAX_EXPERT_PARALLEL)
    # Ranks each sequence is split over (ring attention or DeepSpeed-Ulysses; 1: whole sequences).
    context_parallel: Count | None = Field(default=None, ge=1, le=MAX_CONTEXT_PARALLEL)
    offload: bool | None = None
    # Sequences per GPU per forward pass ("micro batch 4", "batch 2 per GPU").
    micro_batch: Count | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    # ZeRO stages the request refuses ("do not use ZeRO-3"); the search offers none of them.
    avoid_zero_stages: list[Annotated[int, Field(ge=0, le=3)]] = Field(
        default_factory=list, max_length=4
    )

    def stated(self) -> list[str]:
        """The pins as words, e.g. ``["ZeRO stage 2", "no offload"]``."""
        words = []
        if self.zero_stage is not None:
            words.append(f"ZeRO stage {self.zero_stage}")
        words += [f"no ZeRO stage {stage}" for stage in self.avoid_zero_stages]
        if self.tensor_parallel is not None:
            words.append(f"tensor parallel {self.tensor_parallel}")
        if self.pipeline_parallel is not None:
            words.append(f"pipeline parallel {self.pipeline_parallel}")
        if self.expert_parallel is not None:
            words.append(f"expert parallel {self.expert_parallel}")
        if self.context_parallel is not None:
            words.append(f"context parallel {self.context_parallel}")
        if self.offload is not None:
            words.append("offload" if self.offload else "no offload")
        if self.micro_batch is not None:
            words.append(f"micro-batch {self.micro_batch}")
        return words


class MemoryRecipe(_Strict):
    """How the training runs, for the memory model (tools/planning/recipe.py); None: defaults.

    ``framework`` None follows the brief's framework (pytorch_fsdp -> fsdp, megatron ->
    megatron, plain PyTorch -> fsdp's unsharded path), else DeepSpeed.
    """

    framework: (
        Literal["deepspeed", "fsdp", "torchtitan", "torchtune", "megatron", "nanotron"] | None
    ) = None
    precision: Literal["bf16", "fp16", "fp32", "pure-bf16", "fp8", "tf32"] | None = None
    optimizer: Literal["adamw", "adam8bit", "paged-adam8bit", "adafactor", "sgd"] | None = None
    checkpointing: Literal["none", "selective", "selective-op", "full"] | None = None
    loss: Literal["standard", "chunked", "fused"] | None = None
    lora_rank: Count | None = Field(default=None, ge=1, le=MAX_LORA_RANK)
    qlora: bool = False
    activation_offload: bool = False
    sequence_parallel: bool | None = None
    distributed_optimizer: bool | None = None
    optimizer_in_backward: bool = False
    compile: bool = False
    # Encoder-decoder models (T5, BART): decoder tokens per sequence; None: seq_len.
    target_len: Count | None = Field(default=None, ge=1, le=1_048_576)


class TrainingBrief(_Strict):
    """What the user wants to train, on what (the README's brief format)."""

    goal: str = ""
    # None only for an agent application, which trains nothing.
    model: str | ModelParams | ModelShape | None = None
    task: Task = "finetune"
    # Inference plans only (task inference; None: the plan's stated defaults).
    context_len: Count | None = Field(default=None, gt=0, le=1_048_576)
    concurrency: Count | None = Field(default=None, gt=0, le=100_000)
    engine: ServingEngine | None = None
    weight_dtype: WeightDtype | None = None
    seq_len: Count = Field(default=2048, gt=0, le=MAX_SEQ_LEN)
    # None: not given; the planner picks one the data-parallel degree divides, for the model's
    # size (tools/planning/batch.py), and the plan says so.
    global_batch_size: Count | None = Field(default=None, gt=0, le=MAX_GLOBAL_BATCH)
    hardware: str = "local"
    # Between nodes: ib400 | ib200 | roce100 | eth25 | nvlink; None when unknown.
    interconnect: str | None = None
    # What a node has besides its GPUs, when known: host RAM (bounds CPU offload) and its
    # network cards (the comm model's inter-node bandwidth: NICs x Gb/s / 8).
    host_ram_gb: Amount | None = Field(default=None, gt=0, le=1_000_000)
    nics_per_node: Count | None = Field(default=None, ge=1, le=64)
    nic_gbps: Amount | None = Field(default=None, gt=0, le=10_000)
    precision: Precision = "auto"
    team: Team = Field(default_factory=Team)
    deployment: Deployment = "none"
    smoke: bool = True
    # Tokens the run trains on (all epochs); sets the scheduler's step count and time to train.
    dataset_tokens: Amount | None = Field(default=None, gt=0, le=1e16)
    # The peak learning rate the request names ("lr 1e-5"); None: the plan's rule for the task
    # and size (tools/planning/lr_schedule.py), said in the notes either way.
    learning_rate: Amount | None = Field(default=None, gt=0, le=1.0)
    # Optimizer steps the run takes ("for 5000 steps"); the tokens are then steps x global
    # batch x seq_len (tools/planning/batch.py resolve_steps). Give this or dataset_tokens.
    train_steps: Count | None = Field(default=None, ge=1, le=1_000_000_000)
    # Checkpoints: every how many steps ("save every 200 steps") and how many newest kept
    # ("keep the last 3"); None: the launch's own (a tenth of the run, at most 500 steps).
    save_every: Count | None = Field(default=None, ge=1, le=1_000_000_000)
    keep_checkpoints: Count | None = Field(default=None, ge=1, le=10_000)
    # Its warm-up steps ("warmup of 500 steps"); None: 3% of the run (lr_schedule.py).
    warmup_steps: Count | None = Field(default=None, ge=1, le=10_000_000)
    # The optimizer and schedule the request names (tools/intake/optim_text.py); None: the
    # task's recipe (AdamW betas and weight decay by task, eps 1e-8, clipping at 1.0, cosine
    # decay to the task's floor; tools/planning/optimizer_recipe.py). Every launch carries
    # them or says in one line why it cannot. ``max_grad_norm`` 0: no clipping;
    # ``warmup_ratio``: the warm-up as a share of the run (give it or warmup_steps).
    weight_decay: Amount | None = Field(default=None, ge=0, le=10)
    max_grad_norm: Amount | None = Field(default=None, ge=0, le=10_000)
    adam_beta1: Amount | None = Field(default=None, ge=0, lt=1)
    adam_beta2: Amount | None = Field(default=None, ge=0, lt=1)
    adam_eps: Amount | None = Field(default=None, gt=0, lt=1)
    lr_schedule: Literal["cosine", "linear", "constant"] | None = None
    min_lr: Amount | None = Field(default=None, ge=0, le=1.0)
    warmup_ratio: Amount | None = Field(default=None, gt=0, lt=1)
    # Evaluation: every how many steps, on what share of the data held out (0.01: 1%).
    eval_every: Count | None = Field(default=None, ge=1, le=1_000_000_000)
    eval_holdout: Amount | None = Field(default=None, gt=0, lt=1)
    # The run's seed ("seed 42"), the Weights & Biases project it logs to ("log to wandb project
    # X") and its data ("dataset at /data/train.jsonl"): passed to the launch where it takes them
    # (tools/intake/run_text.py reads them; the launch says where it does not).
    seed: Count | None = Field(default=None, ge=0, le=2**32 - 1)
    # A LoRA job's alpha ("alpha 32", "lora_alpha=16"): train.py's --lora-alpha (else 2 x rank).
    lora_alpha: Amount | None = Field(default=None, gt=0, le=100_000)
    wandb_project: str | None = Field(
        default=None, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
    )
    data_path: str | None = Field(default=None, max_length=1024, pattern=r"^[\w./~+@:=-]+$")
    # What one GPU-hour costs (any currency); with a time to train, the report states the cost.
    price_per_gpu_hour: Amount | None = Field(default=None, gt=0, le=100_000)
    # The framework the request asks for, and the ones it refuses (tools/intake/wishes.py).
    framework: FrameworkId | None = None
    avoid_frameworks: list[FrameworkId] = Field(default_factory=list, max_length=20)
    pins: Pins = Field(default_factory=Pins)
    # The training recipe memory is priced for (None: DeepSpeed with ``precision``).
    recipe: MemoryRecipe | None = None
    # What the run optimises when the request names it (tools/intake/wishes.py reads it from text):
    # "rl" (PPO/GRPO/RLHF with rollouts) is not planned; "continued-pretraining" loads weights.
    objective: Literal["sft", "dpo", "rl", "distill", "continued-pretraining"] | None = None

    @property
    def batch(self) -> int:
        """The global batch once planned (the planner fills ``global_batch_size`` when unset)."""
        if self.global_batch_size is None:
            raise ValueError("global_batch_size is not planned yet (tools/planning/batch.py)")
        return self.global_batch_size

    @property
    def loads_weights(self) -> bool:
        """Whether the job starts from pretrained weights (all but pretraining from scratch)."""
        return self.task != "pretrain" or self.objective == "continued-pretraining"

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name a catalog model, a config.json path or give params")
        return value

    @model_validator(mode="after")
    def _model_needed_for_training(self) -> TrainingBrief:
        if self.model is None and self.task != "agent-app":
            raise ValueError("model is required (only an agent-app brief may omit it)")
        if self.framework is not None and self.framework in self.avoid_frameworks:
            raise ValueError(f"framework {self.framework} is also in avoid_frameworks")
        recipe_framework = self.recipe.framework if self.recipe is not None else None
        if why := recipe_contradiction(
            self.framework, recipe_framework, list(self.avoid_frameworks)
        ):
            raise ValueError(why)
        if self.train_steps is not None and self.dataset_tokens is not None:
            raise ValueError(
                "train_steps and dataset_tokens both set the run's length: give one (the tokens "
                "are train_steps x global_batch_size x seq_len)"
            )
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(
                "warmup_steps and warmup_ratio both set the warm-up: give one (the ratio is "
                "the share of the run's steps)"
            )
        if None not in (self.min_lr, self.learning_rate) and self.min_lr >= self.learning_rate:  # type: ignore[operator]
            raise ValueError(
                f"min_lr {self.min_lr:g} is not below learning_rate {self.learning_rate:g}: the "
                "decay ends at min_lr, below the peak"
            )
        recipe_precision = self.recipe.precision if self.recipe is not None else None
        if why := precision_contradiction(self.precision, recipe_precision):
            raise ValueError(why)
        if self.objective == "continued-pretraining" and self.task == "finetune":
            # Continued pretraining is pretraining (its batch and optimizer recipe) from the
            # weights; the plan's headline says so (tools/artifacts/text.py objective_note).
            self.task = "pretrain"
        return self
