"""Finder: the logits output."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, parts

from conftest import DECODERS
from specdec_compile.detect.logits import find_logits, vocab_dim
from specdec_compile.errors import DetectionError


@pytest.mark.parametrize("name", DECODERS)
def test_finds_the_logits(fixture_path, name):
    g = graph(fixture_path(name))
    _, hints, concats = parts(g)
    logits = find_logits(g, concats, hints)
    assert logits.name == "logits" and vocab_dim(logits) == 211


def _extra_rank3_output(g, name):
    """A second rank-3 float output (say, hidden states) next to the logits."""
    src = g.outputs[0]
    extra = gs.Variable(name, dtype=np.float32, shape=list(src.shape))
    g.nodes.append(gs.Node("Neg", inputs=[src], outputs=[extra]))
    g.outputs.append(extra)


def test_names_break_a_tie(fixture_path):
    g = graph(fixture_path("gpt2"))
    assert g.outputs[0].name == "logits"
    _extra_rank3_output(g, "hidden_states")
    _, hints, concats = parts(g)
    assert find_logits(g, concats, hints).name == "logits"


def test_two_candidates_without_a_known_name(fixture_path):
    g = graph(fixture_path("gpt2"))
    _extra_rank3_output(g, "hidden_states")
    next(t for t in g.outputs if t.name == "logits").name = "scores"
    _, hints, concats = parts(g)
    with pytest.raises(DetectionError, match=r"expected one rank-3 float logits output, found 2 \(outputs: "
                                             r"scores, present"):
        find_logits(g, concats, hints)


def test_no_logits_output(fixture_path):
    g = graph(fixture_path("gpt2"))
    g.outputs = [t for t in g.outputs if t.name != "logits"]
    _, hints, concats = parts(g)
    with pytest.raises(DetectionError, match="not a decoder LM: expected one rank-3 float logits output, found 0"):
        find_logits(g, concats, hints)


def test_vocab_dim_is_the_stated_last_dim():
    assert vocab_dim(gs.Variable("l", np.float32, ["b", "s", "vocab"])) == "vocab"
    assert vocab_dim(gs.Variable("l", np.float32, None)) is None
