"""The request's wishes that the finished plan decides: its deadline, budget and named techniques.

A request on given hardware may add a deadline ("within 2 weeks"), a budget ("$200k") or name
techniques (activation checkpointing, 8-bit Adam, torch.compile, expert or context
parallelism). Intake reads them as wishes; before, a plan left them "not checked" even when its
own numbers decided them (a 9.1-day plan for a 2-week deadline). The reporter marks each from
the plan made: the deadline and budget against the plan's own size in the scaling table (time
to train ``dataset_tokens`` and its cost), the techniques against the chosen setup and the
launch that runs it. A sizing question marks its deadline and budget itself
(agents/sizing.py); a wish this module cannot decide stays as intake left it.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.request_account import RequestAccount, mark_wish
from tools.core.schemas import GPUSpec, MemoryPlan, ScalingPlan, TrainingBrief
from tools.core.strategies import fsdp_sharding
from tools.intake.recipe_fields import COMPILE_WHY, STEPS_ADAMW
from tools.intake.sizing_text import budget_dollars, deadline_seconds
from tools.planning.attention_kernels import FLASH2_FLAG, flash2_runs, launch_attention
from tools.planning.pins import dense_expert_line
from tools.planning.sizing_pick import DAY_S

_NO_TOKENS = "not checked: the request gives no token count ('on 1T tokens'), so no {} to check"


def _chosen_row(scaling: ScalingPlan | None) -> Any:
    return next((r for r in scaling.rows if r.chosen), None) if scaling else None


def _deadline(quote: str, scaling: ScalingPlan | None) -> tuple[bool, str] | None:
    limit = deadline_seconds(quote)
    if limit is None:  # "by Friday": a day, not a duration
        return False, (
            f"not checked: {quote!r} names a day, not a duration, and a plan does not know "
            "today's date; say 'within 3 days' to have it checked"
        )
    row = _chosen_row(scaling)
    if row is None or row.hours is None:
        return None if row is None else (False, _NO_TOKENS.format("time"))
    seconds = row.hours * 3600
    days = seconds / DAY_S
    if seconds <= limit:
        return True, f"deadline met: the plan trains the tokens in {days:.1f} days"
    return False, (
        f"deadline not met: the plan takes {days:.1f} days on {row.gpus} GPUs, over {quote!r}; "
        "the scaling table shows the sizes that are faster"
    )


def _budget(quote: str, scaling: ScalingPlan | None) -> tuple[bool, str] | None:
    words = quote[quote.find("$") :] if "$" in quote else quote
    dollars = budget_dollars(words)
    row = _chosen_row(scaling)
    if dollars is None or row is None:
        return None
    if row.cost is None and row.hours is not None:  # the time is known: the price is not
        return False, (
            "not checked: the plan's GPU has no cited price (knowledge/gpu_prices.yaml); give "
            "yours as '$X/GPU-hour' to have the budget checked"
        )
    if row.cost is None:
        return False, _NO_TOKENS.format("cost")
    currency = scaling.currency if scaling and scaling.currency else "USD"
    if currency != "USD":
        return None
    if row.cost <= dollars:
        return True, f"budget met: the plan costs {row.cost:,.0f} USD at the price it names"
    return False, (
        f"budget not met: the plan costs {row.cost:,.0f} USD on {row.gpus} GPUs, over {quote!r}; "
        "the scaling table shows each size's cost"
    )


def _asked(quote: str) -> int | None:
    """The count in a wish's words ("micro batch 4" -> 4)."""
    m = re.search(r"\d+", quote)
    return int(m.group(0)) if m else None


def _batching(wish: str, quote: str, memory: MemoryPlan) -> tuple[bool, str] | None:
    """A micro-batch or gradient accumulation the request names, against the chosen setup."""
    asked = _asked(quote)
    if asked is None:
        return None
    if wish == "micro-batch":
        ran, name = memory.micro_batch_size, "micro-batch"
    else:
        ran, name = memory.gradient_accumulation_steps, "gradient accumulation"
    if ran == asked:
        return True, f"planned: {name} {ran}"
    return False, (
        f"{name} {asked} not planned: the chosen setup runs {name} {ran} "
        f"({memory.chosen_label}) for the plan's global batch"
    )


