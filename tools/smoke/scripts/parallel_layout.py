"""The model parallel_train.py splits, how it splits it, and one optimizer step of the layout.

RMSNorm, rotary position embedding, grouped-query causal attention and a SwiGLU MLP from a
Hugging Face Llama config.json (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``vocab_size``, ``rms_norm_eps``,
``rope_theta``), untied embeddings, no biases, fp32, random init (normal,
``initializer_range``). ``expected_local_params`` is the share of parameters a rank holds under
a layout, from the config alone. ``Layout`` is a rank's place in the ``(dp, pp, tp)`` mesh;
``Step`` runs one optimizer step of it (or of the unsplit reference).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import UsageError
from torch import nn


class ModelShape:
    """The dimensions of a Llama-style model, read from a Hugging Face config dict."""

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            self.hidden = int(config["hidden_size"])
            self.intermediate = int(config["intermediate_size"])
            self.layers = int(config["num_hidden_layers"])
            self.heads = int(config["num_attention_heads"])
            self.vocab = int(config["vocab_size"])
        except KeyError as exc:
            raise UsageError(f"model config lacks {exc.args[0]}") from exc
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or {}
        self.rope_theta = float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        self.init_std = float(config.get("initializer_range", 0.02))
        if config.get("tie_word_embeddings"):
            raise UsageError("tied embeddings are not supported: set tie_word_embeddings false")
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise UsageError("biases are not supported: set attention_bias and mlp_bias false")
        if self.heads % self.kv_heads:
            raise UsageError("num_attention_heads must be a multiple of num_key_value_heads")

    def check_layout(self, tp: int, pp: int) -> None:
        """Raise UsageError when the model cannot be split ``tp`` x ``pp`` ways."""
        for name, value in (
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("intermediate_size", self.intermediate),
            ("vocab_size", self.vocab),
        ):
            if value % tp:
                raise UsageError(f"{name} ({value}) is not divisible by --tp {tp}")
        if self.layers < pp:
            raise UsageError(f"{self.layers} layers cannot fill {pp} pipeline stages")


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The decoder layers of pipeline stage ``stage``: contiguous, the first ones one longer."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def expected_local_params(shape: ModelShape, tp: int, pp: int, stage: int) -> int:
    """Parameters one rank holds under the layout, from the config's dimensions alone.

    Per layer: q, k, v, o, gate, up and down are sharded ``tp`` ways (column- or row-parallel),
    the two RMSNorm weights are replicated. Stage 0 adds the vocab-parallel embedding, the last
    stage the replicated final norm and the column-parallel output head.
    """
    h, q_out, kv_out = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    sharded_per_layer = h * q_out + 2 * h * kv_out + q_out * h + 3 * h * shape.intermediate
    per_layer = sharded_per_layer // tp + 2 * h
    total = per_layer * len(stage_layers(shape.layers, pp, stage))
    if stage == 0:
        total += shape.vocab * h // tp
    if stage == pp - 1:
        total += h + shape.vocab * h // tp
    return total


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding to ``[batch, heads, seq, head_dim]`` (half-split pairs)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query causal self-attention; under TP each rank runs its share of the heads."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.q_proj = nn.Linear(h, shape.heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.heads * d, h, bias=False)
        self.head_dim = d
        self.group = shape.heads // shape.kv_heads
        self.theta = shape.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend causally over the sequence."""
        b, s, _ = x.shape
        # -1 heads: the local head count, which column-parallel q/k/v divide by the TP degree.
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        k = k.repeat_interleave(self.group, dim=1)
        v = v.repeat_interleave(self.group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x))."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual connections."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One decoder layer."""
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class StageModel(nn.Module):
    """The part of the causal LM one pipeline stage runs (the whole model with one stage).

    Stage 0 maps token ids to hidden states; the last stage maps hidden states to logits.
    """

    def __init__(self, shape: ModelShape, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden) if first else None
        # Keys are the global layer indices, so every stage names a layer as the whole model does.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(shape) for i in layers})
        self.norm = RMSNorm(shape.hidden, shape.eps) if last else None
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids or hidden states in; hidden states or logits out."""
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None and self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def build_stage(shape: ModelShape, seed: int, pp: int, stage: int) -> StageModel:
    """Stage ``stage`` of ``pp``, with the weights the whole model drawn from ``seed`` would have.

    Every rank draws the full model's weights in the same order and keeps its stage's, so any
    layout starts from exactly the reference's initial model.
    """
    gen = torch.Generator().manual_seed(seed)
    full = StageModel(shape, range(shape.layers), first=True, last=True)
    with torch.no_grad():
        for name, param in full.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.fill_(1.0)
            else:
                param.normal_(0.0, shape.init_std, generator=gen)
    part = StageModel(
        shape, stage_layers(shape.layers, pp, stage), first=stage == 0, last=stage == pp - 1
    )
    part.load_state_dict({k: v for k, v in full.state_dict().items() if k in part.state_dict()})
    return part


