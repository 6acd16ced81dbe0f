"""Tests of ``specdec-compile diff`` (issue 5): the graph-aware diff (``specdec_compile.diff``),
its command line (``specdec_compile.cli.diff``) and ``explain`` (``specdec_compile.explain``).

Golden files live in tests/golden/diff/; regenerate them with
``SPECDEC_UPDATE_GOLDEN=1 python -m pytest -q tests/diff/test_diff.py``.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from specdec_compile import cli, explain, pipeline
from specdec_compile import diff as D
from specdec_compile.cli import diff as diff_cli
from specdec_compile.diff.sections import is_empty
from specdec_compile.errors import SpecdecError

from models import export_fixture
from specdec_compile.options import Options

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "diff"
FIXTURES = ("llama_gqa", "gpt2", "codegen", "llama_dynamo")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def fixture_models():
    """name -> path of the exported fixture model (built once, cached on disk)."""
    return {name: export_fixture(name) for name in FIXTURES}


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SPECDEC_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not os.environ.get("SPECDEC_UPDATE_GOLDEN"):
            pytest.fail(f"golden file {path} was missing and has been written; check it in and rerun")
    assert text == path.read_text(), f"output differs from {path} (SPECDEC_UPDATE_GOLDEN=1 to regenerate)"


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _ctx_scatter_function():
    body = [
        helper.make_node("Unsqueeze", ["position_ids", "axes"], ["idx"]),
        helper.make_node("ScatterND", ["data", "idx", "updates"], ["out"]),
    ]
    return helper.make_function("com.qualcomm.cloud", "CtxScatter", ["data", "position_ids", "updates"], ["out"],
                                [helper.make_node("Constant", [], ["axes"], value_ints=[-1])] + body,
                                [helper.make_opsetid("", 17)])


def build_tiny(stage: int) -> onnx.ModelProto:
    """A tiny hand-built 'decoder' at three stages of a pretend compile.

    stage 0: the original export; 1: KV cache retained (inputs/outputs renamed,
    Concat replaced by CtxScatter, dims canonical); 2: the mask removed, weights
    re-quantized, opset 17, attribute changed, the Gather renamed (same structure).
    """
    rng = np.random.default_rng(0)
    embed = rng.standard_normal((16, 4)).astype(np.float32)
    w = rng.standard_normal((4, 8)).astype(np.float32)
    shape_k = np.array([0, 2, -1, 4], dtype=np.int64)
    seq = "sequence_length" if stage == 0 else "seq_len"
    inputs = [_vi("input_ids", TensorProto.INT64, ["batch_size", seq])]
    if stage < 2:
        inputs.append(_vi("attention_mask", TensorProto.INT64, ["batch_size", "total_length"]))
    if stage == 0:
        inputs.append(_vi("past_key_values.0.key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 4]))
        past = "past_key_values.0.key"
    else:
        inputs.append(_vi("position_ids", TensorProto.INT64, ["batch_size", seq]))
        inputs.append(_vi("past_key.0", TensorProto.FLOAT, ["batch_size", 2, "ctx_len", 4]))
        past = "past_key.0"
    kv_out = "present.0.key" if stage == 0 else "past_key.0_RetainedState"
    outputs = [_vi("logits", TensorProto.FLOAT, ["batch_size", seq, 8]),
               _vi(kv_out, TensorProto.FLOAT, ["batch_size", 2, "total_length" if stage == 0 else "ctx_len", 4])]
    inits = [_init("model.embed_tokens.weight", embed), _init("shape_k", shape_k),
             _init("lm_head.weight", w if stage < 2 else (w * 2).astype(np.float32))]
    gather_name = "/model/embed_tokens/Gather" if stage < 2 else "embed_lookup"
    nodes = [helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["h"], name=gather_name, axis=0),
             helper.make_node("Reshape", ["h", "shape_k"], ["k"], name="/model/layers.0/self_attn/k_proj/Reshape"),
             helper.make_node("Transpose", ["k"], ["kt"], name="/model/layers.0/self_attn/Transpose",
                              perm=[0, 1, 2, 3] if stage < 2 else [0, 1, 3, 2])]
    if stage == 0:
        nodes.append(helper.make_node("Concat", [past, "k"], [kv_out], name="/model/layers.0/self_attn/Concat", axis=2))
    else:
        nodes.append(helper.make_node("CtxScatter", [past, "position_ids", "k"], [kv_out],
                                      name="specdec/L0/kv_write_key", domain="com.qualcomm.cloud"))
    if stage < 2:
        nodes += [helper.make_node("Cast", ["attention_mask"], ["mask_f"], name="/model/Cast", to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["h", "mask_f"], ["hm"], name="/model/Mul"),
                  helper.make_node("Relu", ["hm"], ["r"], name="/model/layers.0/mlp/Relu")]
    else:
        nodes.append(helper.make_node("Relu", ["h"], ["r"], name="/model/layers.0/mlp/Relu"))
    nodes.append(helper.make_node("MatMul", ["r", "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))
    graph = helper.make_graph(nodes, "tiny", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 18 if stage < 2 else 17)]
    functions = []
    if stage >= 1:
        opsets.append(helper.make_opsetid("com.qualcomm.cloud", 1))
        functions = [_ctx_scatter_function()]
    m = helper.make_model(graph, opset_imports=opsets, functions=functions, producer_name="tiny-export",
                          ir_version=8)
    if stage >= 1:
        helper.set_model_props(m, {"specdec.role": "tlm"})
    return m


def _save(model, path: Path, external: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=path.name + ".data", size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


def _renamed_copy(model: onnx.ModelProto, tensors: bool = True, shuffle: bool = True) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for i, n in enumerate(g.node):
        n.name = f"renamed_{i}"
    if tensors:
        keep = {v.name for v in g.output}
        ren = {}
        for n in g.node:
            for o in n.output:
                if o and o not in keep:
                    ren[o] = f"t{len(ren)}"
        for n in g.node:
            for k, x in enumerate(n.output):
                n.output[k] = ren.get(x, x)
            for k, x in enumerate(n.input):
                n.input[k] = ren.get(x, x)
        g.ClearField("value_info")
    if shuffle:
        nodes = list(g.node)
        random.Random(0).shuffle(nodes)
        del g.node[:]
        g.node.extend(nodes)
    return m


def _run_cli(argv, capsys):
    rc = cli.main(["diff", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- identity and renames


def test_self_diff_is_empty_exit_0(fixture_models, capsys):
    p = str(fixture_models["llama_gqa"])
    rc, out, err = _run_cli([p, p], capsys)
    assert rc == 0, err
    assert out.splitlines()[2:] == ["no differences"]
    assert err == ""
    rc, out, _ = _run_cli([p, p, "--json"], capsys)
    rep = json.loads(out)
    assert rc == 0 and rep["identical"] is True
    for sec in D.SECTIONS:
        assert is_empty(rep[sec]), sec


@pytest.mark.parametrize("name", FIXTURES)
def test_renamed_copy_is_empty(fixture_models, tmp_path, name):
    """All nodes renamed (and intermediate tensors renamed, nodes shuffled): matched by topology."""
    src = fixture_models[name]
    model = onnx.load(str(src), load_external_data=False)
    only_nodes = _renamed_copy(model, tensors=False, shuffle=False)
    rep = D.diff_models(model, only_nodes, a_dir=src.parent, b_dir=src.parent)
    assert rep["identical"], D.render_text(rep)
    everything = _renamed_copy(model)
    p = _save(everything, tmp_path / "renamed.onnx")
    rep = D.diff_files(src, p)
    assert rep["identical"], D.render_text(rep)
    assert diff_cli.main([str(src), str(p)]) == 0


def test_renamed_hand_built_is_empty_and_change_is_found():
    a = build_tiny(0)
    assert D.diff_models(a, _renamed_copy(a))["identical"]
    b = _renamed_copy(a)
    for n in b.graph.node:
        if n.op_type == "Transpose":
            n.attribute[0].ints[:] = [1, 0, 2, 3]
    rep = D.diff_models(a, b)
    assert not rep["identical"]
    changed = [e for g in rep["nodes"] for e in g["changed"]]
    assert [(e["op"], e["attributes"][0]["name"]) for e in changed] == [("Transpose", "perm")]
    assert rep["nodes"][0]["group"] == "layer 0"


def test_layer_of_name():
    f = D.layer_of_name
    assert f("/model/layers.3/self_attn/MatMul") == 3
    assert f("node_model_layers_12_mlp_Mul") == 12
    assert f("specdec/L7/kv_write_key") == 7
    assert f("/transformer/h.1/attn/Softmax") == 1
    assert f("past_key_values.0.key") is None
    assert f("/model/Cast_1") is None
    assert f("") is None


def test_dynamo_layers_from_scope_metadata(fixture_models):
    m = onnx.load(str(fixture_models["llama_dynamo"]), load_external_data=False)
    layers = {D.node_layer(n) for n in m.graph.node}
    assert {0, 1} <= layers


# --------------------------------------------------------------------------- golden text and JSON


def test_golden_text_hand_built_pair():
    rep = D.diff_models(build_tiny(0), build_tiny(2), a_label="a.onnx", b_label="b.onnx")
    text = D.render_text(rep)
    _golden("tiny_a_b.txt", text)
    # what the text must show, independent of the golden file
    itf = rep["interface"]
    assert [e["name"] for e in itf["inputs"]["removed"]] == ["attention_mask"]
    assert [e["name"] for e in itf["inputs"]["added"]] == ["position_ids"]
    assert [(e["from"], e["to"]) for e in itf["inputs"]["renamed"]] == [("past_key_values.0.key", "past_key.0")]
    assert [(e["from"], e["to"]) for e in itf["outputs"]["renamed"]] == [("present.0.key", "past_key.0_RetainedState")]
    assert itf["inputs"]["changed"] == [{"name": "input_ids", "shape": [["batch_size", "sequence_length"],
                                                                        ["batch_size", "seq_len"]]}]
    groups = {g["group"]: g for g in rep["nodes"]}
    assert set(groups) == {"global", "layer 0"}
    assert [e["op"] for e in groups["global"]["removed"]] == ["Cast", "Mul"]
    assert [e["name"] for e in groups["layer 0"]["added"]] == ["specdec/L0/kv_write_key"]
    assert [e["name"] for e in groups["layer 0"]["removed"]] == ["/model/layers.0/self_attn/Concat"]
    assert [e["name"] for e in groups["layer 0"]["rewired"]] == ["/model/layers.0/mlp/Relu"]
    assert "embed_lookup" not in text  # renamed, structurally identical Gather: not reported
    assert [e["name"] for e in rep["initializers"]["changed"]] == ["lm_head.weight"]
    assert {e["field"] for e in rep["metadata"]} == {
        "opset ai.onnx", "opset com.qualcomm.cloud", "metadata specdec.role",
        "function com.qualcomm.cloud::CtxScatter"}
    assert {e["op"]: (e["before"], e["after"]) for e in rep["op_counts"]} == {
        "Cast": (1, 0), "Concat": (1, 0), "Mul": (1, 0), "com.qualcomm.cloud::CtxScatter": (0, 1)}


def test_cli_text_and_json(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    b = _save(build_tiny(2), tmp_path / "b.onnx")
    rc, out, err = _run_cli([str(a), str(b)], capsys)
    assert rc == 1 and err == ""
    assert "\x1b[" not in out  # not a tty: no colours
    golden = D.render_text(D.diff_models(build_tiny(0), build_tiny(2), a_label="a.onnx", b_label="b.onnx"))
    assert out.splitlines()[2:] == golden.splitlines()[2:]
    rc, out, err = _run_cli([str(a), str(b), "--json"], capsys)
    assert rc == 1
    rep = json.loads(out)
    assert list(rep) == sorted(rep)  # stable key order
    assert set(rep) == {"kind", "a", "b", "identical", "interface", "metadata", "op_counts", "nodes",
                        "initializers", "notes"}
    assert set(rep["interface"]) == {"inputs", "outputs"}
    assert set(rep["interface"]["inputs"]) == {"added", "removed", "renamed", "changed"}
    assert set(rep["initializers"]) == {"added", "removed", "renamed", "changed"}
    for g in rep["nodes"]:
        assert set(g) == {"group", "layer", "added", "removed", "rewired", "changed"}
    assert rep["identical"] is False
    rep["a"], rep["b"] = "a.onnx", "b.onnx"
    _golden("tiny_a_b.json", D.render_json(rep))
    # JSON of a file against itself: every section present and empty
    rc, out, _ = _run_cli([str(a), str(a), "--json"], capsys)
    same = json.loads(out)
    assert rc == 0 and same["interface"]["inputs"]["added"] == [] and same["nodes"] == []


def test_color_always_and_never(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    b = _save(build_tiny(1), tmp_path / "b.onnx")
    rc, out, _ = _run_cli([str(a), str(b), "--color", "always"], capsys)
    assert rc == 1 and "\x1b[" in out
    rc, out2, _ = _run_cli([str(a), str(b), "--color", "never"], capsys)
    assert rc == 1 and "\x1b[" not in out2


# --------------------------------------------------------------------------- initializers, external data


@pytest.fixture
def no_weight_loading(monkeypatch):
    """Fail the test if anything loads external data through onnx."""
    import onnx.external_data_helper as edh

    def boom(*a, **k):
        raise AssertionError("external data was loaded into memory")

    monkeypatch.setattr(onnx, "load", boom)
    monkeypatch.setattr(onnx, "load_model", boom)
    monkeypatch.setattr(edh, "load_external_data_for_model", boom)
    monkeypatch.setattr(edh, "load_external_data_for_tensor", boom)


def test_external_data_hash_streamed(tmp_path, monkeypatch, no_weight_loading):
    a = _save(build_tiny(0), tmp_path / "a" / "model.onnx", external=True)
    assert (tmp_path / "a" / "model.onnx.data").exists()
    b_dir = tmp_path / "b"
    b_dir.mkdir()
    shutil.copyfile(a, b_dir / "model.onnx")
    shutil.copyfile(tmp_path / "a" / "model.onnx.data", b_dir / "model.onnx.data")  # a copy, not a link
    b = b_dir / "model.onnx"
    monkeypatch.setattr(D, "CHUNK_SIZE", 7)  # many small reads per tensor
    assert D.diff_files(a, b)["identical"]

    # the digest of an external tensor is the sha256 of its bytes, read in chunks
    from specdec_compile.model_io import load_model
    m = load_model(b)
    t = next(t for t in m.graph.initializer if t.name == "lm_head.weight")
    assert t.data_location == TensorProto.EXTERNAL
    rng = np.random.default_rng(0)
    rng.standard_normal((16, 4))
    w = rng.standard_normal((4, 8)).astype(np.float32)
    assert D.TensorHasher().digest(t, b_dir) == "sha256:" + hashlib.sha256(w.tobytes()).hexdigest()

    # flip one byte of lm_head.weight inside the data file: detected, by name, with both hashes
    info = {e.key: e.value for e in t.external_data}
    off = int(info["offset"]) + 5
    data = bytearray((b_dir / "model.onnx.data").read_bytes())
    data[off] ^= 0xFF
    (b_dir / "model.onnx.data").write_bytes(bytes(data))
    rep = D.diff_files(a, b)
    assert not rep["identical"]
    changed = rep["initializers"]["changed"]
    assert [e["name"] for e in changed] == ["lm_head.weight"]
    assert changed[0]["sha256"][0] != changed[0]["sha256"][1]
    assert "dtype" not in changed[0] and "shape" not in changed[0]
    assert rep["nodes"] == [] and is_empty(rep["interface"])
    assert diff_cli.main([str(a), str(b)]) == 1


def test_hard_linked_weights_are_not_read(tmp_path, monkeypatch):
    a = _save(build_tiny(0), tmp_path / "a" / "model.onnx", external=True)
    (tmp_path / "b").mkdir()
    shutil.copyfile(a, tmp_path / "b" / "model.onnx")
    os.link(tmp_path / "a" / "model.onnx.data", tmp_path / "b" / "model.onnx.data")
    real = D.TensorHasher.digest

    def digest(self, t, base_dir):
        assert t.data_location != TensorProto.EXTERNAL, "same bytes of the same file were read"
        return real(self, t, base_dir)

    monkeypatch.setattr(D.TensorHasher, "digest", digest)
    assert D.diff_files(a, tmp_path / "b" / "model.onnx")["identical"]


def test_initializer_renamed_same_content():
    a = build_tiny(0)
    b = onnx.ModelProto()
    b.CopyFrom(a)
    for t in b.graph.initializer:
        if t.name == "lm_head.weight":
            t.name = "W_lm"
    for n in b.graph.node:
        for k, x in enumerate(n.input):
            if x == "lm_head.weight":
                n.input[k] = "W_lm"
    rep = D.diff_models(a, b)
    assert rep["initializers"]["renamed"] == [{"from": "lm_head.weight", "to": "W_lm"}]
    assert rep["nodes"] == []  # the MatMul reads the same tensor under its new name


# --------------------------------------------------------------------------- explain


def _tiny_snapshots():
    return [("original", build_tiny(0)), ("retain_kv", build_tiny(1)), ("mask", build_tiny(2)),
            ("noop", build_tiny(2))]


def test_explain_golden():
    rep = D.diff_snapshots(_tiny_snapshots())
    assert [p["pass"] for p in rep["passes"]] == ["retain_kv", "mask", "noop"]
    first, second, third = rep["passes"]
    assert [(e["from"], e["to"]) for e in first["interface"]["inputs"]["renamed"]] == [("past_key_values.0.key", "past_key.0")]
    assert [e["name"] for e in second["interface"]["inputs"]["removed"]] == ["attention_mask"]
    assert first["initializers"]["changed"] == [] and second["initializers"]["changed"] != []
    assert third["identical"] is True
    assert rep["identical"] is False
    assert "total" in rep and rep["total"]["a"] == "original" and rep["total"]["b"] == "noop"
    _golden("tiny_explain.txt", D.render_text(rep))
    js = json.loads(D.render_json(rep))
    assert list(js) == sorted(js) and {"kind", "passes", "identical", "notes", "total"} <= set(js)
    assert all({"pass", "interface", "metadata", "op_counts", "nodes", "initializers"} <= set(p)
               for p in js["passes"])


def test_explain_needs_snapshots():
    with pytest.raises(SpecdecError):
        D.diff_snapshots([])
    rep = D.diff_snapshots([("original", build_tiny(0))])
    assert rep["passes"] == [] and rep["identical"] is True


# --------------------------------------------------------------------------- bad inputs


def test_missing_file_one_line_exit_2(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    rc, out, err = _run_cli([str(a), str(tmp_path / "nope.onnx")], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "nope.onnx" in err and "no such file" in err


def test_truncated_file_one_line_exit_2(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    data = a.read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 2])
    rc, out, err = _run_cli([str(bad), str(a)], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "truncated.onnx" in err


def test_truncated_external_data_exit_2(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a" / "model.onnx", external=True)
    dat = tmp_path / "a" / "model.onnx.data"
    dat.write_bytes(dat.read_bytes()[:10])
    rc, _, err = _run_cli([str(a), str(a)], capsys)
    assert rc == 2 and err.count("\n") == 1 and "truncated" in err


def test_bad_arguments_exit_2(tmp_path, capsys):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    for argv in ([str(a)], [str(a), str(a), str(a)], [str(a), str(a), "--bogus"], ["--passes", str(a)]):
        rc, out, err = _run_cli(argv, capsys)
        assert rc == 2 and out == "" and err.count("\n") == 1, (argv, err)


def test_console_script_missing_file(tmp_path):
    exe = Path(sys.executable).parent / "specdec-compile"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "specdec_compile.cli"]
    res = subprocess.run(cmd + ["diff", str(tmp_path / "missing.onnx"), str(tmp_path / "other.onnx")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("specdec-compile diff: error:")


# --------------------------------------------------------------------------- with the compiler


ORIGINAL_KV_NAMES = {
    # fixture: (input name, output name) of layer i, kv in ("key", "value")
    "optimum": (lambda i, kv: f"past_key_values.{i}.{kv}", lambda i, kv: f"present.{i}.{kv}"),
    "dynamo": (lambda i, kv: f"past_{kv[0]}_{i}", lambda i, kv: f"new_{kv[0]}_{i}"),
}


def _contract_check(rep, n_layers, role="tlm", names="optimum"):
    """The diff of an original export and its rewrite shows exactly the contract's interface changes."""
    in_name, out_name = ORIGINAL_KV_NAMES[names]
    itf = rep["interface"]
    assert [e["name"] for e in itf["inputs"]["removed"]] == ["attention_mask"]
    assert itf["inputs"]["added"] == [] and itf["outputs"]["added"] == [] and itf["outputs"]["removed"] == []
    ren_in = {e["from"]: e for e in itf["inputs"]["renamed"]}
    ren_out = {e["from"]: e for e in itf["outputs"]["renamed"]}
    want_in, want_out = {}, {}
    for i in range(n_layers):
        for kv in ("key", "value"):
            want_in[in_name(i, kv)] = f"past_{kv}.{i}"
            want_out[out_name(i, kv)] = f"past_{kv}.{i}_RetainedState"
    assert {k: e["to"] for k, e in ren_in.items()} == want_in
    assert {k: e["to"] for k, e in ren_out.items()} == want_out
    for e in list(ren_in.values()) + list(ren_out.values()):
        shape = e["shape"][1]
        assert shape[0] == "batch_size" and shape[2] == "ctx_len", e
        assert "dtype" not in e
    changed_in = {e["name"]: e for e in itf["inputs"]["changed"]}
    changed_out = {e["name"]: e for e in itf["outputs"]["changed"]}
    assert set(changed_in) <= {"input_ids", "position_ids"} and set(changed_out) == {"logits"}
    for e in changed_in.values():
        assert e["shape"][1] == ["batch_size", "seq_len"] and "dtype" not in e
    want_logits = ["batch_size", "seq_len"] if role == "tlm" else ["batch_size", 1]
    assert changed_out["logits"]["shape"][1][:2] == want_logits
    groups = {g["group"]: g for g in rep["nodes"]}
    assert {f"layer {i}" for i in range(n_layers)} <= set(groups), list(groups)
    for i in range(n_layers):
        g = groups[f"layer {i}"]
        assert g["added"] and g["removed"], g["group"]
        assert all(D.layer_of_name(e["name"]) in (i, None) for e in g["added"]), g["added"]
    assert set(groups) <= {"global"} | {f"layer {i}" for i in range(n_layers)}


