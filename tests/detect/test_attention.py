"""Finder: attention layers (key/value Concats, Softmax) and their mask sites."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, input_named, parts

from conftest import DECODERS
from specdec_compile.detect import detect
from specdec_compile.detect.attention import find_attention, mask_kind, probs_matmul
from specdec_compile.errors import UnsupportedPatternError


def _attention(g, amask="attention_mask"):
    nodes, hints, concats = parts(g)
    return find_attention(g, nodes, hints, concats, input_named(g, amask) if amask else None)


@pytest.mark.parametrize("name", DECODERS)
def test_one_layer_per_key_value_pair_in_graph_order(fixture_path, name):
    g = graph(fixture_path(name))
    layers = _attention(g)
    assert len(layers) == 2
    keys = [a.key.inputs[0].name for a in layers]
    values = [a.value.inputs[0].name for a in layers]
    if name == "llama_dynamo":
        assert (keys, values) == (["past_k_0", "past_k_1"], ["past_v_0", "past_v_1"])
    else:
        assert keys == ["past_key_values.0.key", "past_key_values.1.key"]
        assert values == ["past_key_values.0.value", "past_key_values.1.value"]
    assert all(a.softmax.op == "Softmax" for a in layers)
    assert [[kind for _, _, kind in a.sites] for a in layers] == [["additive"], ["additive"]]


def test_codegen_mask_is_found_before_the_div(fixture_path):
    """CodeGen adds the mask *before* the Div that feeds Softmax."""
    g = graph(fixture_path("codegen"))
    det = detect(g)
    site = next(n for n in g.nodes if n.name == det.mask_sites[0].node)
    consumer = site.outputs[0].outputs[0]
    assert site.op == "Add" and consumer.op == "Div" and consumer.outputs[0].outputs[0].op == "Softmax"


def test_unsupported_mask_pattern_names_the_node(fixture_path):
    """A multiplicative mask is a decoder LM we cannot rewrite: say which node."""
    g = graph(fixture_path("llama_gqa"))
    det = detect(g)
    site = next(n for n in g.nodes if n.name == det.mask_sites[0].node)
    site.op = "Mul"
    with pytest.raises(UnsupportedPatternError, match=f"through Mul node '{site.name}'"):
        detect(g)


def test_mask_kinds():
    x = gs.Variable("x", np.float32)
    assert mask_kind(gs.Node("Add", name="a", inputs=[x, x]), 1, 0) == "additive"
    assert mask_kind(gs.Node("Where", name="w", inputs=[x, x, x]), 0, 1) == "visible"
    assert mask_kind(gs.Node("Where", name="w", inputs=[x, x, x]), 0, 2) == "masked"
    with pytest.raises(UnsupportedPatternError, match=r"through Where node 'w' \(input 2\)"):
        mask_kind(gs.Node("Where", name="w", inputs=[x, x, x]), 2, 1)


def test_without_attention_mask_and_no_mask_operand_the_graph_is_refused(fixture_path):
    """A layer whose masking cannot be accounted for is refused, never rewritten without a mask."""
    with pytest.raises(UnsupportedPatternError, match=r"no operand depending on the positions \(no attention_mask"):
        _attention(graph(fixture_path("gpt2")), amask=None)


def test_without_attention_mask_the_mask_depends_on_position_ids(fixture_path):
    """Told there is no attention_mask, the sites are the operands that depend on position_ids (none in
    gpt2, whose causal mask is a constant table sliced by length): refused, naming position_ids."""
    g = graph(fixture_path("gpt2"))
    nodes, hints, concats = parts(g)
    with pytest.raises(UnsupportedPatternError, match=r"no operand depending on 'position_ids'"):
        find_attention(g, nodes, hints, concats, None, mask_sources=[input_named(g, "position_ids")])


def test_a_mask_input_that_never_reaches_the_scores(fixture_path):
    """Told the mask is input_ids (which reaches the scores only through Q): refused, naming the layer."""
    g = graph(fixture_path("llama_gqa"))
    with pytest.raises(UnsupportedPatternError, match=r"attention at Softmax '.*': no operand depending on "
                                                      r"'input_ids' on the scores path from MatMul"):
        _attention(g, amask="input_ids")


def test_values_not_found(fixture_path):
    g = graph(fixture_path("gpt2"))
    nodes, hints, _ = parts(g)
    sm = next(n for n in nodes if n.op == "Softmax")
    pv = probs_matmul(sm, set(hints["probs_ops"]))
    assert pv is not None
    pv.op = "Gemm"
    with pytest.raises(UnsupportedPatternError, match=r"keys come from cache Concat '.*' but the values' "
                                                      r"cache Concat was not found"):
        _attention(g)


def test_no_attention_reads_the_cache(fixture_path):
    g = graph(fixture_path("gpt2"))
    for n in g.nodes:
        if n.op == "Softmax":
            n.op = "LogSoftmax"
    with pytest.raises(UnsupportedPatternError, match=r"found 4 cache Concat nodes but no attention .* fused "
                                                      r"attention ops are not supported"):
        _attention(g)


def test_a_cache_concat_no_attention_reads(fixture_path):
    g = graph(fixture_path("gpt2"))
    last = _attention(g)[-1]
    last.softmax.op = "LogSoftmax"
    with pytest.raises(UnsupportedPatternError) as e:
        _attention(g)
    prefix = "cache Concat nodes not read by any attention: "
    assert str(e.value).startswith(prefix)
    assert sorted(str(e.value)[len(prefix):].split(", ")) == sorted([last.key.name, last.value.name])
