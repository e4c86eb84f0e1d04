"""``estimate`` in process: what the search left out is printed; a loaded model's limits hold.

The estimate text listed the setups searched without the "not searched" line, so an estimate
of deepseek-v2-lite on 16 H100 showed ZeRO-3 as best with no word of the expert splits that
Megatron-DeepSpeed would run on a model it cannot build (the JSON had it).
"""

from __future__ import annotations

from pathlib import Path


def test_estimate_text_says_which_splits_were_not_searched(tmp_path: Path) -> None:
    from inproc import run_main

    done = run_main(
        "estimate", "--model", "deepseek-v2-lite", "--hardware", "2x8xH100-80GB", "--task",
        "pretrain", "--seq-len", "4096", "--global-batch", "256",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("  not searched:")]
    assert len(said) == 1 and "multi-head latent attention" in said[0]


def test_an_estimate_of_a_job_loading_gpt2_takes_its_position_limit(tmp_path: Path) -> None:
    # `estimate --model gpt2` (a fine-tune) was refused: the default 2048 tokens are past the
    # checkpoint's 1024 positions, while a plan request or brief file took 1024.
    from inproc import run_main

    done = run_main("estimate", "--model", "gpt2", "--hardware", "1x1xA100-80GB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("seq 1024")
    scratch = run_main(
        "estimate", "--model", "gpt2", "--hardware", "1x1xA100-80GB", "--task", "pretrain",
        cwd=tmp_path,
    )  # fmt: skip
    assert scratch.stdout.splitlines()[0].endswith("seq 2048")  # the table is sized to seq_len
