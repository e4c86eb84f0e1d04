"""Expert- and context-parallel degrees in a request's words are pins, quoted with their words.

"expert parallelism 8" used to leave "parallelism 8" not understood and the search free to pick
any expert-parallel degree; now it is ``pins.expert_parallel`` with its quote, like "TP 4".
"""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import brief_from_dict, parse_request
from tools.intake.wishes import named_wishes, pin_fields, pin_reads
from tools.intake.words import TEAM
from tools.research.model_catalog import list_models


@pytest.mark.parametrize(
    ("text", "field", "value", "quote"),
    [
        ("train mixtral-8x7b on 32 H100 with expert parallelism 8", "expert_parallel", 8, "expert parallelism 8"),
        ("mixtral on 16 H100, expert parallel size 8", "expert_parallel", 8, "expert parallel size 8"),
        ("mixtral on 16 H100, expert-parallel size of 4", "expert_parallel", 4, "expert-parallel size of 4"),
        ("mixtral on 16 H100, EP=8", "expert_parallel", 8, "EP=8"),
        ("mixtral on 16 H100 with EP 8", "expert_parallel", 8, "EP 8"),
        ("mixtral on 16 H100, ep8", "expert_parallel", 8, "ep8"),
        ("mixtral on 16 H100 with 4-way expert parallelism", "expert_parallel", 4, "4-way expert parallelism"),
        ("在 16 张 H100 上训练 mixtral，专家并行 8", "expert_parallel", 8, "专家并行 8"),
        ("llama-3.1-8b at 128k with context parallelism 4", "context_parallel", 4, "context parallelism 4"),
        ("llama-3.1-8b at 128k, CP=2", "context_parallel", 2, "CP=2"),
        ("llama-3.1-8b at 128k with cp 4", "context_parallel", 4, "cp 4"),
        ("llama-3.1-8b at 128k, context-parallel degree 2", "context_parallel", 2, "context-parallel degree 2"),
        ("llama-3.1-8b at 128k, 上下文并行度 4", "context_parallel", 4, "上下文并行度 4"),
        # The abbreviation after "N-way" (was not understood: the search picked its own degree).
        ("llama-3-8b on 8 A100 with 2-way TP", "tensor_parallel", 2, "2-way TP"),
        ("llama-3-70b on 16 A100 with 4-way PP", "pipeline_parallel", 4, "4-way PP"),
        # "pipeline 4" after "tensor parallel 8": the degree was dropped, the search picked PP 2.
        ("llama-3-70b on 32 H100 with tensor parallel 8 pipeline 4", "pipeline_parallel", 4, "pipeline 4"),
        ("llama-3-70b on 32 H100, pipeline stages=8", "pipeline_parallel", 8, "pipeline stages=8"),
        # The stages counted before the word (was "with 4 pipeline" not understood, PP 1 planned).
        ("llama-3-70b on 16 H100 with 4 pipeline stages and TP 4", "pipeline_parallel", 4, "4 pipeline stages"),
        ("llama-3-70b on 16 H100, a pipeline of 4 stages", "pipeline_parallel", 4, "pipeline of 4 stages"),
        # A refusal pins degree 1, quoted from the refusing word.
        ("mixtral on 16 H100 with no expert parallelism", "expert_parallel", 1, "no expert parallelism"),
        ("mixtral on 16 H100, do not use EP", "expert_parallel", 1, "not use EP"),
        ("llama-3.1-8b at 64k without context parallelism", "context_parallel", 1, "without context parallelism"),
    ],
)  # fmt: skip
def test_a_split_degree_is_a_pin_with_its_words(
    text: str, field: str, value: int, quote: str
) -> None:
    reads = [r for r in pin_reads(text) if r.field == f"pins.{field}"]
    assert [(r.value, r.quote) for r in reads] == [(value, quote)]
    (read,) = reads
    assert text[read.start : read.end] == quote  # the span the not-understood check uses
    assert pin_fields(text)[field] == value


@pytest.mark.parametrize(
    "text",
    [
        "pretrain qwen3-235b-a22b on 8 nodes of 8 H100 with expert parallelism",  # no degree
        "with expert parallelism on 8 nodes",
        "fine-tune llama-3-8b for 8 steps on 8 H100",  # 'ep' inside a word
        "fine-tune llama-3-8b on 8 H100 with cpu offload 2 times",
        "continued pretraining (CPT) of mistral-7b on 16 H100",
        "fine-tune llama-3-8b on 2 EPYC 9654 nodes",
    ],
)
def test_words_without_a_degree_pin_nothing(text: str) -> None:
    fields = pin_fields(text)
    assert "expert_parallel" not in fields and "context_parallel" not in fields, fields


def test_an_input_pipeline_of_workers_is_no_pipeline_degree() -> None:
    assert "pipeline_parallel" not in pin_fields("llama-3-8b on 8 H100, data pipeline 4 workers")


def test_a_split_pin_before_the_sequence_leaves_the_sequence_whole() -> None:
    # "context parallel 2 seq 32768" was read as 2-token sequences and a 2M-sequence batch.
    text = "pretrain llama-3-70b on 16 H100 with megatron context parallel 2 seq 32768"
    brief = parse_request(text, list_models())
    assert brief.seq_len == 32768 and brief.pins.context_parallel == 2


def test_the_degrees_and_tensor_parallel_read_side_by_side() -> None:
    text = "train mixtral-8x7b on 16 H100, EP=8, CP=2, TP 2"
    assert pin_fields(text) == {"tensor_parallel": 2, "expert_parallel": 8, "context_parallel": 2}
    wishes = {r.field for r in named_wishes(text)}
    assert wishes == {"technique:expert-parallelism", "technique:context-parallelism"}


def test_a_refused_split_is_the_avoid_wish_too() -> None:
    wishes = {r.field for r in named_wishes("mixtral on 16 H100 with no expert parallelism")}
    assert wishes == {"avoid:expert-parallelism"}


def test_the_brief_bounds_the_degrees_and_says_them() -> None:
    brief = brief_from_dict(
        {"model": "mixtral-8x7b", "pins": {"expert_parallel": 8, "context_parallel": 2}}
    )
    assert brief.pins.stated() == ["expert parallel 8", "context parallel 2"]
    for bad in ({"expert_parallel": 0}, {"expert_parallel": 2048}, {"context_parallel": 0}):
        with pytest.raises(InputError) as err:
            brief_from_dict({"model": "mixtral-8x7b", "pins": bad})
        assert str(err.value).startswith(f"brief.pins.{next(iter(bad))}:"), err.value


@pytest.mark.parametrize(
    ("text", "expert"),
    [
        ("train mixtral-8x7b with expert parallelism 8", False),
        ("a mixture of experts on 8 H100", False),
        ("mixtral has 8 experts", False),
        ("we are experts; fine-tune llama-3-8b", True),
        ("an expert team fine-tunes llama-3-8b", True),
    ],
)
def test_expert_parallelism_is_not_the_teams_experience(text: str, expert: bool) -> None:
    import re

    pattern = next(p for key, value, p in TEAM if (key, value) == ("experience", "expert"))
    assert bool(re.search(pattern, text, re.I)) is expert
