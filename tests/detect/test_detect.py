"""detect(): the finders composed, on every exporter's graph."""
from __future__ import annotations

import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph

from conftest import DECODERS
from specdec_compile.detect import Detection, LayerKV, MaskSite, ModelInfo, detect


@pytest.mark.parametrize("name", DECODERS)
def test_detects_layers_io_and_mask(fixture_path, name):
    det = detect(graph(fixture_path(name)))
    info = det.info
    assert info.num_layers == 2 and info.head_dim == 16 and info.vocab_size == 211
    assert info.num_kv_heads == (2 if name.startswith("llama") else 4)
    assert info.dtype == "float32"
    assert (det.input_ids, det.position_ids, det.attention_mask, det.logits) == \
        ("input_ids", "position_ids", "attention_mask", "logits")
    # one key and one value cache per layer, in layer order, each with its present output
    keys = [layer.key_input for layer in det.layers]
    if name == "llama_dynamo":
        assert keys == ["past_k_0", "past_k_1"]
        assert [layer.key_outputs for layer in det.layers] == [("new_k_0",), ("new_k_1",)]
    else:
        assert keys == ["past_key_values.0.key", "past_key_values.1.key"]
        assert [layer.value_outputs for layer in det.layers] == [("present.0.value",), ("present.1.value",)]
    # the mask is found by dependence on attention_mask: one additive site per layer
    assert [(s.layer, s.kind) for s in det.mask_sites] == [(0, "additive"), (1, "additive")]


def test_detection_is_frozen_names_only(fixture_path):
    det = detect(graph(fixture_path("gpt2")))
    assert isinstance(det, Detection) and isinstance(det.info, ModelInfo)
    assert all(isinstance(x, LayerKV) for x in det.layers) and all(isinstance(s, MaskSite) for s in det.mask_sites)
    hash(det)  # frozen, made of names: hashable, survives graph copies
    assert det.info.family is None and detect(graph(fixture_path("gpt2")), family="gpt2",
                                              exporter="x 1").info.exporter == "x 1"


def test_detection_does_not_modify_graph(fixture_path):
    g = graph(fixture_path("llama_gqa"))
    before = gs.export_onnx(g).SerializeToString()
    detect(g)
    assert gs.export_onnx(g).SerializeToString() == before
