"""Detection: what is this model? Structural, on every exporter's graph."""
from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import pytest

from conftest import DECODERS
from models import mlp_model
from specdec_compile.detect import detect
from specdec_compile.errors import DetectionError, UnsupportedPatternError
from specdec_compile.graph_utils import name_unnamed_nodes


def _graph(path):
    g = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    name_unnamed_nodes(g)
    return g


@pytest.mark.parametrize("name", DECODERS)
def test_detects_layers_io_and_mask(fixture_path, name):
    det = detect(_graph(fixture_path(name)))
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


def test_codegen_mask_is_found_before_the_div(fixture_path):
    """CodeGen adds the mask *before* the Div that feeds Softmax."""
    g = _graph(fixture_path("codegen"))
    det = detect(g)
    site = next(n for n in g.nodes if n.name == det.mask_sites[0].node)
    consumer = site.outputs[0].outputs[0]
    assert site.op == "Add" and consumer.op == "Div" and consumer.outputs[0].outputs[0].op == "Softmax"


def test_detection_does_not_modify_graph(fixture_path):
    g = _graph(fixture_path("llama_gqa"))
    before = gs.export_onnx(g).SerializeToString()
    detect(g)
    assert gs.export_onnx(g).SerializeToString() == before


def test_not_a_decoder():
    g = gs.import_onnx(mlp_model())
    with pytest.raises(DetectionError, match="not a decoder LM: no integer token-id input"):
        detect(g)


def test_decoder_without_kv_cache(fixture_path):
    with pytest.raises(DetectionError, match="without a KV cache"):
        detect(_graph(fixture_path("llama_nocache")))


def test_unsupported_mask_pattern_names_the_node(fixture_path):
    """A multiplicative mask is a decoder LM we cannot rewrite: say which node."""
    g = _graph(fixture_path("llama_gqa"))
    det = detect(g)
    site = next(n for n in g.nodes if n.name == det.mask_sites[0].node)
    site.op = "Mul"
    with pytest.raises(UnsupportedPatternError, match=f"through Mul node '{site.name}'"):
        detect(g)


def test_cache_not_grown_by_concat(fixture_path):
    g = _graph(fixture_path("gpt2"))
    for n in g.nodes:
        if n.op == "Concat" and n.inputs[0].name.startswith("past_key_values"):
            n.op = "Sum"
    with pytest.raises(UnsupportedPatternError, match="not grown by a Concat"):
        detect(g)
