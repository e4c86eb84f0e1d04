"""The learning-rate schedule of the planned run: peak rate, warm-up and decay, from the steps.

One schedule per plan, which every launcher writes in its own terms (DeepSpeed WarmupCosineLR,
Megatron ``--lr-warmup-iters/--lr-decay-iters/--lr-decay-style cosine/--min-lr``, torchtitan's
``[lr_scheduler]``, train.py's ``--lr-schedule cosine --warmup-steps``):

- **warm-up**: 3% of the run (Stanford Alpaca's ``warmup_ratio 0.03``, Taori et al. 2023), at
  most Llama 2's 2,000 steps (Touvron et al. 2023, sec. 2.2, where 2,000 steps are 0.4% of the
  run), at least one step; so always under a tenth of a run of 11 steps or more;
- **decay**: cosine from the peak over the rest of the run, to 10% of the peak for pretraining
  (Llama 2 sec. 2.2; Chinchilla, Hoffmann et al. 2022, decays by 10x), to 0 for fine-tuning and
  LoRA (Alpaca's cosine schedule); a request's "linear decay" or "constant LR", "min lr 3e-5"
  and "10% warmup" (the brief's ``lr_schedule``, ``min_lr``, ``warmup_ratio``) replace the
  rule's shape, floor and warm-up (``brief_schedule``), and the note says so;
- **peak rate**, pretraining: GPT-3's rate for the model's size at its batch (Brown et al. 2020,
  Table 2.1; log-log interpolation between its rows, the end rows beyond them), times
  sqrt(planned batch tokens / the row's batch tokens) when the plan's batch is smaller (the
  square-root rule for Adam, Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms"); never above the table's rate, since a larger batch than the
  published one is untested there. Full fine-tuning: 2e-5 below 10B parameters, 1e-5 from 10B
  (Alpaca's 7B and 13B runs); LoRA: 2e-4 up to 20B, 1e-4 above (QLoRA, Dettmers et al. 2023,
  sec. 4: 7B/13B and 33B/65B); fine-tuning rates are not scaled by batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tools.core.schemas import TrainingBrief

# GPT-3 (Brown et al. 2020, Table 2.1): (parameters, batch tokens, peak learning rate).
GPT3_TABLE = (
    (125e6, 0.5e6, 6.0e-4),
    (350e6, 0.5e6, 3.0e-4),
    (760e6, 0.5e6, 2.5e-4),
    (1.3e9, 1e6, 2.0e-4),
    (2.7e9, 1e6, 1.6e-4),
    (6.7e9, 2e6, 1.2e-4),
    (13e9, 2e6, 1.0e-4),
    (175e9, 3.2e6, 0.6e-4),
)
# (parameters below, peak learning rate): Alpaca (full fine-tune) and QLoRA (LoRA).
FINETUNE_LR = ((10e9, 2e-5), (math.inf, 1e-5))
LORA_LR = ((20e9, 2e-4), (math.inf, 1e-4))
WARMUP_SHARE = 0.03  # Alpaca's warmup_ratio
MAX_WARMUP_STEPS = 2000  # Llama 2 sec. 2.2
PRETRAIN_MIN_LR_RATIO = 0.1  # Llama 2 sec. 2.2: decay to 10% of the peak
# The run length when neither the request (dataset_tokens) nor the engineer gives one: the
# launch files' default (agents/toolkit.py emit_launch), said in the plan's notes.
DEFAULT_RUN_STEPS = 1000


@dataclass(frozen=True)
class LrSchedule:
    """Linear warm-up to ``peak_lr``, then cosine decay to ``min_lr_ratio`` x peak at the end."""

    peak_lr: float
    warmup_steps: int
    total_steps: int
    min_lr_ratio: float
    rule: str  # where the peak rate comes from, for the notes
    warmup_rule: str = "3% of the run, Alpaca's warmup_ratio, at most Llama 2's 2,000"
    decay: str = "cosine"  # cosine | linear | constant (after the warm-up)
    decay_rule: str = ""  # why the decay or its floor is not the rule's, for the notes
    floor_lr: float | None = None  # the request's min lr, exactly (else peak x ratio)

    @property
    def min_lr(self) -> float:
        """The rate at the end of the decay."""
        if self.floor_lr is not None and self.min_lr_ratio:
            return self.floor_lr
        return self.peak_lr * self.min_lr_ratio

    def lr_at(self, step: int) -> float:
        """The rate after ``step`` optimizer steps (the curve the launchers implement)."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.decay == "constant":
            return self.peak_lr
        span = max(1, self.total_steps - self.warmup_steps)
        done = min(1.0, (step - self.warmup_steps) / span)
        shape = 1 - done if self.decay == "linear" else 0.5 * (1 + math.cos(math.pi * done))
        return self.peak_lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * shape)

    def note(self) -> str:
        """The schedule in one line for the plan's notes, with its sources."""
        floor = f"{self.min_lr:.3g}" if self.min_lr_ratio else "0"
        head = (
            f"learning rate: peak {self.peak_lr:.3g} ({self.rule}); linear warm-up over "
            f"{self.warmup_steps} of {self.total_steps} steps ({self.warmup_rule}), then "
        )
        if self.decay == "constant":
            return head + "constant" + (f" ({self.decay_rule})" if self.decay_rule else "")
        rule_floor = (
            "10% of the peak, Llama 2" if self.min_lr_ratio and self.floor_lr is None else ""
        )
        why = "; ".join(part for part in (self.decay_rule, rule_floor) if part)
        return (
            head + f"{self.decay} decay to {floor} at step {self.total_steps}"
            + (f" ({why})" if why else "")
        )  # fmt: skip


