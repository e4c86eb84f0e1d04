"""``estimate`` in process: what the search left out is printed; a model's own limits hold.

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
    # As `plan "pretrain gpt2 ..."` reads it: the architecture as published, 1024 positions.
    assert scratch.stdout.splitlines()[0].endswith("seq 1024")


def test_an_estimate_of_a_brief_file_takes_the_models_own_sample_length(tmp_path: Path) -> None:
    # `estimate --brief` filled in the loader's default 2048 before the model was asked: a gpt2
    # fine-tune file was refused (past its 1024 positions) and a resnet-50 file was costed as
    # 2048-token samples, while `plan --brief` with the same files took 1024 and one image.
    from inproc import run_main

    (tmp_path / "g.yaml").write_text("model: gpt2\ntask: finetune\nhardware: 1x1xA100-80GB\n")
    (tmp_path / "r.yaml").write_text("model: resnet-50\ntask: pretrain\nhardware: 1x8xV100\n")
    tuned = run_main("estimate", "--brief", str(tmp_path / "g.yaml"), cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert tuned.stdout.splitlines()[0].endswith("seq 1024")
    images = run_main("estimate", "--brief", str(tmp_path / "r.yaml"), cwd=tmp_path)
    assert images.returncode == 0, images.stderr
    assert images.stdout.splitlines()[0].endswith("seq 160")
    assert any(line.strip().startswith("images/s:") for line in images.stdout.splitlines())
    # The runners-up's margins are signed against the chosen setup (one read "--0.2%").
    table = images.stdout.split("best setups searched")[1].splitlines()[2:7]
    assert table and all(" --" not in row for row in table)
    assert all(row.split()[-1] == "best" or row.split()[-1][0] in "+-" for row in table)
