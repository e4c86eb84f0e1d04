"""``estimate`` in process: what the search left out, and a pin it could not keep, are printed.

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
