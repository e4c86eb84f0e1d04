"""What tf_train.py trains: synthetic learnable data and small Keras models of two kinds.

``image``: a small CNN classifies images whose class is one of four fixed textures (stripes,
checks) under Gaussian noise. ``text``: a small causal transformer (embedding, MultiHeadAttention
blocks) predicts the next token of sequences that repeat one of a few short token patterns.
Both start at a loss near ln(classes) and fall within a few dozen steps.
"""

from __future__ import annotations

import math

import tensorflow as tf

# Images: square, one channel, one fixed template per class, then Gaussian noise.
_IMAGE_SIZE = 16
_IMAGE_CLASSES = 4
_IMAGE_NOISE = 1.0
# Text: a small alphabet and a few patterns of 3-6 tokens (train.py's task).
_VOCAB = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
SEQ_LEN = 32
_D_MODEL = 64
_HEADS = 4


class ImageData:
    """Endless batches of (image, label): the label's texture plus noise."""

    def __init__(self, batch: int, seed: int, rank: int) -> None:
        # The templates are fixed local textures a small convolution can detect anywhere;
        # the draws (labels, noise) differ per worker.
        self.templates = class_templates()
        self.batch = batch
        self.seed = seed * 1000 + 17 + rank
        self.position = 0

    def next(self) -> tuple[tf.Tensor, tf.Tensor]:
        """One ``[batch, H, W, 1]`` float batch and its ``[batch]`` int labels."""
        self.position += 1
        seed = [self.seed, self.position]
        labels = tf.random.stateless_uniform(
            [self.batch], seed=seed, maxval=_IMAGE_CLASSES, dtype=tf.int32
        )
        noise = tf.random.stateless_normal(
            [self.batch, _IMAGE_SIZE, _IMAGE_SIZE, 1], seed=[seed[0], seed[1] + (1 << 20)]
        )
        return tf.gather(self.templates, labels) + _IMAGE_NOISE * noise, labels


def class_templates() -> tf.Tensor:
    """One ``[H, W, 1]`` texture per class: horizontal, vertical and diagonal stripes, checks."""
    rows = tf.range(_IMAGE_SIZE, dtype=tf.float32)[:, None] * tf.ones([1, _IMAGE_SIZE])
    cols = tf.transpose(rows)
    textures = [
        tf.math.cos(math.pi * rows),
        tf.math.cos(math.pi * cols),
        tf.math.cos(math.pi * (rows + cols) / 2),
        tf.math.cos(math.pi * rows) * tf.math.cos(math.pi * cols / 2),
    ]
    return tf.stack(textures[:_IMAGE_CLASSES])[..., None]


class PatternData:
    """Endless batches of (tokens, next tokens) from sequences repeating a short pattern."""

    def __init__(self, batch: int, seed: int, rank: int) -> None:
        lengths = tf.random.stateless_uniform(
            [_NUM_PATTERNS],
            seed=[seed, 1],
            minval=_PATTERN_LEN[0],
            maxval=_PATTERN_LEN[1] + 1,
            dtype=tf.int32,
        )
        tokens = tf.random.stateless_uniform(
            [_NUM_PATTERNS, _PATTERN_LEN[1]], seed=[seed, 2], maxval=_VOCAB, dtype=tf.int32
        )
        # Each pattern written out to a full sequence (plus one token for the shifted target).
        steps = tf.range(SEQ_LEN + _PATTERN_LEN[1] + 1)
        index = steps[None, :] % lengths[:, None]
        self.rows = tf.gather(tokens, index, batch_dims=1)
        self.batch = batch
        self.seed = seed * 1000 + 17 + rank
        self.position = 0

    def next(self) -> tuple[tf.Tensor, tf.Tensor]:
        """One ``[batch, seq_len]`` int batch and its targets, the same shifted by one token."""
        self.position += 1
        seed = [self.seed, self.position]
        which = tf.random.stateless_uniform(
            [self.batch], seed=seed, maxval=_NUM_PATTERNS, dtype=tf.int32
        )
        offsets = tf.random.stateless_uniform(
            [self.batch, 1],
            seed=[seed[0], seed[1] + (1 << 20)],
            maxval=_PATTERN_LEN[1],
            dtype=tf.int32,
        )
        columns = offsets + tf.range(SEQ_LEN + 1)[None, :]
        seqs = tf.gather(tf.gather(self.rows, which), columns, batch_dims=1)
        return seqs[:, :-1], seqs[:, 1:]


class ImageModel(tf.keras.Model):
    """A small CNN: two conv blocks, global pooling, a linear classifier.

    Swish and average pooling rather than ReLU and max pooling: TensorFlow's ReLU and max
    kernels turn NaN into 0, so a NaN input would end as a silently flat loss, not a NaN one.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = tf.keras.layers.Conv2D(16, 3, padding="same", activation="swish")
        self.pool = tf.keras.layers.AveragePooling2D(2)
        self.conv2 = tf.keras.layers.Conv2D(32, 3, padding="same", activation="swish")
        self.gap = tf.keras.layers.GlobalAveragePooling2D()
        self.head = tf.keras.layers.Dense(_IMAGE_CLASSES)

    def call(self, images: tf.Tensor, poison: tf.Tensor | None = None) -> tf.Tensor:
        """Class logits; ``poison`` (a scalar) multiplies the pixels first."""
        x = images if poison is None else images * poison
        return self.head(self.gap(self.conv2(self.pool(self.conv1(x)))))


class Block(tf.keras.layers.Layer):
    """One pre-norm transformer block: causal self-attention, then a feed-forward layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = tf.keras.layers.LayerNormalization()
        self.attn = tf.keras.layers.MultiHeadAttention(_HEADS, _D_MODEL // _HEADS)
        self.norm2 = tf.keras.layers.LayerNormalization()
        self.ff1 = tf.keras.layers.Dense(4 * _D_MODEL, activation="gelu")
        self.ff2 = tf.keras.layers.Dense(_D_MODEL)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        """``x`` plus attention, plus feed-forward."""
        h = self.norm1(x)
        x = x + self.attn(h, h, use_causal_mask=True)
        return x + self.ff2(self.ff1(self.norm2(x)))


class TextModel(tf.keras.Model):
    """A small causal transformer LM: token and position embeddings, blocks, an output head."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = tf.keras.layers.Embedding(_VOCAB, _D_MODEL)
        self.position = tf.keras.layers.Embedding(SEQ_LEN, _D_MODEL)
        self.blocks = [Block() for _ in range(layers)]
        self.norm = tf.keras.layers.LayerNormalization()
        self.head = tf.keras.layers.Dense(_VOCAB)

    def call(self, tokens: tf.Tensor, poison: tf.Tensor | None = None) -> tf.Tensor:
        """Next-token logits; ``poison`` (a scalar) multiplies the token embeddings first."""
        x = self.embed(tokens)
        if poison is not None:
            x = x * poison
        x = x + self.position(tf.range(tf.shape(tokens)[1]))[None, :, :]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