def apply_tensor_parallel(model: StageModel, tp_mesh: Any) -> None:
    """Shard ``model`` over ``tp_mesh`` with the Megatron plan (see the module docstring)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {}
    for key in model.layers:
        prefix = f"layers.{key}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        plan[f"{prefix}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{prefix}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{prefix}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{prefix}.mlp.down_proj"] = RowwiseParallel()
    if model.embed_tokens is not None:
        plan["embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    if model.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)


def local_param_count(model: nn.Module) -> int:
    """Parameters this rank holds: a DTensor's local shard, a plain tensor whole."""
    total = 0
    for param in model.parameters():
        to_local = getattr(param, "to_local", None)
        total += int((to_local() if callable(to_local) else param).numel())
    return total


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view sharing its storage), or a plain tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def zero1_owners(params: list[nn.Parameter], ranks: int) -> list[tuple[int, nn.Parameter]]:
    """Assign each parameter to one of ``ranks`` data-parallel ranks (the same on every rank).

    Largest first, each to the least loaded rank, so the optimizer states split about evenly.
    """
    load = [0] * ranks
    owners: dict[int, int] = {}
    order = sorted(range(len(params)), key=lambda i: (-local_shard(params[i]).numel(), i))
    for i in order:
        owner = min(range(ranks), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += int(local_shard(params[i]).numel())
    return [(owners[i], p) for i, p in enumerate(params)]


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over the batch's predicted positions."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
    )


# ---- the layout and its step -------------------------------------------------------------------


class Layout:
    """This rank's place in the ``(dp, pp, tp)`` mesh and its process groups."""

    def __init__(self, tp: int, pp: int) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world % (tp * pp):
            raise UsageError(f"world size {self.world} is not divisible by tp x pp = {tp * pp}")
        self.tp, self.pp, self.dp = tp, pp, self.world // (tp * pp)
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh("cpu", (self.dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
        self.tp_mesh = self.mesh["tp"]
        self.pp_group = self.mesh["pp"].get_group()
        self.dp_group = self.mesh["dp"].get_group()
        self.tp_rank = self.mesh["tp"].get_local_rank()
        self.stage = self.mesh["pp"].get_local_rank()
        self.dp_rank = self.mesh["dp"].get_local_rank()


class Step:
    """One optimizer step of the layout (or of the unsplit reference), returning the loss.

    The returned loss is the global one: the mean over micro-batches and data-parallel ranks,
    the same on every rank (rank 0 of each tensor-parallel group of the last stage contributes).
    """

    def __init__(self, args: argparse.Namespace, shape: ModelShape, layout: Layout | None) -> None:
        self.args, self.layout = args, layout
        stage = layout.stage if layout else 0
        pp = layout.pp if layout else 1
        self.model = build_stage(shape, args.seed, pp, stage)
        if layout is not None and layout.tp > 1:
            apply_tensor_parallel(self.model, layout.tp_mesh)
        params = list(self.model.parameters())
        # ZeRO-1: (owning dp rank, parameter) for every parameter; this rank steps its own only.
        self.owners: list[tuple[int, nn.Parameter]] = []
        if args.zero1 and layout is not None and layout.dp > 1:
            self.owners = zero1_owners(params, layout.dp)
            params = [p for owner, p in self.owners if owner == layout.dp_rank]
        self.state_params = sum(local_shard(p).numel() for p in params)
        # foreach=False: the parameters mix DTensor shards and plain (replicated) tensors.
        self.optimizer = torch.optim.AdamW(
            params, lr=args.lr, weight_decay=args.weight_decay, foreach=False
        )
        self.schedule: Any = None
        if layout is not None and layout.pp > 1:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            pipe_stage = PipelineStage(
                self.model, layout.stage, layout.pp, torch.device("cpu"), group=layout.pp_group
            )
            kind = ScheduleGPipe if args.pp_schedule == "gpipe" else Schedule1F1B
            self.schedule = kind(pipe_stage, n_microbatches=args.microbatches, loss_fn=lm_loss)

    def run(self, batch: torch.Tensor) -> float:
        """Forward, backward, gradient all-reduce and AdamW on this rank's ``batch``."""
        # The model's, not the optimizer's: under ZeRO-1 it steps only this rank's parameters.
        self.model.zero_grad(set_to_none=True)
        layout, mb = self.layout, self.args.microbatches
        last_stage = layout is None or layout.stage == layout.pp - 1
        if self.schedule is not None:
            assert layout is not None
            losses: list[torch.Tensor] = []
            if layout.stage == 0:
                self.schedule.step(batch)
            elif last_stage:
                self.schedule.step(target=batch, losses=losses)
            else:
                self.schedule.step()
            local = torch.stack(losses).mean().detach() if last_stage else torch.zeros(())
        elif layout is None:
            # The reference: the whole global batch in one forward (micro-batches of equal size
            # average to the same mean loss).
            loss = lm_loss(self.model(batch), batch)
            loss.backward()
            local = loss.detach()
        else:
            # No pipeline: accumulate the micro-batches' gradients, each scaled by 1/M.
            total = torch.zeros(())
            for part in batch.chunk(mb):
                loss = lm_loss(self.model(part), part) / mb
                loss.backward()
                total += loss.detach()
            local = total
        if layout is not None and layout.dp > 1:
            for param in self.model.parameters():
                if param.grad is None:
                    continue
                to_local = getattr(param.grad, "to_local", None)
                grad = to_local() if callable(to_local) else param.grad
                dist.all_reduce(grad, group=layout.dp_group)
                grad.div_(layout.dp)
        self.optimizer.step()
        if self.owners:
            assert layout is not None
            with torch.no_grad():
                for owner, param in self.owners:
                    src = dist.get_global_rank(layout.dp_group, owner)
                    dist.broadcast(local_shard(param), src=src, group=layout.dp_group)
        if layout is None:
            return float(local)
        owner = last_stage and layout.tp_rank == 0
        value = torch.tensor([float(local) if owner else 0.0], dtype=torch.float64)
        dist.all_reduce(value)
        return float(value[0]) / layout.dp
