"""Valid exports edited to compute something else: detection must read the edit or refuse it in
one line, never hand the passes a graph they would rewrite into another model (exit 0, wrong
logits: the compile does not run verify)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdec_compile.detect import detect
from specdec_compile.errors import UnsupportedPatternError
from specdec_compile.graph_utils import name_unnamed_nodes
from specdec_compile.options import Options
from specdec_compile.pipeline import rewrite

L0 = "/model/layers.0/self_attn/"


def _load(fixture_path, name="llama_gqa") -> onnx.ModelProto:
    return onnx.load(str(fixture_path(name)))


def _node(model: onnx.ModelProto, name: str):
    return next(n for n in model.graph.node if n.name == name)


def _detect(model: onnx.ModelProto):
    g = gs.import_onnx(model)
    name_unnamed_nodes(g)
    return detect(g)


def _softmax_axis(model: onnx.ModelProto, axis: int) -> None:
    sm = _node(model, L0 + "Softmax")
    keep = [a for a in sm.attribute if a.name != "axis"]
    del sm.attribute[:]
    sm.attribute.extend(keep + [helper.make_attribute("axis", axis)])


@pytest.mark.parametrize("axis", [1, 2])
def test_a_softmax_over_heads_or_queries_is_refused(fixture_path, axis):
    # was: compiled (exit 0); over heads verify then differed by 0.34 in the logits
    model = _load(fixture_path)
    _softmax_axis(model, axis)
    with pytest.raises(UnsupportedPatternError, match=f"Softmax '{L0}Softmax' normalizes over axis {axis}"):
        _detect(model)


def test_a_softmax_over_the_last_axis_written_positively_is_read(fixture_path):
    model = _load(fixture_path)
    _softmax_axis(model, 3)
    assert len(_detect(model).layers) == 2


def _positions_from_attention_mask(model: onnx.ModelProto, drop_input: bool) -> None:
    """The rotary reads (CumSum(attention_mask) - 1)[:, -seq:] instead of position_ids."""
    ints = {"ax1": 1, "one": 1, "ax1v": [1], "big": [1 << 40], "one_v": [1]}
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items())
    nodes = [helper.make_node("Cast", ["attention_mask"], ["am64"], to=TensorProto.INT64),
             helper.make_node("CumSum", ["am64", "ax1"], ["cs"]),
             helper.make_node("Sub", ["cs", "one"], ["cs1"]),
             helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
             helper.make_node("Slice", ["ids_shape", "one_v", "big"], ["seq_v"]),
             helper.make_node("Neg", ["seq_v"], ["neg_seq"]),
             helper.make_node("Slice", ["cs1", "neg_seq", "big", "ax1v"], ["pos_from_am"])]
    for i, n in enumerate(nodes):
        n.name = f"pos_from_am_{i}"
        model.graph.node.insert(i, n)
    for n in model.graph.node:
        if n.name.startswith("/model/rotary_emb"):
            n.input[:] = ["pos_from_am" if x == "position_ids" else x for x in n.input]
    if drop_input:
        keep = [i for i in model.graph.input if i.name != "position_ids"]
        del model.graph.input[:]
        model.graph.input.extend(keep)


@pytest.mark.parametrize("drop_input", [False, True], ids=["position_ids-unused", "no-position_ids"])
def test_positions_from_a_cumsum_of_attention_mask_are_refused_in_one_line(fixture_path, tmp_path, drop_input):
    # was: the CumSum was taken for ALiBi key positions; synth_positions then built a cycle
    # (OnnxGraphSurgeonException, "internal error", exit 3)
    model = _load(fixture_path)
    _positions_from_attention_mask(model, drop_input)
    _refused(model, tmp_path, r"layer 0: the new keys .* depend on 'cs1', a CumSum", "CumSum of attention_mask")


def _refused(model: onnx.ModelProto, tmp_path, by_detect: str, by_rewrite: str) -> None:
    """A valid model that detection refuses (``by_detect``), and the rewrite from a file too."""
    onnx.checker.check_model(model)
    with pytest.raises(UnsupportedPatternError, match=by_detect):
        _detect(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UnsupportedPatternError, match=by_rewrite):
        rewrite(str(path), Options(role="tlm", k=3, target="ort", prefill_len=8, ctx_len=64))


def _logits_plus(model: onnx.ModelProto, extra: list, term: str) -> None:
    """The logits become ``logits + term``, ``extra`` the nodes computing ``term``."""
    head = next(n for n in model.graph.node if "logits" in n.output)
    head.output[:] = ["logits_raw"]
    model.graph.initializer.append(numpy_helper.from_array(np.arange(4, dtype=np.int64), "all_axes"))
    model.graph.node.extend(extra + [helper.make_node("Add", ["logits_raw", term], ["logits"], name="mut_add")])


def _body(name: str, op: str, present: str) -> onnx.GraphProto:
    return helper.make_graph([helper.make_node(op, [present, "all_axes"], [name + "_y"], keepdims=0)], name, [],
                             [helper.make_tensor_value_info(name + "_y", TensorProto.FLOAT, [])])


@pytest.mark.parametrize("present,op", [("present.0.key", "ReduceMean"), ("present.1.value", "ReduceMax")])
def test_a_reduction_over_the_cache_is_refused(fixture_path, tmp_path, present, op):
    # was: compiled (exit 0); the rewrite's reduction read all ctx_len slots, stale ones too
    # (a mean over present.0.key: verify then differed by 7.8e-3 in the logits)
    model = _load(fixture_path)
    _logits_plus(model, [helper.make_node(op, [present, "all_axes"], ["term"], keepdims=0, name="mut_red")], "term")
    _refused(model, tmp_path, f"is read by {op} node 'mut_red', not only by its attention",
             "would read all ctx_len slots")


def test_the_cache_read_in_an_if_body_is_refused(fixture_path):
    model = _load(fixture_path)
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    node = helper.make_node("If", ["cond"], ["term"], name="mut_if",
                            then_branch=_body("then", "ReduceMean", "present.0.value"),
                            else_branch=_body("else", "ReduceMax", "present.0.value"))
    _logits_plus(model, [node], "term")
    with pytest.raises(UnsupportedPatternError, match=r"is read by Reduce\w+ node .* in an If/Loop/Scan body"):
        _detect(model)


def test_the_cache_read_through_layout_ops_and_shape_is_kept(fixture_path):
    # beside the attention's own reads (Transpose, Expand, Reshape, Mul): a copy of the cache and
    # its Shape as graph outputs still detect
    model = _load(fixture_path)
    model.graph.node.extend([helper.make_node("Identity", ["present.0.key"], ["key_copy"], name="mut_copy"),
                             helper.make_node("Shape", ["present.0.key"], ["key_shape"], name="mut_shape")])
    model.graph.output.extend([helper.make_tensor_value_info("key_copy", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("key_shape", TensorProto.INT64, [4])])
    assert len(_detect(model).layers) == 2


def _sum_over_key_length(model: onnx.ModelProto) -> None:
    """logits + 1e-3 * sum over K copies of mean(logits): an activation expanded to the cache's
    length (Shape of present.0.key) and summed over it, so the term is K times the mean."""
    ints = {"axes3": [0, 1, 2], "one_v": [1], "two_v": [2], "three_v": [3], "zero_v": [0]}
    model.graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items())
    model.graph.initializer.append(numpy_helper.from_array(np.array(1e-3, np.float32), "small"))
    _logits_plus(model, [
        helper.make_node("ReduceMean", ["logits_raw", "axes3"], ["lm"], keepdims=0, name="mut_mean"),
        helper.make_node("Reshape", ["lm", "one_v"], ["lm1"], name="mut_reshape"),
        helper.make_node("Shape", ["present.0.key"], ["pk_shape"], name="mut_shape"),
        helper.make_node("Slice", ["pk_shape", "two_v", "three_v"], ["k_len"], name="mut_slice"),
        helper.make_node("Expand", ["lm1", "k_len"], ["over_k"], name="mut_expand"),
        helper.make_node("ReduceSum", ["over_k", "zero_v"], ["k_sum"], keepdims=0, name="mut_sum"),
        helper.make_node("Mul", ["k_sum", "small"], ["term"], name="mut_scale")], "term")


def test_an_activation_summed_over_the_key_length_is_refused(fixture_path):
    # was: compiled (exit 0): the rewrite's sum ran over ctx_len slots (verify: logits off by 2.3e-3)
    model = _load(fixture_path)
    _sum_over_key_length(model)
    onnx.checker.check_model(model)
    with pytest.raises(UnsupportedPatternError,
                       match=r"ReduceSum node 'mut_sum' reduces 'over_k' \(shape \[10\] .*over an axis as long as the "
                             r"cache \(its past or key length\)"):
        _detect(model)