@pytest.mark.parametrize("name,role,target", [("llama_gqa", "tlm", "qaic"), ("llama_gqa", "tlm", "ort"),
                                              ("gpt2", "dlm", "qaic"), ("llama_dynamo", "tlm", "qaic")])
def test_original_vs_rewrite_lists_contract_changes(fixture_models, name, role, target):
    src = fixture_models[name]
    res = pipeline.rewrite(str(src), Options(role=role, target=target, k=3 if role == "tlm" else None))
    rep = D.diff_models(onnx.load(str(src), load_external_data=False), res.model, a_dir=src.parent,
                        b_dir=res.source_dir or src.parent, a_label="original", b_label="rewritten")
    _contract_check(rep, n_layers=2, role=role, names="dynamo" if "dynamo" in name else "optimum")
    assert rep["initializers"]["changed"] == []  # weights are referenced, never rewritten
    assert not rep["identical"]


def test_passes_cli_and_explain_from_pipeline(fixture_models, capsys):
    src = fixture_models["llama_gqa"]
    res = pipeline.rewrite(str(src), Options(role="tlm", target="qaic", k=3), record=True)
    assert res.snapshots[0][0] == "original" and len(res.snapshots) >= 2
    rep = D.diff_snapshots(res.snapshots, base_dir=res.source_dir)
    assert [p["pass"] for p in rep["passes"]] == [name for name, _ in res.snapshots[1:]]
    if "total" in rep:
        _contract_check(rep["total"], n_layers=2)
    rc, out, err = _run_cli(["--passes", str(src), "--role", "tlm", "--target", "qaic"], capsys)
    assert rc == 1, err
    assert out.startswith("explain:") and "== pass 1/" in out
    rc, out, err = _run_cli(["--passes", str(src), "--role", "tlm", "--json"], capsys)
    js = json.loads(out)
    assert rc == 1 and js["kind"] == "explain" and js["role"] == "tlm"


