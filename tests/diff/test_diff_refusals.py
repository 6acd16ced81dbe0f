"""Bad inputs to ``specdec-compile diff`` and its Python API: one line on stderr and exit 2 (a
``SpecdecError`` from the library), never a traceback, never a report that says something untrue.

Each test here failed before the fix it names; tiny hand-built models keep them fast, and the
artifact tests compile the smallest fixture twice (target ort).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from specdec_compile import cli
from specdec_compile import diff as D
from specdec_compile.errors import SpecdecError

from models import export_fixture

def _chain(ops=("Relu", "Relu", "Relu"), extra_name=None, w=1.0) -> onnx.ModelProto:
    """x + w, then one node per op (named ``/model/layers.i/n``); ``extra_name``: one more Relu
    of that name at the end (the graph output is then its output)."""
    nodes = [helper.make_node("Add", ["x", "w"], ["t0"], name="add")]
    for i, op in enumerate(ops):
        nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=f"/model/layers.{i}/n"))
    out = f"t{len(ops)}"
    if extra_name is not None:
        nodes.append(helper.make_node("Relu", [out], ["z"], name=extra_name))
        out = "z"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [4])],
                          [numpy_helper.from_array(np.full(4, w, np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _save(m: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(path))
    return path


def _run(argv, capsys):
    rc = cli.main(["diff", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _cmd() -> list[str]:
    return [sys.executable, "-m", "specdec_compile.diff"]


# --------------------------------------------------------------------------- names that do not print


def test_a_newline_in_a_name_cannot_forge_a_report_line(tmp_path, capsys):
    a = _save(_chain(), tmp_path / "a.onnx")
    b = _save(_chain(), tmp_path / "b.onnx")
    m = _chain(extra_name="extra\nno differences")
    m.graph.node[-1].output[0] = "z\x1b[2Jq"
    m.graph.output[0].name = "z\x1b[2Jq"
    c = _save(m, tmp_path / "c.onnx")
    rc, out, _ = _run([str(a), str(c)], capsys)
    assert rc == 1
    assert "no differences" not in out.splitlines()   # the name's newline forged this line
    assert "\x1b" not in out and "extra\\nno differences" in out and "z\\x1b[2Jq" in out
    rc, out, _ = _run([str(a), str(c), "--json"], capsys)
    js = json.loads(out)     # JSON keeps the names as they are
    assert rc == 1 and [e["name"] for e in js["interface"]["outputs"]["added"]] == ["z\x1b[2Jq"]
    rc, out, _ = _run([str(a), str(b)], capsys)
    assert rc == 0 and out.splitlines()[-1] == "no differences"


def test_a_bidi_override_in_a_name_is_escaped():
    rep = D.diff_models(_chain(), _chain(extra_name="n\u202eevil"))
    text = D.render_text(rep)
    assert "\u202e" not in text and "n\\u202eevil" in text


# --------------------------------------------------------------------------- rewired, but from what


def test_a_replaced_producer_is_not_shown_as_from_x_to_x():
    rep = D.diff_models(_chain(("Relu", "Relu", "Relu")), _chain(("Relu", "Sigmoid", "Relu")))
    text = D.render_text(rep)
    line = next(t for t in text.splitlines() if "input 0: t2" in t)
    before, after = line.split(" -> ")
    assert before.split("input 0: ")[1] != after     # it read "t2 [from n] -> t2 [from n]"
    assert "(removed Relu)" in before and "(added Sigmoid)" in after


# --------------------------------------------------------------------------- interface order


def _two_inputs(order=("x", "y"), out_order=("o", "t"), extra_input=False) -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "w"], ["t"], name="add"),
             helper.make_node("Mul", ["t", "y"], ["o"], name="mul")]
    vi = {n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y", "o", "t", "extra")}
    inputs = [vi[n] for n in order] + ([vi["extra"]] if extra_input else [])
    g = helper.make_graph(nodes, "g", inputs, [vi[n] for n in out_order],
                          [numpy_helper.from_array(np.ones(2, np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_reordered_inputs_and_outputs_are_a_difference():
    rep = D.diff_models(_two_inputs(), _two_inputs(order=("y", "x"), out_order=("t", "o")))
    assert not rep["identical"]        # was: "no differences" (positional bindings do change)
    assert rep["interface"]["inputs"]["changed"] == [{"name": "x", "position": [0, 1]},
                                                     {"name": "y", "position": [1, 0]}]
    assert [e["name"] for e in rep["interface"]["outputs"]["changed"]] == ["o", "t"]
    assert "~ x  position 0 -> 1" in D.render_text(rep)
    # an input added at the end moves none of the others
    rep = D.diff_models(_two_inputs(), _two_inputs(extra_input=True))
    assert rep["interface"]["inputs"]["changed"] == [] and len(rep["interface"]["inputs"]["added"]) == 1


# --------------------------------------------------------------------------- stdout


def _two_different(tmp_path) -> tuple[str, str]:
    return (str(_save(_chain(), tmp_path / "a.onnx")),
            str(_save(_chain(("Relu", "Sigmoid", "Relu")), tmp_path / "b.onnx")))


def test_closed_stdout_is_one_line_exit_2(tmp_path):
    a, b = _two_different(tmp_path)
    res = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *_cmd(), a, b], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "stdout is closed" in res.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_full_stdout_is_one_line_exit_2(tmp_path, fmt):
    a, b = _two_different(tmp_path)
    with open("/dev/full", "w") as full:
        res = subprocess.run([*_cmd(), a, b, *fmt], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "cannot write the report to stdout" in res.stderr


def test_a_reader_that_left_early_does_not_turn_a_difference_into_exit_0(tmp_path):
    a, b = _two_different(tmp_path)
    r, w = os.pipe()
    os.close(r)      # the reader is gone before the first write: EPIPE
    try:
        res = subprocess.run([*_cmd(), a, b], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert res.returncode == 1, res.stderr     # was 0: "the same"
    assert res.stderr == ""


# --------------------------------------------------------------------------- options


def test_target_without_passes_is_refused(tmp_path, capsys):
    a, b = _two_different(tmp_path)
    rc, out, err = _run(["--target", "ort", a, b], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--target" in err and "--passes" in err


def test_an_empty_path_is_named(tmp_path, capsys):
    a, _ = _two_different(tmp_path)
    rc, out, err = _run(["", a], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "empty path" in err


# --------------------------------------------------------------------------- the Python API


def _external(tmp_path: Path, name: str, w: float) -> tuple[onnx.ModelProto, Path]:
    m = _chain(w=w)
    convert_model_to_external_data(m, location="w.bin", size_threshold=0)
    p = _save(m, tmp_path / name / "model.onnx")
    return onnx.load(str(p), load_external_data=False), p.parent


def test_diff_models_external_data_without_its_directory_is_refused(tmp_path):
    a, a_dir = _external(tmp_path, "a", 1.0)
    b, b_dir = _external(tmp_path, "b", 2.0)
    assert not D.diff_models(a, b, a_dir=a_dir, b_dir=b_dir)["identical"]
    with pytest.raises(SpecdecError, match="external data"):
        D.diff_models(a, b)      # was: "identical" (the same file name, other bytes)


def test_diff_models_checks_external_data_like_a_file(tmp_path):
    a, a_dir = _external(tmp_path, "a", 1.0)
    bad = onnx.ModelProto()
    bad.CopyFrom(a)
    for e in bad.graph.initializer[0].external_data:
        if e.key == "offset":
            e.value = "abc"
    with pytest.raises(SpecdecError, match="offset"):
        D.diff_models(a, bad, a_dir=a_dir, b_dir=a_dir)      # was: ValueError from int()
    (a_dir / "w.bin").unlink()
    with pytest.raises(SpecdecError, match="missing external data"):
        D.diff_models(a, a, a_dir=a_dir, b_dir=a_dir)


@pytest.mark.parametrize("call", [
    lambda m, p: D.diff_models(str(p), m),
    lambda m, p: D.diff_models(m, None),
    lambda m, p: D.diff_models(m, m.graph),
    lambda m, p: D.diff_files(m, p),
    lambda m, p: D.diff_files(None, p),
    lambda m, p: D.diff_files(str(p).encode(), p),
    lambda m, p: D.diff_snapshots(None),
    lambda m, p: D.diff_snapshots([m, m]),
    lambda m, p: D.diff_snapshots([("original", str(p)), ("pass", str(p))]),
    lambda m, p: D.render_text(None),
    lambda m, p: D.render_json({}),
], ids=["models-path", "models-none", "models-graph", "files-proto", "files-none", "files-bytes",
        "snapshots-none", "snapshots-bare-models", "snapshots-paths", "render-none", "render-json-empty"])
def test_api_wrong_types_are_one_line_specdec_errors(tmp_path, call):
    p = _save(_chain(), tmp_path / "a.onnx")
    m = onnx.load(str(p))
    with pytest.raises(SpecdecError) as e:
        call(m, p)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- artifact directories


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Two TLM artifacts of the same export, k=3, differing only in prefill_len and ctx_len."""
    src = export_fixture("llama_gqa")
    root = tmp_path_factory.mktemp("artifacts")
    outs = {}
    for name, prefill, ctx in (("c64", 8, 64), ("c128", 16, 128)):
        rc = cli.main([str(src), "--role", "tlm", "--k", "3", "--prefill-len", str(prefill), "--ctx-len", str(ctx),
                       "--target", "ort", "-o", str(root / name), "-q"])
        assert rc == 0
        outs[name] = root / name
    return outs


