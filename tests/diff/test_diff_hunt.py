"""Defects found in a hunt through ``diff``: each test failed before its fix.

* a graph output now produced by another node (outputs swapped between two name-matched
  nodes) was "no differences";
* a sequence (optional, sparse) graph input whose element type or shape changed was
  "no differences";
* a node's function ``overload`` that changed was "no differences";
* a node of domain ``ai.onnx`` (the default domain's other name) was "removed" and "added";
* a subgraph (If/Loop/Scan body) that reads an outer tensor now produced by another node was
  "no differences"; the same subgraph with its nodes listed in another order, or reading an
  outer tensor that was renamed, was reported as a changed attribute.
"""
from __future__ import annotations

import copy
import json

import onnx
from onnx import TensorProto, helper

from specdec_compile import cli
from specdec_compile import diff as D

OPSET = [helper.make_opsetid("", 17)]
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
C = helper.make_tensor_value_info("c", TensorProto.BOOL, [])


def _vi(name: str, dtype=TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, [4])


def _model(nodes, inputs=(X,), outputs=("y",), **kw) -> onnx.ModelProto:
    outs = [o if isinstance(o, onnx.ValueInfoProto) else _vi(o) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", list(inputs), outs), opset_imports=kw.pop("opsets", OPSET),
                             **kw)


