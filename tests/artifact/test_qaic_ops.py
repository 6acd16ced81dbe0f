"""The qaic lowering the device accepts (issue 13): every fixture family's qaic
artifact, both roles, uses only ops with device precedent, has no Cos/Sin of
the positions and an int32 ArgMax, records its op set, and still verifies at
1e-4 against the original export. ``--supported-ops`` refuses a short list."""
from __future__ import annotations

import json

import onnx
import onnx_graphsurgeon as gs
import pytest

from specdec_compile import cli
from specdec_compile.graph_utils import value_dependence
from specdec_compile.artifact.qaic_ops import (PRECEDENT_FILE, load_precedent, not_supported, op_set, op_uses,
                                      read_supported_ops, without_precedent)
from specdec_compile.verify import verify
from specdec_compile.options import Options

#: every family of the fixtures: optimum exports of rotary (plain, partial, interleaved
#: from a table, llama3 and yarn scaled), learned-position and fused-qkv models, and a dynamo export
FAMILIES = ("llama_gqa", "qwen2", "mistral", "gpt_neox", "gptj", "phi3", "opt", "gpt2", "codegen",
            "llama_dynamo", "llama3_rope", "qwen2_yarn")
K, PL, CL = 3, 16, 64
AVOIDED = {"CastLike", "LessOrEqual", "IsNaN", "Tile", "Cos", "Sin", "TensorScatter"}


@pytest.fixture(scope="module")
def artifact(fixture_path, tmp_path_factory):
    cache = {}

    def get(name, role, target="qaic"):
        if (name, role, target) not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{role}-{target}") / "art"
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", str(PL),
                    "--ctx-len", str(CL), "-o", str(out)]
            assert cli.main(argv + (["--k", str(K)] if role == "tlm" else [])) == 0
            cache[(name, role, target)] = out
        return cache[(name, role, target)]

    return get


def _trig_on_positions(model: onnx.ModelProto) -> list[str]:
    g = gs.import_onnx(model)
    pos = next(t for t in g.inputs if t.name == "position_ids")
    dep = value_dependence(g, [pos])
    return [n.name for n in g.nodes if n.op in ("Cos", "Sin") and id(n.inputs[0]) in dep]


@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("name", FAMILIES)
def test_qaic_artifact_uses_only_ops_with_precedent_and_verifies(fixture_path, artifact, name, role, capsys):
    out = artifact(name, role)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    missing = without_precedent(model)
    assert missing == [], "ops without device precedent: " + "; ".join(u.describe() for u in missing)
    assert _trig_on_positions(model) == []
    argmax = [n for n in model.graph.node if n.op_type == "ArgMax"]
    if role == "dlm":
        cast = next(n for n in model.graph.node if argmax[0].input[0] in n.output)
        assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.INT32
    else:
        assert argmax == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["ops"] == op_set(model)
    assert not AVOIDED & set(manifest["ops"]["graph"])
    report = verify(fixture_path(name), out / "model.onnx", k=K, prefill_len=PL, ctx_len=CL)
    assert report.ok and report.max_logits_diff <= 1e-4, report.per_shape()


def _coverage_rows():
    from families import rows  # tests/coverage, on pytest's path (pyproject.toml)

    return rows()[0]


@pytest.mark.slow
@pytest.mark.parametrize("row", _coverage_rows(), ids=lambda r: r.id)
def test_every_coverage_matrix_row_lowers_to_ops_with_precedent(row):
    """Both roles of every row of tests/coverage (verified there, both targets). The MoE rows
    (qwen3_moe, deepseek_v3) route tokens with a data-dependent NonZero in the export:
    ``dense_experts`` makes it dense, so they are no exception."""
    from matrix import export_row

    from specdec_compile.pipeline import rewrite

    source = export_row(row)
    for role in ("tlm", "dlm"):
        model = rewrite(str(source),
                        Options(role=role, target="qaic", k=K if role == "tlm" else None, ctx_len=CL)).model
        missing = without_precedent(model)
        assert missing == [], f"{row.id} {role}: " + "; ".join(u.describe() for u in missing)
        assert _trig_on_positions(model) == []


def test_the_ort_target_is_not_legalized(artifact):
    """ORT keeps what serves it (TensorScatter, IsNaN, on-device Cos/Sin): the check can fail."""
    model = onnx.load(str(artifact("llama_gqa", "tlm", "ort") / "model.onnx"), load_external_data=False)
    flagged = {u.op for u in without_precedent(model)}
    assert {"TensorScatter", "IsNaN", "Cos", "Sin"} <= flagged


def test_precedent_data_has_a_source_for_every_op():
    precedent = load_precedent()
    assert len(precedent) >= 40 and all(p.source for p in precedent.values())
    assert precedent[("com.qualcomm.cloud", "CtxScatter")].source.startswith("customop/ctx_scatter_gather.py")
    assert not {op for _, op in precedent} & AVOIDED
    lines = [x for x in PRECEDENT_FILE.read_text().splitlines() if x and not x.startswith("#")]
    assert len(lines) == len(precedent), "one line per op, no duplicates"


