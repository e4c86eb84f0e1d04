"""Which framework runs a setup's tensor/pipeline/context split, and which setups a request allows.

The search (tools/planning/search.py) asks ``runs_setup`` before it prices a setup, so a plan
never needs a framework the request refuses (``avoid_frameworks``), nor, when the request names
one (``framework``), one it did not name; the framework choice (tools/research/framework.py
``follow_setup``) asks ``setup_framework`` which framework the chosen split runs on.
"""

from __future__ import annotations

from collections.abc import Iterable

from tools.core.schemas import FrameworkId, MemoryPlan, ModelSpec, TrainingBrief
from tools.core.setup import Setup
from tools.core.strategies import ZERO_STAGE
from tools.research.megatron_arch import megatron_excluded
from tools.research.titan_flavors import torchtitan_flavor
from tools.research.titan_wish import titan_runs

# Frameworks that replicate every model state on every GPU: they run DDP and nothing else.
REPLICATING_FRAMEWORKS = frozenset({"pytorch", "pytorch_ddp", "tensorflow", "horovod"})
# The training frameworks every request's framework choice scores (tools/research/framework.py);
# torchtitan joins them when the request asks for it (tools/research/titan_wish.py).
TRAINING_FRAMEWORKS: tuple[FrameworkId, ...] = (
    "pytorch",
    "pytorch_ddp",
    "pytorch_fsdp",
    "deepspeed",
    "horovod",
    "tensorflow",
    "megatron",
)
STACKS: dict[str, list[FrameworkId]] = {
    "pytorch": ["pytorch"],
    "pytorch_ddp": ["pytorch", "pytorch_ddp"],
    "pytorch_fsdp": ["pytorch", "pytorch_fsdp"],
    "deepspeed": ["pytorch", "deepspeed"],
    "horovod": ["pytorch", "horovod"],
    "tensorflow": ["tensorflow"],
    "megatron": ["pytorch", "megatron", "deepspeed"],
    "torchtitan": ["pytorch", "torchtitan"],
    "langgraph": ["langgraph", "langchain"],
    "crewai": ["crewai"],
    "autogen": ["autogen"],
}
# Why a LoRA job does not run on Megatron, whatever the request names (framework.py).
MEGATRON_LORA = (
    "Megatron-DeepSpeed's launch here (pretrain_gpt.py) trains every weight, not LoRA adapters "
    "(those train with the Hugging Face job, train.py with peft)"
)
# Why a model that is no decoder-only language model does not run on Megatron (framework.py).
MEGATRON_NOT_GPT = (
    "Megatron-DeepSpeed's launch here (pretrain_gpt.py) builds a GPT, and {name} is no "
    "decoder-only language model: it would train a GPT of {name}'s shape on text"
)

# DeepSpeed AutoTP training (the ``tensor_parallel.autotp_size`` config, DeepSpeed >= 0.16.4)
# runs with ZeRO stages 0, 1 and 2 (DeepSpeed's AutoTP training tutorial,
# deepspeed.ai/tutorials/autotp-training: "ZeRO stage 3 is not supported"), on Hugging Face
# models (it shards their nn.Linear layers; deepspeed/module_inject/auto_tp.py).
AUTOTP_MAX_ZERO_STAGE = 2

# Why a LoRA job searches no split (``runs_setup``; tools/planning/layouts.py says it). Checked
# with DeepSpeed 0.19.8 and peft 0.21.2 on 2 CPU gloo ranks, a 2-layer Llama, autotp_size 2:
# AutoTP shards a PEFT-wrapped model wrongly. With the model's Hugging Face tp_plan (Llama has
# one) AutoTP._replace_module (deepspeed/module_inject/auto_tp.py, the partition_config branch)
# replaces every module with a 2-D ``weight``; peft's lora.Linear has one (the base layer's,
# through BaseTunerLayer.weight), so each adapted projection becomes a plain LinearLayer and
# lora_A/lora_B are gone: ZeRO 1/2 stop in deepspeed.initialize (KeyError in
# stage_1_and_2._create_param_mapping: the optimizer's adapters are no longer in the model),
# ZeRO 0 at the first backward (nothing left requires grad). Without a tp_plan AutoTP splits
# lora_A's rank dimension like a column-parallel layer and leaves lora_B's input whole, and the
# forward fails on the mismatch. DeepSpeed's AutoTP training (PR #6922) has no PEFT handling;
# peft's tensor-parallel LoRA (huggingface/peft#3044, PR #3079) targets transformers' own
# tensor parallelism, where lora_A/lora_B take the base layer's column/row roles.
LORA_AUTOTP_REFUSAL = (
    "DeepSpeed 0.19 AutoTP replaces each PEFT-adapted projection with a plain sharded linear "
    "and drops lora_A/lora_B (deepspeed/module_inject/auto_tp.py AutoTP._replace_module; on 2 "
    "ranks it fails in deepspeed.initialize, or at the first backward under ZeRO 0)"
)
LORA_FULL_WEIGHT_REFUSAL = "the torchtitan and Megatron launches here train every weight"