def warmup_steps(total_steps: int) -> int:
    """Warm-up steps of a ``total_steps`` run (module docstring): 3%, at most 2,000, at least 1."""
    return max(1, min(MAX_WARMUP_STEPS, math.floor(WARMUP_SHARE * total_steps)))


def pretrain_peak_lr(params: float, batch_tokens: float) -> tuple[float, str]:
    """GPT-3's peak rate for ``params`` (interpolated), square-root scaled to a smaller batch."""
    rows = GPT3_TABLE
    if params <= rows[0][0]:
        _, ref_batch, lr = rows[0]
    elif params >= rows[-1][0]:
        _, ref_batch, lr = rows[-1]
    else:
        (p0, b0, l0), (p1, b1, l1) = next(
            (a, b) for a, b in zip(rows, rows[1:], strict=False) if a[0] <= params <= b[0]
        )
        t = math.log(params / p0) / math.log(p1 / p0)
        lr = math.exp(math.log(l0) + t * math.log(l1 / l0))
        ref_batch = math.exp(math.log(b0) + t * math.log(b1 / b0))
    factor = min(1.0, math.sqrt(max(1.0, batch_tokens) / ref_batch))
    rule = (
        f"GPT-3 Table 2.1's rate for {params / 1e9:.2g}B parameters at "
        f"{ref_batch / 1e6:.2g}M tokens per step"
    )
    if factor < 1:
        rule += (
            f", x{factor:.2f} for this plan's {batch_tokens / 1e6:.2g}M tokens per step "
            "(square-root rule for Adam, Malladi et al. 2022)"
        )
    return lr * factor, rule


def peak_lr(task: str, params: float, batch_tokens: float) -> tuple[float, str]:
    """The peak rate for the task, model size and tokens per step, and the rule it came from."""
    if task == "lora":
        lr = next(rate for limit, rate in LORA_LR if params < limit)
        return lr, f"QLoRA's LoRA rate for {params / 1e9:.2g}B parameters"
    if task == "finetune":
        lr = next(rate for limit, rate in FINETUNE_LR if params < limit)
        return lr, f"Alpaca's full fine-tuning rate for {params / 1e9:.2g}B parameters"
    return pretrain_peak_lr(params, batch_tokens)


