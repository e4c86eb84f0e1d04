"""Expert weights reduce over their expert-data-parallel group, placed as Megatron-Core places it.

Megatron-Core builds expert ranks in the order tp-ep-dp (megatron/core/parallel_state.py,
``RankGenerator(order="tp-cp-ep-dp-pp")``, expert data-parallel groups from
``expert_decoder_rank_generator.get_ranks("dp")``): an expert-parallel group of 8 fills an
8-GPU node, and each GPU's expert shard reduces with the same shard on the other nodes. The
node's NICs then carry every shard, not one node-reduced copy as for replicated weights, so
expert parallelism inside a node saves no network time for the experts' gradients.
"""

from __future__ import annotations

import re

from tools.planning.comm import StepSetup, data_parallel_comm, step_links
from tools.planning.parallel import expert_params, params_per_rank
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model

MODEL = lookup_model("mixtral-8x7b", 4096)


def _dp_comm(hardware: str, ep: int) -> tuple[int, float]:
    hw = parse_hardware(hardware)
    setup = StepSetup(
        model=MODEL, hardware=hw, strategy="zero1", micro=1, accumulation=8,
        checkpointing=False, precision="bf16", seq=4096, tp=1, pp=1, dp=hw.world_size, ep=ep,
    )  # fmt: skip
    return data_parallel_comm(setup, step_links(setup, None), None)


def _network_s(hardware: str, ep: int) -> float:
    """The seconds on the nodes' NICs, as the collective's note states them (2 decimals)."""
    hw = parse_hardware(hardware)
    setup = StepSetup(
        model=MODEL, hardware=hw, strategy="zero1", micro=1, accumulation=8,
        checkpointing=False, precision="bf16", seq=4096, tp=1, pp=1, dp=hw.world_size, ep=ep,
    )  # fmt: skip
    data_parallel_comm(setup, step_links(setup, None), None)
    note = next(n for n in setup.notes if "on the network" in n)
    return float(re.search(r"([\d.]+) s on the network", note)[1])  # type: ignore[index]


def test_each_part_sends_its_ring_share_over_its_own_group() -> None:
    experts = expert_params(MODEL)
    dense = params_per_rank(MODEL) - experts
    comm_bytes, _ = _dp_comm("4x8xH100-80GB", 8)
    # ZeRO-1: 2 units (reduce-scatter + all-gather) of 2-byte values; the dense weights over 32
    # ranks, each GPU's eighth of the experts over its 4 expert-data-parallel peers.
    expected = 2 * 2 * (dense * 31 / 32 + experts // 8 * 3 / 4)
    assert abs(comm_bytes - expected) < 16


def test_expert_parallel_inside_a_node_moves_the_same_expert_bytes_across_nodes() -> None:
    hw = parse_hardware("4x8xH100-80GB")
    setup = StepSetup(
        model=MODEL, hardware=hw, strategy="zero1", micro=1, accumulation=8,
        checkpointing=False, precision="bf16", seq=4096, tp=1, pp=1, dp=32, ep=8,
    )  # fmt: skip
    inter_gbs = step_links(setup, None).inter_gbs
    # The node still sends (n-1)/n of all its experts' gradients (and of its replicated dense
    # weights) once per unit over its NICs: 2 units x 3/4 x 2 bytes x all parameters, plus the
    # per-collective latency. Reducing each eighth as if it were replicated would send 1/8.
    floor = 2 * 3 / 4 * 2 * params_per_rank(MODEL) / (inter_gbs * 1e9)
    assert _network_s("4x8xH100-80GB", 8) >= round(floor, 2) > 0.3
    _, total1 = _dp_comm("4x8xH100-80GB", 1)
    _, total8 = _dp_comm("4x8xH100-80GB", 8)
    assert total8 < total1


def test_expert_parallel_across_nodes_shrinks_the_expert_groups() -> None:
    ep1, ep16 = _network_s("4x8xH100-80GB", 1), _network_s("4x8xH100-80GB", 16)
    experts = expert_params(MODEL)
    # ep 16 over 2 nodes: each 1/16 shard reduces over 2 ranks, one per node pair: the node
    # carries 8 shards x 1/2 = 1/4 of the experts against 3/4 with ep 1.
    assert ep16 < ep1 * (1 - 0.5 * experts / params_per_rank(MODEL))