def lora_split_refusal(frameworks: Iterable[str | None]) -> str:
    """Why a LoRA job searches none of the splits that run only on ``frameworks``."""
    needs = {f for f in frameworks if f is not None}
    parts = [LORA_AUTOTP_REFUSAL] if "deepspeed" in needs else []
    if needs - {"deepspeed"}:
        parts.append(LORA_FULL_WEIGHT_REFUSAL)
    return "LoRA trains PEFT adapters on the Hugging Face trainer: " + "; ".join(parts)


def is_hf_model(model: ModelSpec | None) -> bool:
    """Whether the model comes as a Hugging Face config (what DeepSpeed AutoTP shards)."""
    return model is not None and bool((model.hf_config or {}).get("model_type"))


def autotp_shards(model: ModelSpec | None) -> bool:
    """Whether DeepSpeed AutoTP splits the model's weights: a dense Hugging Face model.

    AutoTP replaces nn.Linear (and embedding) layers only; transformers 5 (the lock's) holds a
    mixture of experts' experts as fused 3-D parameters (``MixtralExperts.gate_up_proj``), which
    AutoTP leaves whole on every tensor-parallel rank: most of the model, unsplit.
    """
    moe = (
        model is not None and model.active_params is not None and model.active_params < model.params
    )
    return is_hf_model(model) and not moe


def megatron_builds(model: ModelSpec | None) -> bool:
    """Whether Megatron's ``pretrain_gpt.py`` builds the model: a decoder-only language model.

    A ViT, a ResNet, BERT or T5 is no GPT: a Megatron launch of its shape would train a GPT
    on text (the ViT-L/16 plan on 8 V100 ran pretrain_gpt.py with ViT-L's widths). A model
    given by size or shape is llama-style, which it builds.
    """
    cfg = (model.hf_config or {}) if model is not None else {}
    archs = cfg.get("architectures") or []
    if cfg.get("is_encoder_decoder") or cfg.get("model_type") == "t5":
        return False
    return not archs or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)


def split_framework(
    model: ModelSpec | None, strategy: str, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1
) -> FrameworkId | None:
    """The framework that implements a t x p x c split with ``strategy`` for this model.

    None for a data-parallel setup (any training framework runs it). Tensor parallelism alone
    on a dense Hugging Face model with ZeRO 0-2: DeepSpeed AutoTP (``autotp_shards``). A pipeline on a Llama model
    one of torchtitan's flavors builds exactly (tools/research/titan_flavors.py): torchtitan. Anything else: Megatron (``pretrain_gpt.py``), which
    builds GPT-style models of any shape from flags.
    """
    if ep > 1:
        # Expert parallelism: DeepSpeed-MoE's all-to-all, which Megatron-DeepSpeed builds
        # (--moe-expert-parallel-size); the Hugging Face MoE loop has none.
        return "megatron"
    if cp > 1:
        # Ring attention over context-parallel ranks on torchtitan for the Llama models it
        # builds; DeepSpeed-Ulysses on Megatron-DeepSpeed (--ds-sequence-parallel-size) else.
        return "torchtitan" if torchtitan_flavor(model) is not None else "megatron"
    if tp * pp == 1:
        return None
    stage = ZERO_STAGE.get(strategy, 3)  # type: ignore[call-overload]
    if (
        pp == 1
        and autotp_shards(model)
        and stage <= AUTOTP_MAX_ZERO_STAGE
        and "offload" not in strategy
    ):
        return "deepspeed"
    if torchtitan_flavor(model) is not None:
        # FSDP2 x tensor x pipeline on the model built exactly (Megatron-DeepSpeed has no
        # Llama 3.1 RoPE scaling: tools/research/megatron_arch.py).
        return "torchtitan"
    return "megatron"


def split_sentence(framework: FrameworkId, model: ModelSpec | None, setup: Setup) -> str:
    """The setup's split and how ``framework`` runs it, for the framework choice's rationale.

    "The setup is expert parallel 8: Megatron-DeepSpeed splits the experts with DeepSpeed-MoE
    (--moe-expert-parallel-size)"; only the degrees above 1 are named.
    """
    megatron = "Megatron builds the tensor- and pipeline-parallel GPT model from flags"
    if setup.ep > 1:
        megatron = (
            "Megatron-DeepSpeed splits the experts with DeepSpeed-MoE (--moe-expert-parallel-size)"
        )
    elif setup.cp > 1:
        megatron = "Megatron-DeepSpeed splits each sequence with DeepSpeed-Ulysses"
    how = {
        "deepspeed": f"DeepSpeed AutoTP (tensor_parallel.autotp_size {setup.tp}) shards the "
        "Hugging Face model's linear layers",
        "torchtitan": f"torchtitan builds {model.name if model else 'the model'} with FSDP2, "
        "tensor, pipeline and context parallelism from a TOML job config",
    }.get(framework, megatron)
    degrees = [(setup.tp, "tensor"), (setup.pp, "pipeline"), (setup.cp, "context")]
    degrees.append((setup.ep, "expert"))
    split = " x ".join(f"{name} parallel {d}" for d, name in degrees if d > 1)
    return f"The setup is {split or 'data parallel'}: {how}"


