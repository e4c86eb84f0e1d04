"""command_argv reads a launch script's command as bash would (tools/review/launch_script.py)."""

from __future__ import annotations

from tools.review.launch_script import command_argv

SCRIPT = """\
#!/usr/bin/env bash
# Launch for: x (deepspeed)
[[ -n "${MODEL_PATH:-}" ]] || MODEL_PATH='org/My Model'
deepspeed --num_gpus 8 trainer/train.py --model-path "$MODEL_PATH" --seq-len 4096 ${DATA:+--data} ${DATA:+"$DATA"} "$@"
"""
SBATCH = """\
srun --kill-on-bad-exit=1 bash -c 'exec deepspeed --node_rank "$SLURM_NODEID" trainer/train.py --steps 9 "$@"' bash "$@" &
"""


def test_the_command_from_its_program_with_the_scripts_defaults() -> None:
    assert command_argv(SCRIPT, "deepspeed") == [
        "deepspeed",
        "--num_gpus",
        "8",
        "trainer/train.py",
        "--model-path",
        "org/My Model",
        "--seq-len",
        "4096",
    ]
    assert command_argv(SCRIPT, "trainer/train.py")[:3] == [  # type: ignore[index]
        "trainer/train.py",
        "--model-path",
        "org/My Model",
    ]
    assert command_argv(SCRIPT, "torchrun") is None


def test_a_command_inside_srun_bash_c() -> None:
    assert command_argv(SBATCH, "trainer/train.py") == ["trainer/train.py", "--steps", "9"]
    assert command_argv(SBATCH, "srun") == ["srun", "--kill-on-bad-exit=1", "bash", "-c"] + [
        'exec deepspeed --node_rank "$SLURM_NODEID" trainer/train.py --steps 9 "$@"',
        "bash",
    ]
