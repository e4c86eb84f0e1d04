"""All-to-all collectives of one training step: DeepSpeed-Ulysses and expert parallelism.

Both swap what a rank holds mid-layer, so they sit on the critical path (no compute to hide
behind): Ulysses trades the sequence split for a head split around attention (Jacobs et al.
2023), expert parallelism routes tokens to the ranks of their experts and back (DeepSpeed-MoE,
Rajbhandari et al. 2022). tools/planning/comm.py prices the other collectives.
"""

from __future__ import annotations

from tools.planning.comm import COLLECTIVE_S, Links, StepSetup
from tools.planning.parallel import heaviest_stage_layers
from tools.planning.states import head_dim


def ulysses_comm(setup: StepSetup, links: Links) -> tuple[int, float]:
    """DeepSpeed-Ulysses all-to-alls per GPU per step (Jacobs et al. 2023, sec. 3.1).

    Each layer swaps the sequence split for a head split before attention and back after it:
    all-to-alls of the query, key, value (s/c·b·(h + 2·kv_dim) values) and of the output
    (s/c·b·h), each sending (c-1)/c of its buffer; backward sends their gradients the same
    way, and full recomputation repeats the forward's. They sit on the critical path (the
    attention needs them first), inside a node when c fits one.
    """
    cp, model = setup.cp, setup.model
    if cp <= 1 or not setup.all_to_all_cp:
        return 0, 0.0
    q_dim = model.heads * head_dim(model)
    kv_dim = (model.kv_heads or model.heads) * head_dim(model)
    per_layer = setup.micro * setup.seq // cp * (2 * q_dim + 2 * kv_dim) * setup.grad_bytes
    passes = 2 + (1 if setup.recompute == "full" else 0)
    layers = heaviest_stage_layers(model.layers, setup.pp)
    cp_bytes = int(passes * per_layer * (cp - 1) / cp * layers * setup.accumulation)
    inside = setup.tp * cp <= max(1, setup.hardware.gpus_per_node)
    gbs = links.intra_gbs if inside or setup.hardware.nodes == 1 else links.inter_gbs / 8
    cp_s = cp_bytes / (gbs * 1e9) + 4 * passes * layers * setup.accumulation * COLLECTIVE_S
    setup.notes.append(
        f"context parallel {cp} (DeepSpeed-Ulysses): 4 all-to-alls of queries, keys, values "
        f"and outputs per layer and pass send {cp_bytes / 1e9:.2f} GB per GPU per step "
        f"{'inside the node' if inside else 'across nodes'} ({cp_s:.3f} s), not overlapped"
    )
    return cp_bytes, cp_s


def expert_parallel_comm(setup: StepSetup, links: Links) -> tuple[int, float]:
    """Expert-parallel all-to-alls per GPU per step (DeepSpeed-MoE, Rajbhandari et al. 2022).

    Every MoE layer dispatches each token's hidden state to its top-k experts' ranks and
    combines the results back: two all-to-alls of s·b·k·h values in forward, two of their
    gradients in backward, two more under full recomputation; each sends (e-1)/e of its buffer.
    They sit on the critical path, inside a node when e fits one.
    """
    ep = setup.ep
    if ep <= 1:
        return 0, 0.0
    model = setup.model
    cfg = model.hf_config or {}
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("moe_top_k") or 2)
    passes = 4 + (2 if setup.recompute == "full" else 0)
    layers = heaviest_stage_layers(model.layers, setup.pp)
    buffer = setup.micro * setup.seq * top_k * model.hidden * setup.grad_bytes
    ep_bytes = int(passes * buffer * (ep - 1) / ep * layers * setup.accumulation)
    inside = ep <= max(1, setup.hardware.gpus_per_node)
    gbs = links.intra_gbs if inside or setup.hardware.nodes == 1 else links.inter_gbs / 8
    ep_s = ep_bytes / (gbs * 1e9) + passes * layers * setup.accumulation * COLLECTIVE_S
    setup.notes.append(
        f"expert parallel {ep}: {passes} all-to-alls of the tokens' top-{top_k} hidden states "
        f"per MoE layer and micro-batch send {ep_bytes / 1e9:.2f} GB per GPU per step "
        f"{'inside the node' if inside else 'across nodes'} ({ep_s:.3f} s), not overlapped; "
        f"each rank runs {ep}x taller GEMMs for 1/{ep} of the experts (the same FLOPs per GPU)"
    )
    return ep_bytes, ep_s