def setup_framework(model: ModelSpec | None, memory: MemoryPlan | None) -> FrameworkId | None:
    """The framework that implements the memory plan's chosen split (``split_framework``)."""
    if memory is None:
        return None
    return split_framework(
        model,
        memory.chosen,
        memory.tensor_parallel,
        memory.pipeline_parallel,
        memory.context_parallel,
        memory.setup.expert_parallel if memory.setup is not None else 1,
    )


def refused_in(framework: str, avoided: Iterable[str]) -> list[str]:
    """The refused frameworks a plan on ``framework`` would use: itself or its stack.

    Megatron-DeepSpeed carries a DeepSpeed config, so refusing DeepSpeed refuses it too; plain
    PyTorch under every stack counts only when it is the framework itself.
    """
    uses = {framework, *(f for f in STACKS.get(framework, []) if f != "pytorch")}
    return [a for a in avoided if a in uses]


def shards_somewhere(avoided: Iterable[str]) -> bool:
    """Whether a framework the request allows shards model states over data-parallel ranks.

    DeepSpeed's ZeRO (Megatron-DeepSpeed carries it), or FSDP (torchtitan's is FSDP2).
    """
    return not refused_in("deepspeed", avoided) or not refused_in("pytorch_fsdp", avoided)


def runs_setup(
    brief: TrainingBrief,
    model: ModelSpec | None,
    strategy: str,
    tp: int,
    pp: int,
    cp: int,
    ep: int = 1,
    *,
    exact: bool = True,
) -> bool:
    """Whether the request allows the framework this setup needs.

    A data-parallel setup runs on any framework (plain DDP only, on a replicating one the
    request names). A LoRA job runs data parallel only (``lora_split_refusal``): torchtitan's
    and Megatron's launches train every weight, and DeepSpeed AutoTP drops or mis-shards the
    PEFT adapters. A split needs ``split_framework``'s pick: never one the request refuses,
    and, when the request names a framework, that one (Megatron runs every split, torchtitan
    every dense split of the models it builds). With ``exact``, a split only Megatron runs is
    kept off a model Megatron-DeepSpeed cannot build as it is (``megatron_excluded``: it would
    train another model, or its convert step could not load the weights) unless the request
    asks for Megatron; the search lifts it for pinned degrees and when nothing else fits.
    """
    needed = split_framework(model, strategy, tp, pp, cp, ep)
    if brief.task == "lora" and needed is not None:
        # LoRA trains adapters through the Hugging Face trainer (train.py with PEFT); the
        # torchtitan and Megatron launches that run these splits train every weight, and
        # DeepSpeed AutoTP breaks the adapters (lora_split_refusal).
        return False
    if needed is not None and brief.framework == "torchtitan":
        # torchtitan runs every dense split of what it runs; FSDP in its place runs none.
        return ep == 1 and titan_runs(brief, model)
    if needed is None and strategy != "ddp":
        # A sharded data-parallel strategy (ZeRO, FSDP) needs a framework that shards: "don't
        # use FSDP or DeepSpeed" leaves replicas (DDP, Horovod) alone.
        return brief.framework not in REPLICATING_FRAMEWORKS and shards_somewhere(
            brief.avoid_frameworks
        )
    if needed is None:
        return True
    if needed == "megatron" and not megatron_builds(model):
        return False  # pretrain_gpt.py would train a GPT of this shape, not this model
    if needed == "megatron" and exact and brief.framework != "megatron":
        if megatron_excluded(model, brief.loads_weights) is not None:
            return False  # another model, or weights its convert step cannot load
    if refused_in(needed, brief.avoid_frameworks):
        return False
    return brief.framework is None or brief.framework in (needed, "megatron")


def runs_on(
    brief: TrainingBrief, model: ModelSpec | None, strategy: str, tp: int, pp: int, cp: int = 1
) -> FrameworkId | None:
    """The framework a plan for this brief runs a split on (None: data parallel, any).

    A brief that names Megatron keeps it (Megatron runs every split), one that names
    torchtitan too where torchtitan runs the job; otherwise ``split_framework``'s pick, as
    ``follow_setup`` makes the plan's framework.
    """
    needed = split_framework(model, strategy, tp, pp, cp)
    if needed is not None and titan_runs(brief, model):
        return "torchtitan"
    return "megatron" if needed is not None and brief.framework == "megatron" else needed
