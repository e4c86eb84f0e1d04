"""The request's optimizer and evaluation settings in each launch's own terms, or said not applied.

The AdamW recipe and the schedule (tools/planning/optimizer_recipe.py, lr_schedule.py) reach
ds_config.json (deepspeed_config.py), Megatron-DeepSpeed (which repeats the config's as flags,
megatron.py) and torchtitan's ``[optimizer]``/``[lr_scheduler]`` (torchtitan.py); train.py's
FSDP/DDP modes take them as flags (``recipe_args``). Evaluation:

- Megatron-DeepSpeed: ``--eval-interval`` (default 1000) and ``--split`` (train, validation,
  test shares of the data; default "969, 30, 1"), megatron/arguments.py
  ``_add_validation_args`` and ``_add_data_args``: "eval every 500 steps on a 1% holdout" is
  ``--eval-interval 500 --split 99,1,0``;
- torchtitan 0.2.2: ``[validation] enable, freq`` (its own validation set, ``c4_validation``:
  no share of the training data is held out, said);
- train.py (the DeepSpeed, torchrun and FSDP launches): ``--eval-every N`` and ``--eval-holdout
  FRACTION`` (tools/smoke/scripts/job_eval.py): the last FRACTION of ``--data``, never trained
  on; a cadence without a holdout holds out train.py's default 1%, a holdout without a cadence
  is evaluated at the end only, both said in a launch note (``eval_notes``).

Horovod and TensorFlow plans run the user's own script: the settings are listed for it.
"""

from __future__ import annotations

from typing import Any

from tools.core.schemas import TrainingBrief
from tools.planning.batch_layout import BatchLayout
from tools.planning.lr_schedule import brief_schedule
from tools.planning.optimizer_recipe import OptimizerRecipe, brief_recipe

# The launches that run train.py (tools/artifacts/launch.py LAUNCHERS rows).
TRAIN_PY_LAUNCHES = ("deepspeed", "torchrun", "fsdp")
_OWN_SCRIPT = ("horovod", "tensorflow")


# train.py's holdout when a cadence comes without one (tools/smoke/scripts/holdout.py
# DEFAULT_HOLDOUT); the launch passes it, so the command says what runs.
DEFAULT_EVAL_HOLDOUT = 0.01
# Megatron-DeepSpeed's default --split (megatron/arguments.py): 3% validation.
_MEGATRON_SPLIT = "969,30,1"
# Megatron-DeepSpeed megatron/arguments.py _add_training_args: --eval-interval default.
MEGATRON_EVAL_INTERVAL = 1000


# train.py's FSDP/DDP defaults (tools/smoke/scripts/train.py ``_ddp_arguments``): clipping, betas
# (torch's AdamW default) and eps. The weight decay is always passed.
TRAIN_PY_DEFAULTS = {"max_grad_norm": 1.0, "betas": [0.9, 0.999], "eps": 1e-8}


def recipe_args(recipe: OptimizerRecipe) -> list[str]:
    """train.py's FSDP/DDP flags for the recipe: weight decay always, the rest where it differs.

    The plan's recipe (the task's, or the request's values) is what every launcher runs, so
    clipping, betas and eps are passed wherever they are not train.py's defaults: a pretraining
    run gets ``--adam-betas 0.9 0.95``, as ds_config.json, Megatron and torchtitan have it
    (before, train.py ran torch's 0.9/0.999 unless the request named betas).
    """
    args = ["--weight-decay", f"{recipe.weight_decay:g}"]
    if recipe.max_grad_norm != TRAIN_PY_DEFAULTS["max_grad_norm"]:
        args += ["--max-grad-norm", f"{recipe.max_grad_norm:g}"]
    if recipe.betas != TRAIN_PY_DEFAULTS["betas"]:
        args += ["--adam-betas", f"{recipe.beta1:g}", f"{recipe.beta2:g}"]
    if recipe.eps != TRAIN_PY_DEFAULTS["eps"]:
        args += ["--adam-eps", f"{recipe.eps:g}"]
    return args


def megatron_eval_flags(brief: TrainingBrief) -> list[str]:
    """``--eval-interval`` and ``--split`` for the request's evaluation (none when not asked)."""
    flags = ["--eval-interval", str(brief.eval_every)] if brief.eval_every else []
    if brief.eval_holdout:
        held = round(brief.eval_holdout * 100, 6)
        flags += ["--split", f"{100 - held:g},{held:g},0"]
    return flags


def train_py_eval_args(brief: TrainingBrief) -> list[str]:
    """train.py's ``--eval-every`` and ``--eval-holdout`` for the request (none when not asked)."""
    if not (brief.eval_every or brief.eval_holdout):
        return []
    every = ["--eval-every", str(brief.eval_every)] if brief.eval_every else []
    return [*every, "--eval-holdout", f"{brief.eval_holdout or DEFAULT_EVAL_HOLDOUT:g}"]


