"""The pretraining data path's pure parts: how ranks slice the shards, the index, prepare_data.

token_shards.py (which samples each data rank's micro-batch holds, the shards as one stream,
the index) and prepare_data.py in process with one worker (chunks, tokens, resume). The real
processes (50 MB in 2 workers, a 2-rank job killed and resumed) are in
tests/smoke/test_pretrain_data.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import prepare_data
import pytest
import transformers
from token_shards import (
    INDEX,
    ShardError,
    TokenStream,
    epoch_order,
    is_shard_folder,
    micro_batch_samples,
    read_index,
    sample_count,
    token_dtype,
)
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

WORDS = [f"w{i}" for i in range(50)]


def test_ids_are_stored_in_16_bits_only_when_the_vocabulary_fits() -> None:
    assert token_dtype(300) == token_dtype(65_536) == "uint16"
    assert token_dtype(65_537) == token_dtype(128_256) == "uint32"


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4099])
def test_each_epoch_visits_every_sample_once_in_its_own_order(n: int) -> None:
    orders = [epoch_order(n, seed, epoch, list(range(n))) for seed in (0, 1234) for epoch in (0, 1)]
    assert all(sorted(order) == list(range(n)) for order in orders)
    if n > 2:
        assert orders[0] != orders[1] and orders[0] != orders[2]


def test_ranks_and_micro_batches_of_an_epoch_never_share_a_sample() -> None:
    samples, ranks, batch, seed = 103, 3, 4, 1234
    per_epoch = samples // (ranks * batch)  # 8 micro-batches per rank
    drawn = {
        (p, r): micro_batch_samples(p, r, ranks, batch, samples, seed)
        for p in range(per_epoch)
        for r in range(ranks)
    }
    flat = [i for ids in drawn.values() for i in ids]
    assert len(flat) == len(set(flat)) == per_epoch * ranks * batch
    assert all(0 <= i < samples for i in flat)
    # The position alone says what comes next: a resumed run draws the same samples.
    assert micro_batch_samples(5, 1, ranks, batch, samples, seed) == drawn[5, 1]
    # The next epoch deals every sample again, in another order.
    again = [
        micro_batch_samples(per_epoch + p, r, ranks, batch, samples, seed)
        for p in range(per_epoch)
        for r in range(ranks)
    ]
    assert sorted(i for ids in again for i in ids) != flat and len({*sum(again, [])}) == len(flat)
    with pytest.raises(ShardError, match="fewer than 4 per data-parallel rank"):
        micro_batch_samples(0, 0, ranks, batch, 11, seed)


def _write_shards(folder: Path, parts: list[list[int]], complete: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, ids in enumerate(parts):
        name = f"shard_{number:05d}.bin"
        np.asarray(ids, dtype="<u2").tofile(folder / name)
        shards.append({"name": name, "tokens": len(ids)})
    index = {"format": "trainwright-token-shards/1", "dtype": "uint16", "complete": complete}
    (folder / INDEX).write_text(json.dumps(index | {"shards": shards, "vocab_size": 100}))


def test_samples_are_seq_len_plus_one_tokens_read_across_shard_boundaries(tmp_path: Path) -> None:
    parts = [list(range(0, 10)), [], list(range(10, 13)), list(range(13, 40))]
    _write_shards(tmp_path, parts)
    stream = TokenStream(tmp_path, read_index(tmp_path))
    assert stream.tokens == 40 and sample_count(stream.tokens, 8) == 4
    got = stream.samples([0, 1, 3], 8)
    assert got.dtype == np.int64 and got.shape == (3, 9)
    assert got.tolist() == [list(range(0, 9)), list(range(8, 17)), list(range(24, 33))]


def test_an_unfinished_or_damaged_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    _write_shards(tmp_path / "half", [[1, 2, 3]], complete=False)
    assert is_shard_folder(tmp_path / "half") and not is_shard_folder(tmp_path)
    with pytest.raises(ShardError, match=r"has not finished \(1 of 1 shards\); run the same"):
        read_index(tmp_path / "half")
    _write_shards(tmp_path / "cut", [[1, 2, 3], [4, 5]])
    (tmp_path / "cut" / "shard_00001.bin").write_bytes(b"\0")
    with pytest.raises(ShardError, match="shard_00001.bin: 1 bytes, not the 4 its index lists"):
        read_index(tmp_path / "cut")


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer of WORDS (ids 3...), built here: nothing is downloaded."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator([" ".join(WORDS)], trainer)
    folder = tmp_path_factory.mktemp("tokenizer")
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder


def _corpus(root: Path) -> tuple[Path, list[list[str]]]:
    """A .txt file (one document) and a .jsonl (a document a line); the documents' words."""
    rng = np.random.default_rng(0)
    docs = [[WORDS[i] for i in rng.integers(0, len(WORDS), size=40)] for _ in range(30)]
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n".join(" ".join(d) for d in docs[:10]) + "\n")
    with open(corpus / "b.jsonl", "w") as fh:
        fh.writelines(json.dumps({"text": " ".join(d)}) + "\n" for d in docs[10:])
    return corpus, docs


