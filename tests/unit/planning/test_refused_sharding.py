"""A request that refuses every framework that shards gets a plan without sharding, said so.

"fine-tune llama-3-8b on 8 H100 but don't use FSDP or DeepSpeed" read as: avoid FSDP, and
*use DeepSpeed* (the refusal covered its first name only); once both were refused, the search
still chose ZeRO-2 (a data-parallel strategy needs no split framework) and the plan ran it on
plain PyTorch, which the reviewer rejected as a framework that cannot run it.
"""

from __future__ import annotations

import pytest

from tools.intake.brief import parse_request
from tools.intake.wishes import framework_reads
from tools.planning import search_strategy
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import list_models, lookup_model

BOTH = "fine-tune llama-3-8b on 8 H100 but don't use FSDP or DeepSpeed"


@pytest.mark.parametrize(
    ("text", "framework", "avoided"),
    [
        (BOTH, None, ["pytorch_fsdp", "deepspeed"]),
        ("no fsdp/deepspeed please", None, ["pytorch_fsdp", "deepspeed"]),
        ("without FSDP, DeepSpeed or Megatron", None, ["pytorch_fsdp", "deepspeed", "megatron"]),
        # a comma ends a refusal unless the list goes on with "or": deepspeed is allowed here
        ("no FSDP, deepspeed is fine", "deepspeed", ["pytorch_fsdp"]),
        ("use DeepSpeed, not FSDP", "deepspeed", ["pytorch_fsdp"]),
        ("FSDP or DeepSpeed", "pytorch_fsdp", []),
    ],
)
def test_a_refusal_covers_every_name_it_lists(
    text: str, framework: str | None, avoided: list[str]
) -> None:
    named, refused = framework_reads(text)
    assert (named.value if named else None) == framework
    assert [r.value for r in refused] == avoided
    for r in refused:  # each quoted from the refusal's first word, as the text has it
        assert text[r.start : r.end] == r.quote and r.quote.split()[0] in (
            "don't",
            "no",
            "without",
            "not",
        )


def test_refusing_both_sharding_frameworks_plans_replicas_and_says_what_was_kept_out() -> None:
    brief = parse_request(BOTH, list_models())
    assert brief.framework is None and brief.avoid_frameworks == ["pytorch_fsdp", "deepspeed"]
    model, hardware = lookup_model(brief.model, brief.seq_len), parse_hardware(brief.hardware)
    plan = search_strategy(model, hardware, brief)
    assert plan.chosen == "ddp"
    assert {row.name for row in plan.strategies} == {"ddp"}, "a sharded row was searched"
    kept_out = next(a for a in plan.assumptions if a.startswith("not searched:"))
    assert "ZeRO and FSDP sharding" in kept_out and "None" not in kept_out
    # More GPUs of this type never fit replicas of an 8B model's states: no cluster suggested.
    assert not plan.chosen_row.fits
    assert any("more GPUs of this type do not help" in a for a in plan.assumptions)
    # and where it fits once the refusal is lifted: here, on this very hardware
    assert (
        "without the refusal of pytorch_fsdp, deepspeed, it fits on this hardware"
        " (with ZeRO or FSDP sharding, or a split)"
    ) in plan.assumptions


def test_a_replicating_wish_nothing_fits_says_where_sharding_would() -> None:
    # Before: "the same GPU would fit at 4x8xA100-40GB" for a DDP plan that never fits there.
    brief = parse_request("fine-tune llama-3-70b on 8 A100 40GB with pytorch ddp", list_models())
    model, hardware = lookup_model(brief.model, brief.seq_len), parse_hardware(brief.hardware)
    plan = search_strategy(model, hardware, brief)
    assert plan.chosen == "ddp" and not plan.chosen_row.fits
    assert not any("the same GPU would fit at" in a for a in plan.assumptions)
    assert any(
        a.startswith("without the wish for pytorch_ddp, the same GPU would fit it at 4x8xA100-40GB")
        for a in plan.assumptions
    ), plan.assumptions