def test_artifacts_differing_in_ctx_len_say_so(artifacts, capsys):
    rc, out, err = _run([str(artifacts["c64"]), str(artifacts["c128"])], capsys)
    assert rc == 0, err      # the graphs are the same (dims are named)
    note = next(t for t in out.splitlines() if t.startswith("note:"))   # there was none
    assert "ctx_len (64 vs 128)" in note and "prefill_len (8 vs 16)" in note
    rc, out, _ = _run([str(artifacts["c64"]), str(artifacts["c128"]), "--json"], capsys)
    assert rc == 0 and any("ctx_len (64 vs 128)" in n for n in json.loads(out)["notes"])


@pytest.mark.parametrize("damage", ["corrupt", "missing", "edited"])
def test_an_unreadable_manifest_is_a_note_not_silence(artifacts, tmp_path, capsys, damage):
    b = tmp_path / "b"
    shutil.copytree(artifacts["c128"], b)
    man = b / "manifest.json"
    if damage == "corrupt":
        man.write_text(man.read_text()[:40])
    elif damage == "missing":
        man.unlink()
    else:
        data = json.loads(man.read_text())
        data["k"] = "three"
        man.write_text(json.dumps(data))
    rc, out, err = _run([str(artifacts["c64"]), str(b)], capsys)
    assert rc == 0, err
    notes = [t for t in out.splitlines() if t.startswith("note:")]
    assert len(notes) == 1 and "cannot read the manifest" in notes[0] and "not compared" in notes[0]


@pytest.mark.parametrize("given", ["directory", "model.onnx", "no metadata"])
def test_passes_of_an_already_compiled_model_says_so(artifacts, tmp_path, capsys, given):
    """diff --passes compiles its model: a compiled one (an artifact, its model.onnx, or a rewrite
    whose metadata was stripped: its *_RetainedState outputs) is named as such in one line."""
    path = artifacts["c64"] if given == "directory" else artifacts["c64"] / "model.onnx"
    if given == "no metadata":
        m = onnx.load(str(path), load_external_data=False)
        del m.metadata_props[:]
        path = _save(m, tmp_path / "stripped.onnx")
    rc, out, err = _run(["--passes", str(path), "--role", "tlm", "--target", "ort"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    # was: "KV cache inputs (past_key.0, ...) are not grown by a Concat along the sequence axis"
    assert f"{path} is already compiled" in err and "diff --passes compiles a stock export" in err
    assert ("_RetainedState" if given == "no metadata" else "specdec.role") in err
