"""Words naming the parallel layout as a whole pin it, or are refused in one line.

Before, "data parallelism only, no sharding", "pure data parallel", "no model parallelism",
"using tensor parallelism only" and "with 4-way DP" left no trace: the plan searched every
split and ZeRO stage as if they were unsaid (tools/intake/parallel_words.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields

MODELS = ["llama-3-8b"]


def _plan_inputs(text: str) -> tuple[Any, Any]:
    fields = request_fields(text, MODELS)
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    return brief, account_request(text, fields, brief)


def _pins(text: str) -> dict[str, Any]:
    brief, _ = _plan_inputs(text)
    return {k: v for k, v in brief.pins.model_dump().items() if v not in (None, [])}


@pytest.mark.parametrize(
    ("words", "pins"),
    [
        (
            "data parallelism only, no sharding",
            {"zero_stage": 0, "tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1},
        ),
        (
            "pure data parallel",
            {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1},
        ),
        (
            "no model parallelism",
            {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1},
        ),
        (
            "using tensor parallelism only",
            {"zero_stage": 0, "tensor_parallel": 8, "pipeline_parallel": 1, "context_parallel": 1},
        ),
        ("with 4-way DP", {"tensor_parallel": 2, "pipeline_parallel": 1, "context_parallel": 1}),
        ("data parallel 8", {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1}),
        ("DP=4 and PP 2", {"tensor_parallel": 1, "pipeline_parallel": 2, "context_parallel": 1}),
        # A degree named by its split wins over what the layout words imply.
        (
            "pure data parallel with ZeRO-3",
            {"zero_stage": 3, "tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1},
        ),
    ],
)
def test_layout_words_pin_the_split(words: str, pins: dict[str, Any]) -> None:
    assert _pins(f"fine-tune llama-3-8b on 8 H100, {words}") == pins


def test_the_pins_are_read_with_their_words() -> None:
    text = "fine-tune llama-3-8b on 8 H100, data parallelism only, no sharding"
    _, account = _plan_inputs(text)
    (pins,) = [r for r in account.read if r.field == "pins"]
    assert pins.quote == "data parallelism only, no sharding"
    assert not account.not_understood


def test_a_data_parallel_degree_says_which_split_takes_the_rest() -> None:
    _, account = _plan_inputs("fine-tune llama-3-8b on 8 H100 with 4-way DP")
    (assumed,) = [a for a in account.assumed if a.field == "pins"]
    assert assumed.value == "tensor parallel 2" and "4-way DP" in assumed.why
    assert not account.not_understood


@pytest.mark.parametrize(
    ("words", "why"),
    [("data parallel 3", "does not divide the 8 GPUs"), ("4-way DP, TP 4", "run 2 replicas")],
)
def test_an_impossible_data_parallel_degree_is_refused_in_one_line(words: str, why: str) -> None:
    brief, account = _plan_inputs(f"fine-tune llama-3-8b on 8 H100, {words}")
    (wish,) = [w for w in account.wishes if w.wish == "technique:data-parallel-degree"]
    assert wish.honoured is False and why in wish.how
    assert brief.pins.context_parallel is None
    assert not account.not_understood


def test_tensor_only_shares_the_gpus_with_a_pinned_pipeline() -> None:
    brief, _ = _plan_inputs(
        "fine-tune llama-3-8b on 2 nodes of 8 H100, TP only within a node, PP 2"
    )
    assert (brief.pins.tensor_parallel, brief.pins.pipeline_parallel) == (8, 2)


def test_a_spec_without_a_node_count_still_sizes_the_tensor_split() -> None:
    # A brief's hardware may be written "8xH100-80GB" (one node): its own pattern needed the
    # node count, so "tensor parallelism only" pinned no tensor degree for it.
    from tools.intake.parallel_words import parallel_pins

    pins = parallel_pins("tensor parallelism only", "8xH100-80GB", {})
    assert pins.get("tensor_parallel") == 8 and pins.get("pipeline_parallel") == 1
    assert parallel_pins("tensor parallelism only", "2x4xH100-80GB", {})["tensor_parallel"] == 8