def test_explain_module_names_passes_as_the_pipeline_recorded_them(fixture_models):
    src = fixture_models["llama_gqa"]
    res = pipeline.rewrite(str(src), Options(role="dlm", target="ort"), record=True)
    rep = explain.explain_result(res)
    names = [name for name, _ in res.snapshots[1:]]
    assert [p["pass"] for p in rep["passes"]] == names == list(res.passes)
    assert rep["total"]["a"] == "original" and rep["total"]["b"] == names[-1]
    from_file = explain.explain_file(src.parent, role="dlm", target="ort")  # an artifact-style directory
    assert from_file["source"] == str(src.parent) and from_file["role"] == "dlm" and from_file["target"] == "ort"
    assert D.render_text(from_file) == D.render_text(rep)


def test_explain_file_bad_input_is_one_line(tmp_path):
    with pytest.raises(SpecdecError, match="no such file"):
        explain.explain_file(tmp_path / "missing.onnx", role="tlm")


def test_library_never_loads_the_cli_or_the_pipeline():
    code = ("import sys, specdec_compile.diff as d\n"
            "d.diff_models, d.diff_files, d.diff_snapshots, d.render_text, d.render_json, d.print_report\n"
            "assert not hasattr(d, 'explain')  # the older alias of diff_snapshots is gone (issue 32)\n"
            "bad = [m for m in ('specdec_compile.cli.diff', 'specdec_compile.explain', 'specdec_compile.pipeline',\n"
            "                   'specdec_compile.cli', 'specdec_compile.cli.common') if m in sys.modules]\n"
            "assert not bad, bad\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr


def test_python_m_diff(tmp_path):
    a = _save(build_tiny(0), tmp_path / "a.onnx")
    b = _save(build_tiny(1), tmp_path / "b.onnx")
    same = subprocess.run([sys.executable, "-m", "specdec_compile.diff", str(a), str(a)], capture_output=True,
                          text=True, timeout=120)
    assert same.returncode == 0 and same.stdout.splitlines()[-1] == "no differences", same.stderr
    differ = subprocess.run([sys.executable, "-m", "specdec_compile.diff", str(a), str(b), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert differ.returncode == 1 and json.loads(differ.stdout)["identical"] is False


def test_two_compiles_differing_in_k_have_identical_tlm_graphs(fixture_models, tmp_path, capsys):
    src = fixture_models["llama_gqa"]
    m3 = pipeline.rewrite(str(src), Options(role="tlm", target="qaic", k=3)).model
    m7 = pipeline.rewrite(str(src), Options(role="tlm", target="qaic", k=7)).model
    assert D.diff_models(m3, m7, a_dir=src.parent, b_dir=src.parent)["identical"]
    # whole artifacts, through the compile CLI
    outs = []
    for k in (3, 7):
        out = tmp_path / f"k{k}"
        rc = cli.main([str(src), "--role", "tlm", "--k", str(k), "-o", str(out)])
        capsys.readouterr()
        assert rc == 0 and (out / "model.onnx").exists() and (out / "manifest.json").exists()
        outs.append(out)
    rc, text, err = _run_cli([str(outs[0]), str(outs[1])], capsys)
    assert rc == 0, text + err
    assert "no differences" in text
    assert "k lives in specializations.json" in text


def test_compile_explain_uses_the_same_sections(fixture_models, tmp_path, capsys):
    src = fixture_models["llama_gqa"]
    rc = cli.main([str(src), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "out"), "--explain"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "== pass 1/" in out and "interface" in out and "nodes" in out
