"""Memory of one CPU rank (gloo, fp32) training with DDP or DeepSpeed ZeRO-1/2/3.

A CPU rank's footprint is its anonymous resident memory, sampled (tools/smoke/scripts/job_probes.py
``CpuPeak``) after each forward, backward and optimizer step. On CPU there is no caching
allocator and no 16-bit copy: DeepSpeed's "bit16" buffers are fp32, and what a rank holds
differs from the GPU model (tools/planning/memory.py) in three ways:

1. Code, not tensors: the first ZeRO optimizer imports torch._dynamo/_inductor
   (``ZERO_IMPORT_BYTES``) and the first optimizer step leaves a fixed amount behind
   (``FIRST_STEP_BYTES``), whatever the model's size.
2. ZeRO-1/2 keep the whole flattened parameter buffer and, after backward, the *whole*
   gradient of every parameter that reaches into the rank's partition.
3. ZeRO-3 holds three partitions (parameters, fp32 master, flat gradient buffer) and, at the
   end of the forward pass, every gathered parameter.

Every term is a function of P = 4 x parameters (fp32) and S = P / ranks; the constants were
measured with ``bench/calibration/cpu_rank_probe.py`` (RssAnon at the same points the smoke run samples) on
the gpt2 smoke shape (3.7M parameters) and checked on TinyLlama's (6.1M); see
bench/results/2026-11-30-suite-full.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tools.core.schemas import MemoryBreakdown, ModelSpec

MiB = 2**20
# deepspeed/runtime/zero/utils.py is_zero_supported_optimizer imports
# deepspeed.runtime.zero.muon.muon_optimizer, whose @compiler.compile() kernels import
# torch._dynamo and torch._inductor (~1,300 modules). Measured: RssAnon across
# DeepSpeedEngine._do_optimizer_sanity_check, 42.7 MiB (ZeRO-1/2) and 43.6 MiB (ZeRO-3) above
# the smoke baseline, the same at 3.7M and 6.1M parameters (DeepSpeed 0.19.8, torch 2.13 CPU):
# `python bench/calibration/cpu_rank_probe.py --model gpt2 --strategy zero1 --trace`.
ZERO_IMPORT_BYTES = 43 * MiB
# What the first optimizer step leaves resident beyond the optimizer's moments (lazy kernels and
# per-thread state of torch.optim.AdamW's first step, small allocations glibc keeps in its
# arenas). Measured on the gpt2 smoke shape, RssAnon after step 1 minus after init minus the
# moments: ddp 5.1, ZeRO-1/2 4.5, ZeRO-3 5.6 MiB (`python bench/calibration/cpu_rank_probe.py`).
FIRST_STEP_BYTES = 5 * MiB
# torch.optim.AdamW/Adam _init_group: exp_avg and exp_avg_sq, one fp32 value each per parameter.
ADAM_MOMENTS = 2
# The optimizers whose states the terms below describe (SGD with momentum would keep one).
ADAM_OPTIMIZERS = ("adamw", "adam")


@dataclass
class HostRankTerms:
    """Named bytes of one CPU rank, and which of them are live at each sample point."""

    terms: dict[str, int]
    phases: dict[str, list[str]]
    notes: list[str] = field(default_factory=list)

    def phase_bytes(self, phase: str) -> int:
        """Bytes live at one sample point (after forward, backward or the optimizer step)."""
        return sum(self.terms[name] for name in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        """The sample point with the most memory live."""
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> int:
        """The largest of the sample points."""
        return self.phase_bytes(self.peak_phase)


def host_rank_terms(
    model: ModelSpec, strategy: str, ranks: int, activations: int
) -> HostRankTerms | None:
    """The terms of one CPU rank training every parameter in fp32 with AdamW; None if no model.

    ``strategy`` is ddp, zero1, zero2 or zero3 (anything else: None, the caller's generic
    model applies); ``activations`` are the forward pass's saved tensors
    (tools/planning/activations.py).
    """
    if strategy not in ("ddp", "zero1", "zero2", "zero3"):
        return None
    ranks = max(1, ranks)
    full = 4 * model.params  # P: every parameter in fp32
    part = math.ceil(model.params / ranks) * 4  # S: one rank's partition
    step = FIRST_STEP_BYTES
    if strategy == "ddp":
        terms = {
            "params": full,
            # DistributedDataParallel's reducer (torch/csrc/distributed/c10d/reducer.cpp)
            # keeps one flat bucket per ~25 MiB of gradients, covering every parameter;
            # param.grad is a separate tensor (gradient_as_bucket_view=False).
            "gradients": full,
            "ddp_buckets": full if ranks > 1 else 0,
            "optimizer_moments": ADAM_MOMENTS * full,
            "activations": activations,
            "first_step": step,
        }
        common = ["params", "optimizer_moments", "first_step"]
        phases = {
            # train.py zero_grad(set_to_none=True) runs before each forward.
            "forward": [*common, "activations"],
            "backward": [*common, "gradients", "ddp_buckets"],
            "step": [*common, "gradients", "ddp_buckets"],
        }
        return HostRankTerms(terms, phases)
    common = ["optimizer_moments", "master_params", "zero_import", "first_step"]
    if strategy == "zero3":
        terms = {
            # stage3.py: the rank's parameter partition (fp16_partitioned_groups_flat, fp32 on
            # CPU), its fp32 master copy (fp32_partitioned_groups_flat) and the flat gradient
            # partition (grad_partitions_flat_buffer), each S.
            "params": part,
            "master_params": part,
            "gradient_partition": part,
            # partitioned_param_coordinator.py: with stage3_max_live_parameters at its default
            # 1e9 every parameter fetched in forward stays gathered until backward releases it.
            "gathered_params": full,
            "optimizer_moments": ADAM_MOMENTS * part,
            "activations": activations,
            "zero_import": ZERO_IMPORT_BYTES,
            "first_step": step,
        }
        common = ["params", "gradient_partition", *common]
        phases = {
            "forward": [*common, "gathered_params", "activations"],
            "backward": common,
            "step": common,
        }
        return HostRankTerms(terms, phases)
    # ZeRO-1/2, stage_1_and_2.py: every parameter is a view into bit16_groups_flat (all of
    # them, P), the rank's fp32 master partition is single_partition_of_fp32_groups (S). After
    # backward the rank holds the whole gradient of each parameter in params_in_partition: a
    # parameter that straddles a partition boundary counts whole (measured on gpt2: 8.0 and
    # 14.1 MiB on the two ranks for S = 7.1 MiB); bounded by S plus the largest parameter per
    # boundary (one for the first and last ranks, two in between).
    boundaries = min(2, ranks - 1)
    grads = min(full, part + boundaries * 4 * model.largest_layer_params)
    terms = {
        "params": full,
        "master_params": part,
        "gradients_in_partition": grads,
        "optimizer_moments": ADAM_MOMENTS * part,
        "activations": activations,
        "zero_import": ZERO_IMPORT_BYTES,
        "first_step": step,
    }
    common = ["params", *common]
    phases = {
        "forward": [*common, "activations"],
        "backward": [*common, "gradients_in_partition"],
        "step": common,
    }
    return HostRankTerms(terms, phases)


def host_rank_breakdown(
    model: ModelSpec,
    strategy: str,
    ranks: int,
    activations: int,
    *,
    margin_fraction: float,
) -> tuple[MemoryBreakdown, list[str]] | None:
    """The CPU rank's MemoryBreakdown (peak over sample points, plus the margin) and notes."""
    found = host_rank_terms(model, strategy, ranks, activations)
    if found is None:
        return None
    t = found.terms
    params = t.get("params", 0) + t.get("gathered_params", 0)
    gradients = (
        t.get("gradients", 0) + t.get("gradients_in_partition", 0) + t.get("gradient_partition", 0)
    )
    optimizer = t.get("master_params", 0) + t.get("optimizer_moments", 0)
    buffers = t.get("ddp_buckets", 0) + t.get("zero_import", 0) + t.get("first_step", 0)
    peak = found.peak
    margin = int(margin_fraction * peak)
    everything = params + gradients + optimizer + t["activations"] + buffers
    notes = [
        f"CPU rank (fp32, gloo; tools/planning/host_ranks.py): peak {peak / MiB:.1f} MiB after "
        f"the {found.peak_phase}: "
        + ", ".join(
            f"{name} {t[name] / MiB:.1f}" for name in found.phases[found.peak_phase] if t[name]
        )
        + " MiB"
    ]
    breakdown = MemoryBreakdown(
        params=params,
        gradients=gradients,
        optimizer=optimizer,
        activations=t["activations"],
        buffers=buffers + margin,
        total=peak + margin,
        not_concurrent=everything - peak,
        margin=margin,
        # Host memory: no CUDA context, so the device-used figure is the reserved one.
        peak_allocated=peak,
        peak_reserved=peak + margin,
        device_used=peak + margin,
    )
    return breakdown, notes