def _cli(tmp_path, a, b, capsys) -> tuple[int, dict, str]:
    pa, pb = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(a, str(pa))
    onnx.save(b, str(pb))
    rc = cli.main(["diff", str(pa), str(pb), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert cli.main(["diff", str(pa), str(pb)]) == rc
    return rc, rep, capsys.readouterr().out


# --------------------------------------------------------------------------- graph outputs


def _swapped(swap: bool) -> onnx.ModelProto:
    y, z = ("z", "y") if swap else ("y", "z")
    return _model([helper.make_node("Relu", ["x"], [y], name="n1"),
                   helper.make_node("Sigmoid", ["x"], [z], name="n2")], outputs=("y", "z"))


def test_graph_outputs_swapped_between_name_matched_nodes_differ(tmp_path, capsys):
    rc, rep, text = _cli(tmp_path, _swapped(False), _swapped(True), capsys)
    assert rc == 1 and not rep["identical"]
    ch = {e["name"]: e for e in rep["interface"]["outputs"]["changed"]}
    assert ch["y"]["source"] == ["n1 (Relu)", "n2 (Sigmoid)"]
    assert ch["z"]["source"] == ["n2 (Sigmoid)", "n1 (Relu)"]
    assert "~ y  from n1 (Relu) -> n2 (Sigmoid)" in text


def test_renamed_copy_with_outputs_keeps_no_differences():
    a = _swapped(False)
    b = copy.deepcopy(a)
    for n in b.graph.node:
        n.name = "new_" + n.name
    assert D.diff_models(a, b)["identical"]
    b2 = copy.deepcopy(a)
    b2.graph.node.reverse()
    assert D.diff_models(a, b2)["identical"]


# --------------------------------------------------------------------------- non-tensor types


def _seq(elem: int, shape) -> onnx.ModelProto:
    s = helper.make_tensor_sequence_value_info("s", elem, shape)
    return _model([helper.make_node("SequenceLength", ["s"], ["n"], name="len")], inputs=(s,),
                  outputs=(helper.make_tensor_value_info("n", TensorProto.INT64, []),))


def test_sequence_input_dtype_and_shape_changes_are_shown(tmp_path, capsys):
    rc, rep, text = _cli(tmp_path, _seq(TensorProto.FLOAT, [4]), _seq(TensorProto.INT64, [4]), capsys)
    assert rc == 1
    (e,) = rep["interface"]["inputs"]["changed"]
    assert e["name"] == "s" and e["dtype"] == ["sequence(float32)", "sequence(int64)"]
    rep2 = D.diff_models(_seq(TensorProto.FLOAT, [4]), _seq(TensorProto.FLOAT, [5]))
    (e,) = rep2["interface"]["inputs"]["changed"]
    assert e["shape"] == [[4], [5]]
    assert D.diff_models(_seq(TensorProto.FLOAT, [4]), _seq(TensorProto.FLOAT, [4]))["identical"]


# --------------------------------------------------------------------------- node fields


def _overload(o: str) -> onnx.ModelProto:
    n = helper.make_node("F", ["x"], ["y"], name="f", domain="d")
    n.overload = o
    fs = [helper.make_function("d", "F", ["a"], ["b"], [helper.make_node(op, ["a"], ["b"])], OPSET, overload=ov)
          for op, ov in (("Relu", "o1"), ("Sigmoid", "o2"))]
    return _model([n], opsets=OPSET + [helper.make_opsetid("d", 1)], functions=fs, ir_version=10)


def test_a_changed_function_overload_is_shown(tmp_path, capsys):
    rc, rep, text = _cli(tmp_path, _overload("o1"), _overload("o2"), capsys)
    assert rc == 1
    (g,) = rep["nodes"]
    (e,) = g["changed"]
    assert e["name"] == "f" and e["attributes"] == [{"name": "(overload)", "before": "o1", "after": "o2"}]
    assert "(overload): o1 -> o2" in text


def test_domain_ai_onnx_is_the_default_domain():
    def m(d):
        return _model([helper.make_node("Relu", ["x"], ["y"], name="r", domain=d)])
    assert D.diff_models(m(""), m("ai.onnx"))["identical"]
    a, b = m(""), m("ai.onnx")
    b.graph.node[0].name = "other"
    assert D.diff_models(a, b)["identical"]


# --------------------------------------------------------------------------- subgraphs


def _if_model(*, swap=False, reorder=False, outer="t1") -> onnx.ModelProto:
    """Two outer tensors (``outer`` = Relu(x), t2 = Sigmoid(x)) that an If's branches read."""
    then_nodes = [helper.make_node("Relu", [outer], ["o"], name="ti"),
                  helper.make_node("Neg", [outer], ["o3"], name="tn")]
    if reorder:
        then_nodes.reverse()
    then = helper.make_graph(then_nodes, "then", [], [_vi("o"), _vi("o3")])
    els = helper.make_graph([helper.make_node("Identity", ["t2"], ["o2"], name="ei"),
                             helper.make_node("Abs", ["t2"], ["o4"], name="ea")], "else", [], [_vi("o2"), _vi("o4")])
    a, b = ("t2", outer) if swap else (outer, "t2")
    return _model([helper.make_node("Relu", ["x"], [a], name="n1"),
                   helper.make_node("Sigmoid", ["x"], [b], name="n2"),
                   helper.make_node("If", ["c"], ["y", "y2"], name="if", then_branch=then, else_branch=els)],
                  inputs=(X, C), outputs=("y", "y2"))


def test_a_subgraph_reading_an_outer_tensor_from_another_node_differs(tmp_path, capsys):
    rc, rep, text = _cli(tmp_path, _if_model(), _if_model(swap=True), capsys)
    assert rc == 1 and not rep["identical"]
    (g,) = rep["nodes"]
    (e,) = g["rewired"]
    assert e["name"] == "if"
    assert all(s["outer_scope"] for s in e["inputs"])
    assert {(s["before"], s["after"]) for s in e["inputs"]} == {("t1", "t1"), ("t2", "t2")}
    assert "(outer scope)" in text


def test_a_subgraph_with_reordered_nodes_or_a_renamed_outer_tensor_is_the_same():
    base = _if_model()
    assert D.diff_models(base, _if_model(reorder=True))["identical"]
    assert D.diff_models(base, _if_model(outer="t_renamed"))["identical"]


def test_a_changed_subgraph_is_still_shown():
    a = _if_model()
    b = copy.deepcopy(a)
    b.graph.node[2].attribute[0].g.node[0].op_type = "Abs"     # else_branch: Identity -> Abs
    rep = D.diff_models(a, b)
    assert not rep["identical"]
    (g,) = rep["nodes"]
    (e,) = g["changed"]
    assert [x["name"] for x in e["attributes"]] == ["else_branch"]


def test_a_nested_subgraph_reading_another_outer_tensor_is_rewired():
    """A Loop body's If branch reads a tensor of the main graph: which one is wiring."""
    def loop(outer: str) -> onnx.ModelProto:
        then = helper.make_graph([helper.make_node("Add", [outer, "v"], ["q"], name="ia")], "t", [], [_vi("q")])
        els = helper.make_graph([helper.make_node("Identity", ["v"], ["q2"], name="ie")], "e", [], [_vi("q2")])
        body = helper.make_graph(
            [helper.make_node("Relu", ["v_in"], ["v"], name="b1"),
             helper.make_node("If", ["cond_in"], ["vo"], name="bif", then_branch=then, else_branch=els),
             helper.make_node("Identity", ["cond_in"], ["cond_out"], name="bc")], "body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info(
                "cond_in", TensorProto.BOOL, []), _vi("v_in")],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _vi("vo")])
        return _model([helper.make_node("Relu", ["x"], ["t"], name="r"), helper.make_node("Neg", ["x"], ["u"], name="ng"),
                       helper.make_node("Loop", ["n", "c", "x"], ["y"], name="loop", body=body)],
                      inputs=(X, helper.make_tensor_value_info("n", TensorProto.INT64, []), C), outputs=("y", "u"))
    assert D.diff_models(loop("t"), loop("t"))["identical"]
    rep = D.diff_models(loop("t"), loop("u"))
    (g,) = rep["nodes"]
    (e,) = g["rewired"]
    assert e["name"] == "loop" and e["inputs"][0]["outer_scope"] and (e["inputs"][0]["before"], e["inputs"][0]["after"]) == ("t", "u")
    assert not g["changed"]


