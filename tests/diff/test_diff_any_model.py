"""``diff`` compares any valid ONNX model, not only what the compiler takes: an opset below the
compiler's 13, an op of a declared custom domain, an IR-3 export that lists every initializer in
``graph.input`` (those are initializers, compared by content, never runtime inputs). The checks
against hostile files still apply. Each test here failed before its fix (diff refused opset < 13
as the compiler does; a change in an initializer's listing was "no differences")."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdec_compile import cli
from specdec_compile import diff as D
from specdec_compile.errors import SpecdecError
from specdec_compile.model_io import load_model


def _model(w: float = 1.0, *, listed: bool = True, ir: int | None = None, opset: int = 17, name: str = "w",
           domain: str | None = None) -> onnx.ModelProto:
    """y = x + w (w: an initializer, ``listed`` also in graph.input); ``domain``: one more node of it."""
    nodes = [helper.make_node("Add", ["x", name], ["y"], name="add")]
    out = "y"
    opsets = [helper.make_opsetid("", opset)]
    if domain is not None:
        nodes.append(helper.make_node("Plugin", ["y"], ["z"], name="plugin", domain=domain))
        opsets.append(helper.make_opsetid(domain, 1))
        out = "z"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])]
    if listed:
        inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [4]))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4])],
                          [numpy_helper.from_array(np.full(4, w, np.float32), name)])
    m = helper.make_model(g, opset_imports=opsets)
    if ir is not None:
        m.ir_version = ir
    return m


def _ir3(w: float) -> onnx.ModelProto:
    """An IR-3 export (ONNX 1.3, opset 8): every initializer is listed in graph.input."""
    m = _model(w, ir=3, opset=8)
    onnx.checker.check_model(m)
    return m


def _save(m: onnx.ModelProto, path) -> str:
    onnx.save(m, str(path))
    return str(path)


def test_an_ir3_export_differing_only_in_a_listed_initializer(tmp_path, capsys):
    a, b = _save(_ir3(1.0), tmp_path / "a.onnx"), _save(_ir3(2.0), tmp_path / "b.onnx")
    assert cli.main(["diff", a, b, "--json"]) == 1           # was: exit 2, "source opset 8 is older than 13"
    rep = json.loads(capsys.readouterr().out)
    assert rep["interface"]["inputs"] == {"added": [], "removed": [], "renamed": [], "changed": []}
    (e,) = rep["initializers"]["changed"]
    assert e["name"] == "w" and e["sha256"][0] != e["sha256"][1] and "graph_input" not in e
    assert cli.main(["diff", a, b]) == 1
    assert "~ w  sha256:" in capsys.readouterr().out
    assert cli.main(["diff", a, _save(_ir3(1.0), tmp_path / "c.onnx")]) == 0
    capsys.readouterr()


def test_listing_an_initializer_in_graph_input_is_a_difference_of_the_initializer():
    rep = D.diff_models(_model(listed=True), _model(listed=False))
    assert not rep["identical"]                               # was: "no differences"
    (e,) = rep["initializers"]["changed"]
    assert e["name"] == "w" and e["graph_input"] == [True, False] and e["sha256"][0] == e["sha256"][1]
    assert all(not v for v in rep["interface"]["inputs"].values())   # never a runtime input
    assert "~ w  also a graph input: yes -> no" in D.render_text(rep)
    # added and removed ones say they are listed; a rename with the same content says it changed
    rep = D.diff_models(_model(1.0, listed=True), _model(2.0, listed=False, name="v"))
    assert rep["initializers"]["removed"][0]["graph_input"] is True
    assert "graph_input" not in rep["initializers"]["added"][0]
    assert "- w  float32 [4] " in D.render_text(rep) and "(also a graph input)" in D.render_text(rep)
    rep = D.diff_models(_model(1.0, listed=True), _model(1.0, listed=False, name="v"))
    assert rep["initializers"]["renamed"] == [{"from": "w", "to": "v", "graph_input": [True, False]}]


def test_an_opset_below_the_compilers_is_compared(tmp_path):
    a, b = _save(_model(1.0, opset=11), tmp_path / "a.onnx"), _save(_model(3.0, opset=11), tmp_path / "b.onnx")
    rep = D.diff_files(a, b)                                  # was: "source opset 11 is older than 13"
    assert [e["name"] for e in rep["initializers"]["changed"]] == ["w"]
    assert not D.diff_models(_model(opset=11), _model(opset=12))["identical"]
    with pytest.raises(SpecdecError, match="source opset 11 is older than 13"):
        load_model(a)                                         # the compiler still refuses it


def test_a_declared_custom_domain_is_compared_an_undeclared_one_is_not():
    rep = D.diff_models(_model(domain="my.plugins"), _model(domain="my.plugins"))
    assert rep["identical"]                                   # was: "neither ONNX Runtime nor ... define"
    bad = _model(domain="my.plugins")
    del bad.opset_import[1:]
    with pytest.raises(SpecdecError, match="uses domain 'my.plugins', which the model's opset_import does not"):
        D.diff_models(bad, _model())


def test_the_hostile_file_checks_still_apply_below_opset_13(tmp_path):
    m = _model(opset=11)
    t = m.graph.initializer[0]
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.external_data.add(key="location", value="../escape.bin")
    path = _save(m, tmp_path / "a.onnx")
    with pytest.raises(SpecdecError, match="unsafe external data location '../escape.bin'"):
        D.diff_files(path, path)
