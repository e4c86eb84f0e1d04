"""The pretraining data path for real: prepare_data.py on 50 MB, and a 2-rank job on its shards.

prepare_data.py tokenizes a generated 50 MB corpus (random words; a word-level tokenizer
trained here, nothing downloaded) in 2 worker processes, and the same command again skips every
shard. A pretraining plan's launch.sh then trains a tiny Llama from scratch on 2 CPU ranks
(torchrun, gloo) on shards of the job tests' dataset: each rank reads only its own samples (its
metrics list them), and after SIGKILL and a rerun the job resumes at the data position of its
checkpoint, drawing the samples the killed run would have drawn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import train as job
import transformers
from test_train_job import (
    DDP,
    LR,
    MICRO,
    RANKS,
    SAVE_EVERY,
    STEPS,
    _assert_continues,
    _emit,
    _kill_and_resume,
)
from token_shards import micro_batch_samples, read_index
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from train_fixture import save_model, write_dataset

from tools.smoke.standalone import SCRIPTS_DIR

pytestmark = pytest.mark.slow

PREPARE = SCRIPTS_DIR / "prepare_data.py"
CORPUS_BYTES = 50 * 2**20
_TIMEOUT_S = 300


def _prepare(*argv: str) -> subprocess.CompletedProcess[str]:
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(PREPARE), *argv],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        env={**os.environ, **offline},
    )


def _corpus(root: Path) -> tuple[Path, Path, int]:
    """About 50 MB of random words in .txt files and a .jsonl; a word tokenizer; its token count.

    Each word is one token; each .txt file and each JSON line is a document with an EOS.
    """
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(5000)])
    corpus = root / "corpus"
    corpus.mkdir()
    # One block of random lines (about 1.3 MB), written as each file: tokenizing is the cost here.
    lines = [" ".join(words[row]) for row in rng.integers(0, len(words), size=(4000, 50))]
    txt = "\n".join(lines) + "\n"
    jsonl = "".join(json.dumps({"text": line}) + "\n" for line in lines)
    expected, written, number = 0, 0, 0
    while written < CORPUS_BYTES:
        is_jsonl = number % 4 == 3
        text = jsonl if is_jsonl else txt
        (corpus / f"part{number:02d}.{'jsonl' if is_jsonl else 'txt'}").write_text(text)
        expected += len(lines) * 50 + (len(lines) if is_jsonl else 1)
        written, number = written + len(text), number + 1
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([" ".join(words)], trainer)
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(root / "tokenizer")
    return corpus, root / "tokenizer", expected


def test_prepare_data_tokenizes_50_mb_in_parallel_and_a_rerun_skips_it(tmp_path: Path) -> None:
    corpus, tokenizer, expected = _corpus(tmp_path)
    assert sum(p.stat().st_size for p in corpus.iterdir()) >= CORPUS_BYTES
    out = tmp_path / "tokens"
    argv = [str(corpus), "--out", str(out), "--tokenizer", str(tokenizer), "--workers", "2"]
    first = _prepare(*argv, "--chunk-mb", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    index = read_index(out)
    assert index["tokens"] == expected and index["dtype"] == "uint16"
    assert len(index["shards"]) >= 12 and index["vocab_size"] == 5003
    assert sum((out / s["name"]).stat().st_size for s in index["shards"]) == 2 * expected
    print(first.stdout.strip().splitlines()[-1])
    again = _prepare(*argv, "--chunk-mb", "4")
    assert again.returncode == 0, again.stderr[-3000:]
    shards = len(index["shards"])
    assert f"{shards} shard(s), {shards} already done" in again.stdout, again.stdout


def test_two_ranks_read_disjoint_slices_and_resume_at_the_position_after_sigkill(
    tmp_path: Path,
) -> None:
    model_dir = save_model(tmp_path / "model")
    text = write_dataset(tmp_path / "train.jsonl")
    shards = tmp_path / "tokens"
    # 2 KiB chunks: several shards, so samples straddle shard boundaries.
    made = _prepare(
        str(text), "--out", str(shards), "--tokenizer", str(model_dir), "--chunk-mb", "0.002"
    )
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "pretrain"
    _emit(out, model_dir, DDP, "pretrain")
    launch = (out / "launch.sh").read_text()
    assert "python trainer/prepare_data.py YOUR_CORPUS --out data/tokens --tokenizer" in launch
    assert (out / "trainer" / "prepare_data.py").is_file()
    before, after, start, rank0 = _kill_and_resume(out, shards, ["--lr", str(LR)])
    _assert_continues(before, after, start)
    ranks = [rank0, json.loads((out / "metrics" / "rank1.json").read_text())]
    total = ranks[0]["data_samples_total"]
    assert total == (read_index(shards)["tokens"] - 1) // 32
    # The resumed run started at the checkpoint's position (step 3: 3 micro-batches a rank) and
    # each rank drew exactly its own slice from there: no sample on both ranks.
    assert [m["data_start_position"] for m in ranks] == [SAVE_EVERY, SAVE_EVERY]
    for rank, metrics in enumerate(ranks):
        planned = [
            i
            for position in range(SAVE_EVERY, STEPS)
            for i in micro_batch_samples(position, rank, RANKS, MICRO, total, job.SEED)
        ]
        assert metrics["data_samples"] == planned, rank
    assert not set(ranks[0]["data_samples"]) & set(ranks[1]["data_samples"])
    assert rank0["data_format"] == "token-shards" and rank0["data"] == str(shards)