def test_op_uses_include_function_bodies(artifact):
    model = onnx.load(str(artifact("gpt2", "dlm") / "model.onnx"), load_external_data=False)
    uses = op_uses(model)
    call = next(u for u in uses if u.op == "CtxScatter")
    assert call.local_function and call.domain == "com.qualcomm.cloud" and call.where == "graph"
    assert any(u.op == "ScatterND" and u.where == "function com.qualcomm.cloud::CtxScatter" for u in uses)
    sets = op_set(model)
    assert "ScatterND" in sets["functions"]["com.qualcomm.cloud::CtxScatter"]
    assert "ScatterND" not in sets["graph"] and "com.qualcomm.cloud::CtxScatter" in sets["graph"]


# --------------------------------------------------------------------------- --supported-ops

@pytest.mark.parametrize("text,ops", [
    ("Add\nMul\n\n# a comment\nMatMul  # trailing\n", {"Add", "Mul", "MatMul"}),
    ("ONNX operators supported\nAdd 1,6,7,13,14\nArgMax 1,11,12,13 Only default select_last_index\n",
     {"ONNX", "Add", "ArgMax"}),
    ("| Operator | Opset |\n| --- | --- |\n| Add | 13 |\n| ai.onnx:Softmax | 13 |\n", {"Operator", "Add", "Softmax"}),
    ("Add, Sub, Mul;Div\n", {"Add", "Sub", "Mul", "Div"}),
    ("ai.onnx:Gather\nGatherND-13\nScatterND(16)\ncom.qualcomm.cloud::CtxScatter\n",
     {"Gather", "GatherND", "ScatterND", "CtxScatter"}),
])
def test_read_supported_ops_accepts_the_plausible_layouts(tmp_path, text, ops):
    f = tmp_path / "ops.txt"
    f.write_text(text)
    assert read_supported_ops(f) == ops


def test_read_supported_ops_refuses_an_empty_or_missing_list(tmp_path):
    from specdec_compile.errors import SpecdecError

    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    with pytest.raises(SpecdecError, match="no operator names found"):
        read_supported_ops(tmp_path / "empty.txt")
    with pytest.raises(SpecdecError, match="(?i)no such file"):
        read_supported_ops(tmp_path / "absent.txt")


def _compile(fixture_path, tmp_path, *extra):
    return cli.main([str(fixture_path("gptj")), "--role", "dlm", "--ctx-len", str(CL), "--prefill-len", str(PL),
                     "-o", str(tmp_path / "out"), *extra])


def test_supported_ops_refuses_a_short_list_naming_each_missing_op(fixture_path, tmp_path, capsys, artifact):
    model = onnx.load(str(artifact("gptj", "dlm") / "model.onnx"), load_external_data=False)
    full = {u.op for u in op_uses(model) if not u.local_function}
    short = sorted(full - {"LayerNormalization", "ScatterND"})
    (tmp_path / "ops.txt").write_text("\n".join(short) + "\n")
    assert _compile(fixture_path, tmp_path, "--supported-ops", str(tmp_path / "ops.txt")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3, err
    assert "op LayerNormalization (node '/transformer/h.0/ln_1/LayerNormalization') is not in" in err[0]
    assert "op ScatterND (node " in err[1] and "in function com.qualcomm.cloud::CtxScatter" in err[1]
    assert "2 op(s)" in err[2] and "LayerNormalization, ScatterND" in err[2] and "nothing written" in err[2]
    assert not (tmp_path / "out").exists()
    assert not_supported(model, set(short)) and not_supported(model, full) == []


def test_supported_ops_accepts_a_complete_list(fixture_path, tmp_path, capsys, artifact):
    model = onnx.load(str(artifact("gptj", "dlm") / "model.onnx"), load_external_data=False)
    (tmp_path / "ops.txt").write_text(", ".join(sorted({u.op for u in op_uses(model)})) + "\n")
    assert _compile(fixture_path, tmp_path, "--supported-ops", str(tmp_path / "ops.txt")) == 0
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_supported_ops_needs_the_qaic_target_and_a_readable_file(fixture_path, tmp_path, capsys):
    (tmp_path / "ops.txt").write_text("Add\n")
    assert _compile(fixture_path, tmp_path, "--supported-ops", str(tmp_path / "ops.txt"), "--target", "ort") == 2
    assert "needs --target qaic" in capsys.readouterr().err
    assert _compile(fixture_path, tmp_path, "--supported-ops", str(tmp_path / "nope.txt")) == 2
    err = capsys.readouterr().err
    assert "--supported-ops" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_docs_list_the_precedent_of_every_qaic_op():
    from pathlib import Path

    from specdec_compile.artifact.qaic_ops import render_precedent_table

    doc = (Path(__file__).resolve().parents[2] / "docs" / "qaic-ops.md").read_text()
    assert render_precedent_table() in doc, "regenerate the table: qaic_ops.render_precedent_table()"