# --------------------------------------------------------------------------- metadata


def test_graph_metadata_props_are_compared(tmp_path, capsys):
    a = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], ir_version=10)
    b = copy.deepcopy(a)
    helper.set_metadata_props(b.graph, {"k": "v"})
    rc, rep, text = _cli(tmp_path, a, b, capsys)
    assert rc == 1
    assert rep["metadata"] == [{"field": "graph metadata k", "before": None, "after": "v"}]
    assert "+ graph metadata k: (none) -> v" in text


def _function_body(order, last_op="Sigmoid") -> onnx.ModelProto:
    body = {"r": helper.make_node("Relu", ["a"], ["t"]), "s": helper.make_node(last_op, ["a"], ["u"]),
            "add": helper.make_node("Add", ["t", "u"], ["b"])}
    f = helper.make_function("d", "F", ["a"], ["b"], [body[k] for k in order], OPSET)
    n = helper.make_node("F", ["x"], ["y"], name="f", domain="d")
    return _model([n], opsets=OPSET + [helper.make_opsetid("d", 1)], functions=[f])


def test_a_function_whose_nodes_were_only_reordered_is_the_same(tmp_path, capsys):
    """--explain said cleanup changed the qaic CtxScatter function when it only reordered its nodes:
    function bodies were compared by their bytes, the graph by structure."""
    rc, rep, text = _cli(tmp_path, _function_body(["r", "s", "add"]), _function_body(["s", "r", "add"]), capsys)
    assert rc == 0 and rep["identical"] is True and "function d::F" not in text
    rc, rep, text = _cli(tmp_path, _function_body(["r", "s", "add"]), _function_body(["s", "r", "add"], "Tanh"), capsys)
    assert rc == 1 and [m["field"] for m in rep["metadata"]] == ["function d::F"]
