"""all-MiniLM-L6-v2 sentence embeddings in numpy, from the packaged model files.

The model is a 6-layer BERT encoder (384 hidden, 12 heads) followed by mean pooling over the
tokens and L2 normalisation: the three modules its ``modules.json`` lists for
sentence-transformers (Transformer, Pooling with ``pooling_mode_mean_tokens``, Normalize).
Running that forward pass here needs only numpy and the ``tokenizers`` library: the weights
are read from ``model.safetensors`` by its header (a JSON table of dtype, shape and byte
offsets) into memory-mapped arrays, so a query reads only the embedding rows of its tokens.
Importing sentence-transformers costs about 3.5 s on a 2-core machine before the first query
(bench/results/2026-11-30-suite-full.md), torch alone about 0.8 s of CPU; this module costs
neither. ``tests/e2e/test_knowledge.py`` checks the embeddings against sentence-transformers'
own to 1e-5.

The layer maths follows transformers' ``BertModel`` (``modeling_bert.py``): post-layer-norm
residual blocks, exact (erf) GELU, absolute position embeddings, token type 0, attention
softmax over the real tokens only; all in float32, as the model was run there.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# safetensors dtype names -> numpy dtype strings (little-endian, as the format stores them).
_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


def load_safetensors(path: Path) -> dict[str, Any]:
    """Every tensor of a ``.safetensors`` file as a read-only memory-mapped numpy array.

    The format: 8 bytes little-endian header length, a JSON header naming each tensor's
    ``dtype``, ``shape`` and ``data_offsets`` (relative to the end of the header), then the
    data. A dtype numpy has no type for (bf16) raises ValueError.
    """
    import numpy as np

    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    tensors: dict[str, Any] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: {name} is {spec['dtype']}, which this loader does not read")
        start, end = spec["data_offsets"]
        tensors[name] = data[start:end].view(_DTYPES[spec["dtype"]]).reshape(spec["shape"])
    return tensors


# Abramowitz and Stegun 7.1.26: erf(z) = 1 - (a1 t + ... + a5 t^5) exp(-z^2), t = 1/(1 + p z).
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: Any) -> Any:
    """The error function, elementwise (Abramowitz and Stegun 7.1.26), without scipy.

    In ``x``'s dtype: 1.5e-7 absolute from the approximation; in float32, with rounding, under
    1e-6 (tested against ``math.erf``), well inside the 1e-5 the embeddings are held to.
    """
    import numpy as np

    z = np.abs(x)
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = t * _A[4]
    for a in (_A[3], _A[2], _A[1], _A[0]):
        poly += a
        poly *= t
    return np.copysign(1 - poly * np.exp(-z * z), x)


class MiniLM:
    """A loaded all-MiniLM-L6-v2: ``encode(texts)`` gives unit-length 384-dim vectors."""

    def __init__(self, path: Path, device: str = "cpu") -> None:
        """Load the tokenizer, the config and the weights from the model folder ``path``.

        ``device`` is kept for the embedding function's config; numpy runs on the CPU.
        """
        from tokenizers import Tokenizer

        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{path} is not the BERT encoder this module runs")
        pooling = json.loads((path / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"{path}: only mean pooling is implemented")
        st_config = json.loads((path / "sentence_bert_config.json").read_text(encoding="utf-8"))
        self.max_len = int(st_config["max_seq_length"])
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config["layer_norm_eps"])
        self.device = device
        # tokenizer.json carries a fixed 128-token padding and truncation; sentence-transformers
        # overrides both at call time (truncate at max_seq_length, pad to the longest text).
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_len)
        self.pad_id = int(config.get("pad_token_id", 0))
        self.w: dict[str, Any] = load_safetensors(path / "model.safetensors")

    def _linear(self, x: Any, name: str) -> Any:
        # One matrix product over every token of the batch (numpy loops over a 3-D stack).
        w = self.w[name + ".weight"]
        out = x.reshape(-1, x.shape[-1]) @ w.T
        out += self.w[name + ".bias"]
        return out.reshape(*x.shape[:-1], w.shape[0])

    def _norm(self, x: Any, name: str) -> Any:
        import numpy as np

        mean = x.mean(-1, keepdims=True)
        var = np.square(x - mean).mean(-1, keepdims=True)
        scaled = (x - mean) / np.sqrt(var + np.float32(self.eps))
        return scaled * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _forward(self, ids: Any, mask: Any) -> Any:
        """Unit-length pooled embeddings (batch, hidden) of token ``ids`` under ``mask`` (0/1)."""
        import numpy as np

        batch, seq = ids.shape
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][:seq]
            + self.w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        head_dim = self.hidden // self.heads
        scale = np.float32(1.0 / np.sqrt(head_dim))
        # Attend to real tokens only: padded keys get -inf before the softmax.
        blocked = np.where(mask[:, None, None, :] > 0, np.float32(0.0), np.float32(-np.inf))

        def split(t: Any) -> Any:
            # (batch * heads, seq, head_dim), contiguous, for one BLAS product per head.
            heads = t.reshape(batch, seq, self.heads, head_dim).transpose(0, 2, 1, 3)
            return np.ascontiguousarray(heads).reshape(batch * self.heads, seq, head_dim)

        blocked = np.repeat(blocked, self.heads, axis=0)  # (batch * heads, 1, 1, seq)
        scores = np.empty((batch * self.heads, seq, seq), dtype=np.float32)
        a = np.empty((batch * self.heads, seq, head_dim), dtype=np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = split(self._linear(x, p + "attention.self.query"))
            k = split(self._linear(x, p + "attention.self.key"))
            v = split(self._linear(x, p + "attention.self.value"))
            # numpy's stacked matmul does not call BLAS per matrix; a loop over heads does.
            for j in range(batch * self.heads):
                np.matmul(q[j], k[j].T, out=scores[j])
            scores *= scale
            scores += blocked[:, 0]
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            for j in range(batch * self.heads):
                np.matmul(scores[j], v[j], out=a[j])
            merged = a.reshape(batch, self.heads, seq, head_dim).transpose(0, 2, 1, 3)
            x = self._norm(
                self._linear(merged.reshape(batch, seq, self.hidden), p + "attention.output.dense")
                + x,
                p + "attention.output.LayerNorm",
            )
            h = self._linear(x, p + "intermediate.dense")
            h = h * np.float32(0.5) * (np.float32(1.0) + erf(h * np.float32(np.sqrt(0.5))))
            x = self._norm(self._linear(h, p + "output.dense") + x, p + "output.LayerNorm")
        weights = mask[:, :, None].astype(np.float32)
        pooled = (x * weights).sum(1) / np.maximum(weights.sum(1), np.float32(1e-9))
        norms = np.sqrt(np.square(pooled).sum(1, keepdims=True))
        return pooled / np.maximum(norms, np.float32(1e-12))

    def truncated(self, text: str) -> bool:
        """Whether ``text`` is longer than the model reads (max_seq_length tokens)."""
        return bool(self.tokenizer.encode(text).overflowing)

    def encode(self, texts: list[str], batch_size: int = 32) -> Any:
        """Embed ``texts``: a float32 numpy array of shape (len(texts), 384), rows of norm 1.

        Texts are batched longest first, as sentence-transformers does, so padding is small.
        """
        import numpy as np

        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            longest = max(len(encodings[i].ids) for i in rows)
            ids = np.full((len(rows), longest), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), longest), dtype=np.int64)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1
            out[rows] = self._forward(ids, mask)
        return out