def plan_schedule(
    task: str,
    params: float,
    batch_tokens: float,
    total_steps: int,
    asked: float | None = None,
    asked_warmup: int | None = None,
) -> LrSchedule:
    """The run's schedule: ``peak_lr``, ``warmup_steps`` and the decay floor for the task.

    ``asked``: the peak rate the request names (the brief's ``learning_rate``), which replaces
    the rule's; ``asked_warmup``: its warm-up steps (``warmup_steps``), at most the run's. The
    note then says so and what the rule would have given.
    """
    total = max(1, int(total_steps))
    lr, rule = peak_lr(task, params, batch_tokens)
    if asked is not None:
        lr, rule = asked, f"the request's rate; the rule gives {lr:.3g}: {rule}"
    warmup, warmup_rule = warmup_steps(total), LrSchedule.warmup_rule
    if asked_warmup is not None:
        capped = " capped at the run's length" if asked_warmup > total else ""
        warmup_rule = f"the request's {asked_warmup} steps{capped}; the rule gives {warmup}"
        warmup = min(asked_warmup, total)
    return LrSchedule(
        peak_lr=lr,
        warmup_steps=warmup,
        total_steps=total,
        min_lr_ratio=PRETRAIN_MIN_LR_RATIO if task not in ("finetune", "lora") else 0.0,
        rule=rule,
        warmup_rule=warmup_rule,
    )


def brief_schedule(
    brief: TrainingBrief, params: float, batch_tokens: float, total_steps: int
) -> LrSchedule:
    """The schedule of ``brief``'s run: its task's rule, or the rate, warm-up and decay it names."""
    total = max(1, int(total_steps))
    schedule = plan_schedule(
        brief.task, params, batch_tokens, total, brief.learning_rate, asked_warmup(brief, total)
    )
    if brief.warmup_ratio is not None:
        rule = f"the request's {brief.warmup_ratio * 100:g}% of the run; the rule gives "
        schedule = dataclasses.replace(
            schedule, warmup_rule=rule + str(warmup_steps(schedule.total_steps))
        )
    return asked_decay(schedule, brief.lr_schedule, brief.min_lr)


def asked_warmup(brief: TrainingBrief, total_steps: int) -> int | None:
    """The warm-up steps the request names: ``warmup_steps``, or ``warmup_ratio`` of the run."""
    if brief.warmup_ratio is not None:
        return max(1, round(brief.warmup_ratio * total_steps))
    return brief.warmup_steps


def asked_decay(schedule: LrSchedule, decay: str | None, min_lr: float | None) -> LrSchedule:
    """The schedule with the request's decay shape and floor (``min_lr``, an absolute rate).

    A floor at or above the peak leaves nothing to decay: the rate stays constant, said.
    """
    if decay is None and min_lr is None:
        return schedule
    update: dict[str, object] = {}
    why = []
    if decay is not None:
        update["decay"] = decay
        why.append(f"the request's {decay} schedule")
    if min_lr is not None:
        if min_lr >= schedule.peak_lr:
            update["decay"], update["min_lr_ratio"] = "constant", 0.0
            why.append(f"the request's min lr {min_lr:.3g} is not below the peak: no decay")
        elif (decay or schedule.decay) == "constant":
            update["min_lr_ratio"] = 0.0
            why.append(f"min lr {min_lr:.3g} not applied: a constant rate does not decay")
        else:
            update["min_lr_ratio"], update["floor_lr"] = min_lr / schedule.peak_lr, min_lr
            why.append(f"the request's min lr {min_lr:.3g}")
    elif decay == "constant":
        update["min_lr_ratio"] = 0.0
    return dataclasses.replace(schedule, decay_rule="; ".join(why), **update)  # type: ignore[arg-type]
