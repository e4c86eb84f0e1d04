"""The torchrun smoke run steps the plan's AdamW: its weight decay, clipping, betas and eps.

Before, the smoke run took only the plan's schedule flags, so a recipe train.py refuses (or a
flag it lacks) passed the smoke test and failed the job.
"""

from __future__ import annotations

from tools.smoke.schedule import plan_recipe_flags

PLAN = [
    "torchrun", "--nproc_per_node", "8", "trainer/train.py", "--steps", "1000", "--lr", "2e-05",
    "--weight-decay", "0.1", "--max-grad-norm", "0.5", "--adam-betas", "0.9", "0.95",
    "--adam-eps", "1e-06", "--lr-schedule", "constant", "--warmup-steps", "30", "--bf16",
]  # fmt: skip


def test_the_recipe_flags_are_taken_as_given_and_train_py_parses_them() -> None:
    import train

    flags = plan_recipe_flags(PLAN)
    assert flags == ["--weight-decay", "0.1", "--max-grad-norm", "0.5", "--adam-betas", "0.9",
                     "0.95", "--adam-eps", "1e-06"]  # fmt: skip
    args = train.parse_args(["--model-config", "c.json", "--metrics-dir", "m", *flags])
    assert (args.weight_decay, args.max_grad_norm, args.adam_eps) == (0.1, 0.5, 1e-6)
    assert list(args.adam_betas) == [0.9, 0.95]


def test_a_plan_without_them_adds_none() -> None:
    assert plan_recipe_flags(["torchrun", "trainer/train.py", "--lr-schedule", "cosine"]) == []