def eval_notes(brief: TrainingBrief, launcher: str, steps: int) -> list[str]:
    """What the launch assumed of the request's evaluation: a default holdout, the end only."""
    if launcher == "megatron" and brief.eval_every and not brief.eval_holdout:
        return [
            f"eval holdout: Megatron-DeepSpeed's default --split {_MEGATRON_SPLIT} (3% of the "
            "data for validation), as the request named no holdout"
        ]
    if launcher == "megatron" and brief.eval_holdout and not brief.eval_every:
        every = (
            f"every {MEGATRON_EVAL_INTERVAL} steps and " if steps > MEGATRON_EVAL_INTERVAL else ""
        )
        return [
            f"eval on the {brief.eval_holdout * 100:g}% holdout {every}at the end of the run "
            f"(Megatron-DeepSpeed's default --eval-interval {MEGATRON_EVAL_INTERVAL}), as the "
            "request named no cadence"
        ]
    if launcher not in TRAIN_PY_LAUNCHES or not (brief.eval_every or brief.eval_holdout):
        return []
    notes, holdout = [], brief.eval_holdout or DEFAULT_EVAL_HOLDOUT
    if not brief.eval_holdout:
        notes.append(
            f"eval holdout: the last {DEFAULT_EVAL_HOLDOUT * 100:g}% of the data's sequences, "
            f"never trained on (train.py's --eval-holdout {DEFAULT_EVAL_HOLDOUT:g}), as the "
            "request named no holdout"
        )
    if not brief.eval_every:
        notes.append(
            f"eval on the {holdout * 100:g}% holdout at the end of the run only, as "
            "the request named no cadence (train.py's --eval-every N adds one)"
        )
    elif brief.eval_every >= steps:
        notes.append(
            f"eval every {brief.eval_every} steps: the run is {steps} steps, so train.py "
            "evaluates at its end only"
        )
    return notes


def titan_schedule_sections(
    brief: TrainingBrief, params: float, layout: BatchLayout, steps: int
) -> dict[str, dict[str, Any]]:
    """``[optimizer]`` and ``[lr_scheduler]`` for the plan's schedule (lr_schedule.py).

    torchtitan 0.2.2's LRScheduler (torchtitan/components/lr_scheduler.py): linear warm-up over ``warmup_steps``, then
    (``decay_ratio`` unset) cosine or linear decay to ``min_lr_factor`` x lr (0.2.2 has no
    ``lr_min``); ``decay_ratio`` 0 (a constant rate) leaves no decay steps.
    """
    schedule = brief_schedule(brief, params, layout.global_batch * brief.seq_len, steps)
    recipe, constant = brief_recipe(brief), schedule.decay == "constant"
    return {
        "optimizer": {
            "name": "AdamW",
            "lr": schedule.peak_lr,
            "beta1": recipe.beta1,
            "beta2": recipe.beta2,
            "eps": recipe.eps,
            "weight_decay": recipe.weight_decay,
        },
        "lr_scheduler": {
            "warmup_steps": schedule.warmup_steps,
            "decay_type": "linear" if constant else schedule.decay,
            "min_lr_factor": schedule.min_lr_ratio,
            **({"decay_ratio": 0.0} if constant else {}),
        },
    }


def titan_validation(brief: TrainingBrief, steps: int) -> dict[str, Any]:
    """The ``[validation]`` table of torchtitan for the request's evaluation (empty when not asked).

    ``steps`` 100 batches per evaluation, as Megatron-DeepSpeed's ``--eval-iters`` default:
    0.2.2's -1 (the whole set) can hang when ranks' shares differ (its JobConfig says so).
    """
    if not (brief.eval_every or brief.eval_holdout):
        return {}
    freq = min(brief.eval_every or steps, steps)
    return {"validation": {"enable": True, "freq": freq, "steps": 100}}


def _asked(brief: TrainingBrief) -> list[str]:
    names = ("weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_eps",
             "lr_schedule", "min_lr", "warmup_ratio", "eval_every", "eval_holdout")  # fmt: skip
    values = [(name, getattr(brief, name)) for name in names]
    return [f"{name} {value:g}" if not isinstance(value, str) else f"{name} {value}"
            for name, value in values if value is not None]  # fmt: skip


def recipe_not_applied(brief: TrainingBrief, launcher: str) -> list[str]:
    """One line per request setting this launch cannot carry (none when it carries them all)."""
    if launcher in _OWN_SCRIPT:
        asked = _asked(brief)
        if not asked:
            return []
        return [
            f"{', '.join(asked)} not applied: the {launcher} launch runs your own script; "
            "set them there"
        ]
    lines: list[str] = []  # train.py's launches carry the evaluation (train_py_eval_args)
    if brief.eval_holdout and launcher == "torchtitan":
        lines.append(
            f"a {brief.eval_holdout * 100:g}% holdout not applied: torchtitan validates on its own "
            "validation set ([validation] dataset c4_validation), not a share of the training data"
        )
    if launcher == "torchtitan" and brief.max_grad_norm == 0:
        lines.append(
            "no gradient clipping not applied: torchtitan always clips (max_norm 0 would zero "
            "every gradient), so the launch clips at 1.0"
        )
    if launcher == "deepspeed" and brief.lr_schedule == "linear" and brief.min_lr:
        lines.append(
            f"linear decay to min lr {brief.min_lr:g}: DeepSpeed's WarmupDecayLR also starts its "
            "warm-up there, not at 0; the Hugging Face Trainer fills ds_config_hf.json's "
            "warmup_min_lr (auto) with 0, so decays to 0 there"
        )
    return lines
