"""train.py's evaluation, its pure parts: the held-out share, how ranks deal it, the mean loss.

holdout.py (how much is held out, the one line when too little is left to train on, each
rank's rows), the split in job_data.py (text blocks and token-shard samples: the last ones,
never drawn for training), train.py's flags, and job_eval.py's loss per held-out token with a
stand-in job. The real runs (DDP, FSDP, ZeRO-3, LoRA on 2 CPU ranks) are in
tests/smoke/test_train_job.py.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import job_data
import numpy as np
import pytest
import torch
import train
from harness import UsageError
from holdout import HeldOut, eval_batches, holdout_size, rank_rows, split_holdout
from job_eval import Evaluator, board_tag


@pytest.mark.parametrize(
    ("total", "fraction", "held"),
    [(100, 0.07, 7), (100, 0.05, 5), (84, 0.01, 1), (84, 0.1, 9), (3, 0.99, 3), (0, 0.5, 0)],
)
def test_the_holdout_is_the_fraction_rounded_up_and_never_empty(
    total: int, fraction: float, held: int
) -> None:
    assert holdout_size(total, fraction) == held


def test_a_holdout_that_leaves_too_little_to_train_on_is_one_line() -> None:
    assert split_holdout(84, 0.1, 8, "blocks") == 9
    with pytest.raises(UsageError) as caught:
        split_holdout(84, 0.95, 8, "blocks of 32 tokens")
    assert str(caught.value) == (
        "--eval-holdout 0.95 holds out 80 of the data's 84 blocks of 32 tokens, leaving 4 to "
        "train on, fewer than 8 (--micro-batch x data-parallel ranks); lower --eval-holdout or "
        "add data"
    )


@pytest.mark.parametrize(
    ("count", "ranks", "micro", "most"), [(9, 2, 2, 20), (100, 4, 3, 2), (1, 3, 1, 5)]
)
def test_ranks_read_disjoint_rows_in_as_many_batches_each(
    count: int, ranks: int, micro: int, most: int
) -> None:
    batches = eval_batches(count, ranks, micro, most)
    assert batches == min(most, math.ceil(count / (ranks * micro)))
    seen: list[int] = []
    for rank in range(ranks):
        rows = rank_rows(count, rank, ranks, micro, batches)
        # Every rank runs the same number of full micro-batches: FSDP and ZeRO-3 stay in step.
        assert len(rows) == batches and all(len(batch) == micro for batch in rows)
        seen += [i for batch in rows for i in batch if i is not None]
    assert len(seen) == len(set(seen)) == min(count, batches * ranks * micro)
    assert set(seen) <= set(range(count))


def test_padding_rows_carry_no_label() -> None:
    held = HeldOut.of_rows(torch.arange(12).view(3, 4), "x")
    rows, labels, real = held.batch([2, None])
    assert real == 1 and rows.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert labels.tolist() == [[8, 9, 10, 11], [-100] * 4]


def test_text_data_trains_on_the_blocks_before_the_holdout(tmp_path: Path) -> None:
    blocks = torch.arange(40 * 4).view(40, 4)

    class _Tokenizer:
        eos_token_id = None

    args = _args(tmp_path, "--eval-holdout", "0.1", "--micro-batch", "2", "--seq-len", "4")
    data_path = tmp_path / "d.txt"
    data_path.write_text("unused")
    args.data = data_path
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            job_data.transformers.AutoTokenizer, "from_pretrained", lambda _: _Tokenizer()
        )
        patch.setattr(job_data, "encode_texts", lambda *_: [])
        patch.setattr(job_data, "pack_tokens", lambda *_: blocks)
        data, tokens = job_data.load_token_data(args, 0, 2)
    assert tokens == 160 and data.blocks.tolist() == blocks[:36].tolist()
    assert data.held_out is not None and data.held_out.count == 4
    assert data.held_out.read([0, 3]).tolist() == blocks[[36, 39]].tolist()
    assert "the last 4 of 40 blocks of 4 tokens (10%), never trained on" in data.held_out.text


def test_token_shards_never_draw_a_held_out_sample(tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    folder.mkdir()
    np.arange(1001, dtype="<u2").tofile(folder / "shard_00000.bin")
    index = {"format": "trainwright-token-shards/1", "dtype": "uint16", "complete": True}
    shards = [{"name": "shard_00000.bin", "tokens": 1001}]
    (folder / "index.json").write_text(json.dumps(index | {"shards": shards, "vocab_size": 1001}))
    data = job_data.ShardData(folder, 10, 2, 0, 0, 2, 0.1)  # 100 samples, the last 10 held out
    assert data.samples == 90 and data.held_out is not None and data.held_out.count == 10
    assert data.info["data_samples_total"] == 100 and data.info["data_samples_held_out"] == 10
    for _ in range(3 * data.batches_per_epoch()):  # three epochs
        assert data.next()[:, 0].max() < 900  # a sample's first token is 10 x its id
    assert data.held_out.read([0])[0].tolist() == list(range(900, 911))


def _args(tmp_path: Path, *flags: str) -> argparse.Namespace:
    return train.parse_args(["--model-path", "m", "--metrics-dir", str(tmp_path), *flags])


def test_train_py_takes_cadence_and_holdout_and_defaults_the_holdout(tmp_path: Path) -> None:
    plain = _args(tmp_path)
    assert (plain.eval_every, plain.eval_holdout, plain.eval_batches) == (None, None, 20)
    both = _args(tmp_path, "--eval-every", "10", "--eval-holdout", "0.05")
    assert (both.eval_every, both.eval_holdout, both.eval_holdout_given) == (10, 0.05, True)
    cadence = _args(tmp_path, "--eval-every", "10")
    assert (cadence.eval_holdout, cadence.eval_holdout_given) == (0.01, False)
    end_only = _args(tmp_path, "--eval-holdout", "0.02")
    assert end_only.eval_every is None and end_only.eval_holdout == 0.02


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--eval-every", "0"], "--eval-every must be at least 1"),
        (["--eval-every", "-5"], "--eval-every must be at least 1"),
        (["--eval-holdout", "1"], "--eval-holdout is a fraction of the data"),
        (["--eval-holdout", "0"], "--eval-holdout is a fraction of the data"),
        (["--eval-every", "5", "--eval-batches", "0"], "--eval-batches must be at least 1"),
    ],
)
def test_bad_evaluation_flags_stop_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], line: str
) -> None:
    with pytest.raises(SystemExit) as caught:
        _args(tmp_path, *flags)
    assert caught.value.code == 2
    errors = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and line in errors[0], errors


class _Job:
    """A stand-in job: a row's loss is its first token's value; it records its modes."""

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.modes: list[bool] = []

    def set_training(self, on: bool) -> None:
        self.modes.append(on)

    def eval_loss(self, batch: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        assert not torch.is_grad_enabled()
        real = labels[:, 0] != -100
        return batch[real, 0].double().mean()  # HF's loss: the mean over labelled tokens


class _Log:
    def __init__(self) -> None:
        self.rows: list[tuple[dict[str, Any], str]] = []

    def record(self, row: dict[str, Any], text: str) -> None:
        self.rows.append((row, text))


def test_the_eval_loss_is_the_mean_over_held_out_rows_and_padding_counts_for_nothing(
    tmp_path: Path,
) -> None:
    args = _args(tmp_path, "--eval-every", "5", "--micro-batch", "2", "--steps", "12")
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).repeat_interleave(4).view(5, 4).long()
    evaluator = Evaluator(args, HeldOut.of_rows(values, "x"), 0, 1, 1)
    assert [s for s in range(1, 13) if evaluator.due(s)] == [5, 10, 12]
    job, log = _Job(), _Log()
    evaluator.run(job, 5, log)  # 3 micro-batches of 2: the last holds one padding row
    row, text = log.rows[0]
    assert job.modes == [False, True]
    assert row["eval_loss"] == pytest.approx(3.0) and row["eval_sequences"] == 5
    assert row["eval_tokens"] == 5 * 3 and row["eval_perplexity"] == pytest.approx(math.exp(3))
    assert text.startswith("eval step 5/12 loss 3.0000 perplexity 20.09 (5 held-out sequences")
    assert evaluator.rows == [row] and board_tag("eval_loss") == "eval/loss"
    assert board_tag("loss") == "train/loss"
