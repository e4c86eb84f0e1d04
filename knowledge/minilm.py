"""all-MiniLM-L6-v2 sentence embeddings in plain torch, from the packaged model files.

The model is a 6-layer BERT encoder (384 hidden, 12 heads) followed by mean pooling over the
tokens and L2 normalisation: the three modules its ``modules.json`` lists for
sentence-transformers (Transformer, Pooling with ``pooling_mode_mean_tokens``, Normalize).
Running that forward pass here needs only torch, the ``tokenizers`` library and
``safetensors``. Importing sentence-transformers, and through it the transformers modeling
code, costs about 3.5 s on a 2-core machine before the first query (measured for
bench/results/2026-11-30-suite-full.md); this module costs none of that.
``tests/e2e/test_knowledge.py`` checks the embeddings against sentence-transformers' own to
1e-5.

The layer maths follows transformers' ``BertModel`` (``modeling_bert.py``): post-layer-norm
residual blocks, exact (erf) GELU, absolute position embeddings, token type 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MiniLM:
    """A loaded all-MiniLM-L6-v2: ``encode(texts)`` gives unit-length 384-dim vectors."""

    def __init__(self, path: Path, device: str = "cpu") -> None:
        """Load the tokenizer, the config and the weights from the model folder ``path``."""
        from safetensors.torch import load_file
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
        self.w: dict[str, Any] = load_file(str(path / "model.safetensors"), device=device)

    def _linear(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self.w[name + ".weight"], self.w[name + ".bias"])

    def _norm(self, x: Any, name: str) -> Any:
        import torch.nn.functional as F

        return F.layer_norm(
            x, (self.hidden,), self.w[name + ".weight"], self.w[name + ".bias"], self.eps
        )

    def _forward(self, ids: Any, mask: Any) -> Any:
        import torch
        import torch.nn.functional as F

        batch, seq = ids.shape
        positions = torch.arange(seq, device=ids.device)
        x = (
            self.w["embeddings.word_embeddings.weight"][ids]
            + self.w["embeddings.position_embeddings.weight"][positions]
            + self.w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        head_dim = self.hidden // self.heads
        keep = mask.bool()[:, None, None, :]  # attend to real tokens only

        def split(t: Any) -> Any:
            return t.view(batch, seq, self.heads, head_dim).transpose(1, 2)

        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = split(self._linear(x, p + "attention.self.query"))
            k = split(self._linear(x, p + "attention.self.key"))
            v = split(self._linear(x, p + "attention.self.value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            a = a.transpose(1, 2).reshape(batch, seq, self.hidden)
            x = self._norm(
                self._linear(a, p + "attention.output.dense") + x, p + "attention.output.LayerNorm"
            )
            h = F.gelu(self._linear(x, p + "intermediate.dense"))
            x = self._norm(self._linear(h, p + "output.dense") + x, p + "output.LayerNorm")
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    def truncated(self, text: str) -> bool:
        """Whether ``text`` is longer than the model reads (max_seq_length tokens)."""
        return bool(self.tokenizer.encode(text).overflowing)

    def encode(self, texts: list[str], batch_size: int = 32) -> Any:
        """Embed ``texts``: a float32 numpy array of shape (len(texts), 384), rows of norm 1.

        Texts are batched longest first, as sentence-transformers does, so padding is small.
        """
        import numpy as np
        import torch

        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                longest = max(len(encodings[i].ids) for i in rows)
                ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(rows), longest), dtype=torch.long)
                for r, i in enumerate(rows):
                    n = len(encodings[i].ids)
                    ids[r, :n] = torch.tensor(encodings[i].ids, dtype=torch.long)
                    mask[r, :n] = 1
                vectors = self._forward(ids.to(self.device), mask.to(self.device))
                out[rows] = vectors.float().cpu().numpy()
        return out
