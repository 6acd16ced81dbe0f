"""Finder: input_ids, position_ids and attention_mask (names first, then structure)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, input_named, parts

from models import mlp_model
from specdec_compile.detect import detect
from specdec_compile.detect.integer_inputs import embedding_rows, find_integer_inputs, require_integer_input
from specdec_compile.errors import DetectionError, UnsupportedPatternError


def test_not_a_decoder():
    g = gs.import_onnx(mlp_model())
    with pytest.raises(DetectionError, match=r"not a decoder LM: no integer token-id input \(inputs: "):
        require_integer_input(g)
    with pytest.raises(DetectionError, match="not a decoder LM: no integer token-id input"):
        detect(g)


def test_finds_the_named_inputs(fixture_path):
    g = graph(fixture_path("llama_gqa"))
    _, hints, concats = parts(g)
    found = find_integer_inputs(g, hints, concats, vocab=211)
    assert (found.input_ids.name, found.position_ids.name, found.attention_mask.name) == \
        ("input_ids", "position_ids", "attention_mask")


def test_structure_decides_when_names_do_not(fixture_path):
    """Unknown names: the embedding says input_ids, the shape position_ids, the rest attention_mask."""
    g = graph(fixture_path("llama_gqa"))
    for old, new in (("input_ids", "a"), ("position_ids", "b"), ("attention_mask", "c")):
        input_named(g, old).name = new
    _, hints, concats = parts(g)
    found = find_integer_inputs(g, hints, concats, vocab=211)
    assert (found.input_ids.name, found.position_ids.name, found.attention_mask.name) == ("a", "b", "c")


def test_vocab_tells_the_token_embedding_from_the_position_embedding(fixture_path):
    """GPT-2 indexes two tables (wte: vocab rows, wpe: 512 positions): the logits' width decides."""
    g = graph(fixture_path("gpt2"))
    ids, pos = input_named(g, "input_ids"), input_named(g, "position_ids")
    ids.name, pos.name = "a", "b"
    assert (embedding_rows(ids), embedding_rows(pos)) == (211, 512)
    _, hints, concats = parts(g)
    found = find_integer_inputs(g, hints, concats, vocab=211)
    assert found.input_ids is ids and found.position_ids is pos
    with pytest.raises(DetectionError, match="cannot find the token-id input feeding the embedding"):
        find_integer_inputs(g, hints, concats, vocab=None)


def test_no_token_input_feeding_an_embedding(fixture_path):
    g = graph(fixture_path("llama_gqa"))
    g.inputs = [t for t in g.inputs if t.name != "input_ids"]
    _, hints, concats = parts(g)
    with pytest.raises(DetectionError, match=r"cannot find the token-id input feeding the embedding "
                                             r"\(integer inputs: attention_mask, position_ids\)"):
        find_integer_inputs(g, hints, concats, vocab=211)


def test_no_position_ids(fixture_path):
    g = graph(fixture_path("llama_gqa"))
    g.inputs = [t for t in g.inputs if t.name != "position_ids"]
    _, hints, concats = parts(g)
    found = find_integer_inputs(g, hints, concats, vocab=211)   # the positions finder takes it from here
    assert found.position_ids is None and found.attention_mask.name == "attention_mask"


def test_unexpected_inputs(fixture_path):
    g = graph(fixture_path("gpt2"))
    g.inputs.append(gs.Variable("temperature", np.float32, [1]))
    _, hints, concats = parts(g)
    with pytest.raises(UnsupportedPatternError, match="unexpected graph inputs: temperature"):
        find_integer_inputs(g, hints, concats, vocab=211)
