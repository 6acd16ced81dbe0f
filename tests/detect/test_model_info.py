"""Finder: ModelInfo (layers, KV heads, head_dim, vocabulary, dtype)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, input_named, parts

from specdec_compile.detect.attention import find_attention
from specdec_compile.detect.model_info import find_model_info
from specdec_compile.errors import UnsupportedPatternError


def _pieces(name, fixture_path):
    g = graph(fixture_path(name))
    nodes, hints, concats = parts(g)
    layers = find_attention(g, nodes, hints, concats, input_named(g, "attention_mask"))
    logits = next(t for t in g.outputs if t.name == "logits")
    return g, layers, logits, input_named(g, "input_ids")


@pytest.mark.parametrize("name,kv_heads", [("llama_gqa", 2), ("gpt2", 4)])
def test_facts(fixture_path, name, kv_heads):
    _, layers, logits, ids = _pieces(name, fixture_path)
    info = find_model_info(layers, logits, ids, family="llama", exporter="optimum 1")
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.vocab_size, info.dtype) == \
        (2, kv_heads, 16, 211, "float32")
    assert (info.family, info.exporter, info.num_heads) == ("llama", "optimum 1", None)


def test_vocab_from_the_embedding_when_the_logits_dim_is_symbolic(fixture_path):
    _, layers, logits, ids = _pieces("gpt2", fixture_path)
    logits.shape = ["batch_size", "sequence_length", "vocab"]
    assert find_model_info(layers, logits, ids).vocab_size == 211
    with pytest.raises(UnsupportedPatternError, match="logits output 'logits' has no static vocabulary dim"):
        find_model_info(layers, logits, gs.Variable("unused", np.int64, ["b", "s"]))


def test_heads_and_head_dim_must_be_static(fixture_path):
    _, layers, logits, ids = _pieces("gpt2", fixture_path)
    layers[0].key.inputs[0].shape = ["batch_size", "heads", "past_sequence_length", 16]
    with pytest.raises(UnsupportedPatternError, match=r"past input 'past_key_values.0.key' has shape .*; heads "
                                                      r"and head_dim must be static"):
        find_model_info(layers, logits, ids)


def test_every_past_input_alike(fixture_path):
    _, layers, logits, ids = _pieces("gpt2", fixture_path)
    layers[1].value.inputs[0].shape = ["batch_size", 4, "past_sequence_length", 8]
    with pytest.raises(UnsupportedPatternError, match=r"past input 'past_key_values.1.value' has shape .*, "
                                                      r"unlike 'past_key_values.0.value'"):
        find_model_info(layers, logits, ids)