def _hybrid_sharding(memory: MemoryPlan, primary: str | None, nodes: int) -> tuple[bool, str]:
    """FSDP's HYBRID_SHARD (shard within a node, replicate across nodes) against the plan.

    On one node it is FULL_SHARD, which a ZeRO-3 row on FSDP runs; across nodes the memory
    model prices sharding over every GPU only, so the plan says what it runs instead.
    """
    sharding, _offload = fsdp_sharding(memory.chosen, nodes)
    if primary == "pytorch_fsdp" and sharding == "FULL_SHARD" and nodes == 1:
        return True, "planned: FULL_SHARD on one node, the layout hybrid sharding has there"
    runs = (
        f"FSDP {sharding} across every GPU ({memory.chosen_label})"
        if primary == "pytorch_fsdp"
        else f"{memory.chosen_label} on {primary}"
    )
    return False, (
        f"hybrid sharding not planned: the plan runs {runs}; the memory and speed models price "
        "sharding over every data-parallel rank, not within a node (an FSDP launch runs it with "
        "train.py's --fsdp-sharding hybrid, whose memory, ZeRO-3 over one node's GPUs, this "
        "plan did not check)"
    )


# Who packs the documents into full sequences, per launch (a TensorFlow job is its own script).
_PACKS = {
    "megatron": "Megatron-DeepSpeed's GPT dataset concatenates documents into seq_len samples",
    "torchtitan": "torchtitan's dataset packs the tokenized documents into seq_len samples",
}
_TRAIN_PY_PACKS = (
    "train.py joins the documents with the EOS token and packs them into seq_len blocks"
)


def _packing_and_nvme(memory: MemoryPlan, primary: str | None) -> dict[str, tuple[bool, str]]:
    """Packing (every launch here packs; it cannot be turned off) and NVMe offload (never planned)."""
    if primary in ("tensorflow", "horovod"):
        return {}
    packs = _PACKS.get(primary or "", _TRAIN_PY_PACKS)
    offload = "offload" in memory.chosen
    return {
        "technique:packing": (True, f"planned: {packs}"),
        "avoid:packing": (False, f"packing not turned off: {packs}, with no option to pad instead"),
        "technique:nvme-offload": (
            False,
            "NVMe offload not planned: "
            + (
                f"the plan offloads to CPU RAM ({memory.chosen_label}); the memory model prices "
                "host RAM, not NVMe"
                if offload
                else f"the chosen setup ({memory.chosen_label}) offloads nothing"
            ),
        ),
    }


def _flash_attention(
    primary: str | None, gpu: GPUSpec | None, brief: TrainingBrief
) -> tuple[bool, str] | None:
    """FlashAttention against the kernel the launch runs (tools/planning/attention_kernels.py)."""
    if gpu is None or primary in ("tensorflow", "horovod"):
        return None  # this machine's CPU, or a Keras job: no CUDA attention kernel to name
    fp8 = brief.recipe is not None and brief.recipe.precision == "fp8"
    ran = launch_attention(primary, gpu, fp8=fp8)
    if brief.precision == "fp32":
        return False, "FlashAttention not planned: it runs in 16-bit, and the plan trains fp32"
    if ran.kernel == "sdpa" and flash2_runs(gpu):
        how = (
            f"Megatron-DeepSpeed's {FLASH2_FLAG}"
            if primary == "megatron"
            else "PyTorch's scaled_dot_product_attention, which runs its FlashAttention-2 kernel"
        )
        return True, f"planned: FlashAttention-2 on {gpu.name} ({how})"
    if ran.kernel == "cudnn":
        return False, f"FlashAttention not planned: {ran.note}"
    return False, (
        f"FlashAttention not planned: FlashAttention-2 needs an Ampere or newer GPU and {gpu.name} "
        "is not; attention runs "
        + ("unfused" if ran.kernel == "eager" else "PyTorch's memory-efficient kernel")
    )


