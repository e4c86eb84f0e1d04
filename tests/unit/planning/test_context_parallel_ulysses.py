"""Context parallelism for models torchtitan does not build: DeepSpeed-Ulysses on Megatron.

Qwen2.5-32B at 32k tokens was never offered context parallelism (only torchtitan's Llama
flavors were, with ring attention). Megatron-DeepSpeed runs it as DeepSpeed-Ulysses
(``--ds-sequence-parallel-size``): all-to-alls of the attention heads, on the critical path.
"""

from __future__ import annotations

import re

from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions
from tools.planning.layouts import build_space
from tools.planning.speed import estimate_speed
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _space(model: str, seq: int):
    hw = parse_hardware("2x8xH100-80GB")
    brief = brief_from_dict(
        {"model": model, "hardware": "2x8xH100-80GB", "seq_len": seq,
         "global_batch_size": 16, "task": "pretrain"}
    )  # fmt: skip
    return build_space(lookup_model(model, seq), hw, brief, SearchOptions())


def test_a_32k_qwen_is_offered_ulysses_beside_data_parallelism_only() -> None:
    cps = {(lay.tp, lay.pp, lay.cp) for lay in _space("qwen2.5-32b", 32768).layouts}
    # c divides the 40 query and 8 key-value heads: 2, 4 and 8.
    assert {c for _, _, c in cps} == {1, 2, 4, 8}
    assert all(tp * pp == 1 for tp, pp, c in cps if c > 1)
    # Below 16k tokens none; a torchtitan Llama keeps ring attention with tensor parallelism.
    assert {lay.cp for lay in _space("qwen2.5-32b", 8192).layouts} == {1}
    assert any(lay.cp > 1 and lay.tp > 1 for lay in _space("llama-3.1-8b", 32768).layouts)


def _speed(model: str, cp: int):
    return estimate_speed(
        lookup_model(model, 32768), parse_hardware("2x8xH100-80GB"), "zero3",
        micro_batch_size=1, gradient_accumulation_steps=4, precision="bf16", seq_len=32768,
        recompute="full", context_parallel=cp,
    )  # fmt: skip


def test_ulysses_all_to_alls_are_priced_and_not_hidden() -> None:
    ulysses = _speed("qwen2.5-32b", 4)
    note = next(a for a in ulysses.assumptions if "DeepSpeed-Ulysses" in a)
    found = re.search(r"\(([\d.]+) s\), not overlapped", note)
    assert found is not None, note
    cp_s = float(found.group(1))
    # The all-to-alls are all exposed: what the step adds over compute includes them whole.
    assert cp_s > 0 and ulysses.exposed_comm_time_s >= cp_s - 1e-3
    ring = _speed("llama-3.1-8b", 4)
    assert not any("Ulysses" in a for a in ring.assumptions)
    assert any("ring attention" in a for a in ring.assumptions)
