"""The run's AdamW recipe: betas, eps, weight decay and gradient clipping, by task or as asked.

Pretraining: LLaMA (Touvron et al. 2023, sec. 2.2) AdamW betas (0.9, 0.95), weight decay 0.1.
Fine-tuning and LoRA: AdamW's default betas, no weight decay (Stanford Alpaca's recipe). Every
task: eps 1e-8 (AdamW's default) and clipping at a gradient norm of 1.0 (LLaMA sec. 2.2). The
brief's ``weight_decay``, ``adam_beta1``/``adam_beta2``, ``adam_eps`` and ``max_grad_norm``
(the request's words, tools/intake/optim_text.py) replace the task's; every launcher writes the
one recipe in its own terms (ds_config.json's optimizer block and ``gradient_clipping``,
train.py's flags, Megatron's, torchtitan's ``[optimizer]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.core.schemas import TrainingBrief

_RECIPES: dict[str, dict[str, Any]] = {
    "pretrain": {"betas": [0.9, 0.95], "weight_decay": 0.1},
    "finetune": {"betas": [0.9, 0.999], "weight_decay": 0.0},
    "lora": {"betas": [0.9, 0.999], "weight_decay": 0.0},
}
DEFAULT_EPS = 1e-8
DEFAULT_MAX_GRAD_NORM = 1.0


TRAINED_TASKS = tuple(_RECIPES)  # the tasks an optimizer recipe exists for


def task_recipe(task: str) -> dict[str, Any]:
    """The optimizer recipe (betas, weight decay) for a training task."""
    return dict(_RECIPES.get(task, _RECIPES["pretrain"]))


@dataclass(frozen=True)
class OptimizerRecipe:
    """AdamW's settings for the run; ``asked`` names the ones the request set."""

    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    max_grad_norm: float  # 0: no clipping
    asked: tuple[str, ...] = ()

    @property
    def betas(self) -> list[float]:
        """(beta1, beta2) as the configs write them."""
        return [self.beta1, self.beta2]


_ASKED = ("adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "max_grad_norm")


def brief_recipe(brief: TrainingBrief) -> OptimizerRecipe:
    """The AdamW recipe of ``brief``'s run: its task's, with what the request names in place."""
    task = task_recipe(brief.task)
    asked = tuple(name for name in _ASKED if getattr(brief, name) is not None)

    def pick(value: float | None, default: float) -> float:
        return default if value is None else float(value)

    return OptimizerRecipe(
        beta1=pick(brief.adam_beta1, task["betas"][0]),
        beta2=pick(brief.adam_beta2, task["betas"][1]),
        eps=pick(brief.adam_eps, DEFAULT_EPS),
        weight_decay=pick(brief.weight_decay, task["weight_decay"]),
        max_grad_norm=pick(brief.max_grad_norm, DEFAULT_MAX_GRAD_NORM),
        asked=asked,
    )