def _tp_across_nodes(memory: MemoryPlan, nodes: int) -> tuple[bool, str]:
    """Whether the chosen tensor-parallel group spans nodes, as "TP across nodes" asks."""
    s = memory.chosen_setup
    per_node = max(1, s.tp * s.pp * s.cp * s.dp // max(1, nodes))
    if nodes > 1 and s.tp > per_node:
        return True, f"planned: tensor parallel {s.tp} spans {s.tp // per_node} nodes"
    where = "one node" if nodes == 1 else f"each node's {per_node} GPUs"
    return False, (
        f"tensor parallelism not across nodes: the chosen setup's tensor parallel {s.tp} stays "
        f"within {where}, so its per-layer all-reduces stay on the node's own GPU links; "
        "across nodes they would run over the network between nodes"
    )


def _techniques(
    memory: MemoryPlan, primary: str | None, brief: TrainingBrief, experts: bool, nodes: int
) -> dict[str, tuple[bool, str]]:
    setup = memory.chosen_setup
    marks: dict[str, tuple[bool, str]] = {
        "technique:tp-across-nodes": _tp_across_nodes(memory, nodes)
    }
    if memory.activation_checkpointing:
        marks["technique:activation-checkpointing"] = (
            True,
            f"planned: activation checkpointing, recompute {setup.recompute} in the chosen setup",
        )
        marks["avoid:activation-checkpointing"] = (
            False,
            f"activation checkpointing planned all the same: recompute {setup.recompute} in the "
            "chosen setup (the memory plan's notes say why)",
        )
    else:
        marks["technique:activation-checkpointing"] = (
            False,
            "activation checkpointing not planned: the chosen setup recomputes nothing",
        )
        marks["avoid:activation-checkpointing"] = (
            True,
            "not used: the chosen setup recomputes nothing",
        )
    marks["technique:8bit-optimizer"] = (
        False,
        f"8-bit Adam not planned: {STEPS_ADAMW} (none wires bitsandbytes' 8-bit Adam), so memory "
        "is priced for AdamW",
    )
    compiled = primary == "torchtitan" and brief.recipe is not None and brief.recipe.compile
    marks["technique:torch.compile"] = (
        (True, "planned: torch.compile through torchtitan's [compile] enable")
        if compiled
        else (
            False,
            f"torch.compile not planned: {COMPILE_WHY}; the {primary} launch runs eager",
        )
    )
    marks["technique:context-extension"] = (
        False,
        f"context extension partly planned: the plan trains sequences of {brief.seq_len} tokens "
        "on the model's own RoPE (its config's rope_theta and rope_scaling, unchanged); a larger "
        "RoPE base or position interpolation (YaRN), which extending a context usually needs, "
        "is not set by the launch files",
    )
    marks["technique:hybrid-sharding"] = _hybrid_sharding(memory, primary, nodes)
    marks |= _packing_and_nvme(memory, primary)
    marks["checkpoint:resume"] = (
        False,
        "resuming another run's checkpoint not planned: the launch resumes only from the "
        "checkpoints its own job writes"
        + (
            "; to start from that checkpoint's weights, point MODEL_PATH at a Hugging Face "
            "folder of them"
            if brief.loads_weights and primary not in ("megatron", "torchtitan")
            else ""
        ),
    )
    pinned = brief.pins.expert_parallel or 1
    if setup.ep > 1:
        marks["technique:expert-parallelism"] = (True, f"planned: expert parallel {setup.ep}")
    elif not experts and pinned > 1:
        # The search's own line for the dropped pin: one line under "not as asked", not two.
        marks["technique:expert-parallelism"] = (False, dense_expert_line(pinned))
    else:
        marks["technique:expert-parallelism"] = (
            False,
            "expert parallelism not planned: the chosen setup keeps every expert on each rank "
            "it shards"
            if experts
            else "expert parallelism not planned: the model has no experts to split",
        )
    marks["technique:context-parallelism"] = (
        (True, f"planned: context parallel {setup.cp}")
        if setup.cp > 1
        else (
            False,
            "context parallelism not planned: the chosen setup fits and runs fastest with whole "
            "sequences",
        )
    )
    return marks


def mark_plan_wishes(
    account: dict[str, Any] | None,
    *,
    memory: MemoryPlan | None,
    scaling: ScalingPlan | None,
    primary: str | None,
    brief: TrainingBrief,
    experts: bool,
    nodes: int = 1,
    gpu: GPUSpec | None = None,
) -> dict[str, Any] | None:
    """The account with the wishes this plan decides marked (undecided ones only).

    ``experts``: the model is a mixture of experts (an expert split is possible at all);
    ``gpu``: the plan's GPU (None: this machine's CPU), for the attention kernel.
    """
    if account is None or memory is None or memory.chosen_row is None:
        return account
    acc = RequestAccount.model_validate(account)
    marks = _techniques(memory, primary, brief, experts, nodes)
    if (flash := _flash_attention(primary, gpu, brief)) is not None:
        marks["technique:flash-attention"] = flash
    for wish in acc.undecided():
        if wish.wish == "deadline":
            mark = _deadline(wish.quote, scaling)
        elif wish.wish == "money-budget":
            mark = _budget(wish.quote, scaling)
        elif wish.wish in ("micro-batch", "grad-accum"):
            mark = _batching(wish.wish, wish.quote, memory)
        else:
            mark = marks.get(wish.wish)
        if mark is not None:
            account = mark_wish(account, wish.wish, *mark) or account
    return account