def _prepare(corpus: Path, out: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv = [str(corpus), "--out", str(out), "--tokenizer", str(tokenizer), "--workers", "1"]
    assert prepare_data.main([*argv, "--chunk-mb", "0.001"]) == 0  # 1 KiB chunks: 8 shards
    return capsys.readouterr().out


@pytest.fixture()
def prepared(tmp_path: Path, word_tokenizer: Path) -> tuple[Path, Path, list[list[str]]]:
    """The corpus, tokenized into 1 KiB-chunk shards (in set-up: the tokenizer loads slowly)."""
    corpus, docs = _corpus(tmp_path)
    argv = [str(corpus), "--out", str(tmp_path / "tokens"), "--tokenizer", str(word_tokenizer)]
    assert prepare_data.main([*argv, "--workers", "1", "--chunk-mb", "0.001"]) == 0
    return corpus, tmp_path / "tokens", docs


def test_prepare_data_writes_every_document_then_its_eos(
    prepared: tuple[Path, Path, list[list[str]]], word_tokenizer: Path
) -> None:
    _, out, docs = prepared
    index = read_index(out)
    ids = TokenStream(out, index).window(0, index["tokens"]).tolist()
    vocab = json.loads((word_tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    # The .txt file is one document (its EOS at its end only); each JSON line is one.
    txt = [vocab[w] for d in docs[:10] for w in d] + [2]
    jsonl = [t for d in docs[10:] for t in [*(vocab[w] for w in d), 2]]
    assert ids == txt + jsonl
    assert index["dtype"] == "uint16" and index["eos_id"] == 2 and len(index["shards"]) > 2
    assert index["vocab_size"] == len(WORDS) + 3 and index["tokenizer"] == str(word_tokenizer)


def test_prepare_data_again_redoes_only_shards_not_complete(
    prepared: tuple[Path, Path, list[list[str]]],
    word_tokenizer: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus, out, _ = prepared
    capsys.readouterr()
    index = read_index(out)
    ids = TokenStream(out, index).window(0, index["tokens"]).tolist()
    # A shard cut short and one whose file is gone are redone; the others are skipped.
    (out / "shard_00001.bin").write_bytes(b"\1")
    (out / "shard_00002.bin").unlink()
    shards = len(index["shards"])
    assert f"{shards} shard(s), {shards - 2} already done" in _prepare(
        corpus, out, word_tokenizer, capsys
    )
    assert TokenStream(out, read_index(out)).window(0, index["tokens"]).tolist() == ids


def test_prepare_data_refuses_a_folder_of_another_corpus(
    prepared: tuple[Path, Path, list[list[str]]],
    word_tokenizer: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus, out, _ = prepared
    capsys.readouterr()
    (corpus / "a.txt").write_text("w1 w2\n")
    argv = [str(corpus), "--out", str(out), "--tokenizer", str(word_tokenizer)]
    assert prepare_data.main([*argv, "--workers", "1", "--chunk-mb", "0.001"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "holds shards of other inputs or settings" in err[0], err


def test_chunks_end_at_line_ends_and_cover_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"".join(b'{"text": "%s"}\n' % (b"y" * (i % 37)) for i in range(300)))
    ranges = prepare_data.chunk_ranges(path, 500)
    data = path.read_bytes()
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert all(data[end - 1 : end] == b"\n" for _, end in ranges)


def test_bad_input_is_one_line_naming_the_file(
    tmp_path: Path, word_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "w1"}\n{"body": "w2"}\n')
    argv = ["--out", str(tmp_path / "o"), "--tokenizer", str(word_tokenizer), "--workers", "1"]
    assert prepare_data.main([str(bad), *argv]) == 2
    assert capsys.readouterr().err == (
        f"prepare_data.py: error: {bad} (line 2 of the chunk at byte 0): no string field 'text'; "
        "set --text-field\n"
    )
    assert prepare_data.main([str(tmp_path / "none.txt"), *argv]) == 2
    assert capsys.readouterr().err.endswith("none.txt: no such file or folder\n")
