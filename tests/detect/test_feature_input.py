"""Finder: a feature draft's float input."""
from __future__ import annotations

from detect_helpers import graph, parts

from feature_draft_models import export_feature_draft
from specdec_compile.detect import detect
from specdec_compile.detect.feature_input import find_feature_input


def test_finds_the_feature_input_and_its_width():
    for n in (1, 2):
        g = graph(export_feature_draft(n))
        _, _, concats = parts(g)
        t = find_feature_input(g, concats)
        assert t is not None and t.name == "hidden_states" and t.shape[-1] == 64 * n
        det = detect(g)
        assert det.feature_input == "hidden_states" and det.feature_width == 64 * n
        # the draft's own layer output is found with the features as a source of the stream
        assert len(det.layer_outputs) == 1 and det.hidden_size == 64


def test_an_ordinary_decoder_has_none(fixture_path):
    g = graph(fixture_path("llama_gqa"))
    _, _, concats = parts(g)
    assert find_feature_input(g, concats) is None
    assert detect(g).feature_input is None
