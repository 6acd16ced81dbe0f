"""Finder: the residual stream after each decoder layer."""
from __future__ import annotations

import pytest
from detect_helpers import graph, parts

from conftest import DECODERS
from feature_draft_models import POST_NORM
from models import VOCAB, export_spec
from specdec_compile.detect import detect
from specdec_compile.detect.attention import find_attention
from specdec_compile.detect.integer_inputs import find_integer_inputs
from specdec_compile.detect.logits import find_logits
from specdec_compile.detect.layers import find_layer_outputs
from specdec_compile.errors import UnsupportedPatternError



def _find(g):
    nodes, hints, concats = parts(g)
    logits = find_logits(g, concats, hints)
    ids = find_integer_inputs(g, hints, concats, vocab=VOCAB).input_ids
    att = find_attention(g, nodes, hints, concats, None, mask_sources=[t for t in g.inputs if t.name in (
        "attention_mask", "position_ids")])
    return find_layer_outputs(g, nodes, [ids], logits, [a.key for a in att])


@pytest.mark.parametrize("name", DECODERS)
def test_one_residual_add_per_layer_the_last_feeds_the_final_norm(fixture_path, name):
    g = graph(fixture_path(name))
    det = detect(g)
    assert len(det.layer_outputs) == det.info.num_layers == 2 and det.hidden_size == 64
    tensors = g.tensors()
    outs = [tensors[n] for n in det.layer_outputs]
    # a residual Add, or the float32 Cast of it that the next layer reads (optimum's Llama)
    assert all(t.inputs[0].op == "Add" or (t.inputs[0].op == "Cast" and t.inputs[0].inputs[0].inputs[0].op == "Add")
               for t in outs)
    # the last layer's output is read by the final norm, not by another layer's attention
    last_users = {n.op for n in outs[-1].outputs}
    assert last_users & {"LayerNormalization", "Pow", "ReduceMean", "Mul", "Cast", "SimplifiedLayerNormalization",
                         "RMSNormalization"}, last_users
    # layer 0's output is what layer 1 adds into: an input of one of layer 1's residual Adds
    assert any(n.op == "Add" for n in outs[0].outputs)


def test_parallel_attention_and_mlp_is_one_add(fixture_path):
    """CodeGen: attention and MLP both read the layer's input; one Add tree joins them."""
    g = graph(fixture_path("codegen"))
    det = detect(g)
    assert [n.split("/")[-1] for n in det.layer_outputs] == ["Add_1_output_0"] * 2


def test_post_norm_is_refused_with_the_reason():
    g = graph(export_spec("opt-postnorm", POST_NORM))
    with pytest.raises(UnsupportedPatternError, match="post-norm"):
        _find(g)
    det = detect(g)  # the model itself still compiles: the reason is recorded
    assert det.layer_outputs == () and "post-norm" in det.layer_outputs_problem
