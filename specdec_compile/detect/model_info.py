"""Finder: the model facts (``ModelInfo``): layers, KV heads and head_dim (from
the past inputs, which must be static and alike: every key alike, every value
alike; values may have their own head dim, as in latent attention), vocabulary
(the logits' last dim, else the embedding table's rows) and dtype."""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ._records import ModelInfo
from ._tensors import dtype_of
from .attention import Attention
from .integer_inputs import embedding_rows
from .logits import vocab_dim


def _kv_shape(layers: list[Attention], kind: str) -> list:
    past0 = getattr(layers[0], kind).inputs[0]
    shape = past0.shape
    if shape is None or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise UnsupportedPatternError(
            f"past input {past0.name!r} has shape {shape}; heads and head_dim must be static")
    for layer in layers:
        c = getattr(layer, kind)
        s = c.inputs[0].shape
        if s is None or s[1] != shape[1] or s[3] != shape[3]:
            raise UnsupportedPatternError(
                f"past input {c.inputs[0].name!r} has shape {s}, unlike {past0.name!r} {shape}")
    return shape


def find_model_info(layers: list[Attention], logits: gs.Tensor, input_ids: gs.Tensor,
                    family: str | None = None, exporter: str | None = None) -> ModelInfo:
    shape = _kv_shape(layers, "key")
    vshape = _kv_shape(layers, "value")
    if vshape[1] != shape[1]:
        raise UnsupportedPatternError(f"past values have {vshape[1]} heads, past keys {shape[1]}")
    vocab = vocab_dim(logits)
    if not isinstance(vocab, int):
        vocab = embedding_rows(input_ids)
    if not isinstance(vocab, int):
        raise UnsupportedPatternError(f"logits output {logits.name!r} has no static vocabulary dim")
    past0 = layers[0].key.inputs[0]
    for what, n in (("KV heads", shape[1]), ("key head_dim", shape[3]), ("value head_dim", vshape[3])):
        if int(n) < 1:
            raise UnsupportedPatternError(f"past input {past0.name!r} has shape {shape}: {n} {what}, "
                                          f"expected at least 1")
    if vocab < 1:
        raise UnsupportedPatternError(f"logits output {logits.name!r} has a vocabulary of {vocab} tokens")
    rows = embedding_rows(input_ids)
    if isinstance(rows, int) and rows < vocab:
        raise UnsupportedPatternError(f"the embedding table has {rows} rows, fewer than the vocabulary of {vocab} "
                                      f"tokens: a token id from {rows} on would index past it")
    return ModelInfo(num_layers=len(layers), num_kv_heads=int(shape[1]), head_dim=int(shape[3]),
                     vocab_size=int(vocab), dtype=dtype_of(past0).name, family=family, exporter=exporter,
                     value_head_dim=int(vshape[3]) if vshape[3] != shape[3] else None)
