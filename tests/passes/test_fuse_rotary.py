"""Pass fuse_rotary (ort): each q/k rotation read from rotary_tables' tables becomes one ONNX
RotaryEmbedding; the outputs stay those of the unfused graph and of the original export (1e-4),
ONNX Runtime runs the op as it is, and a rotation in any other form is left alone."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from pass_helpers import serialized
from qaic_helpers import CTX_LEN, assert_same_outputs, pipeline_until

import dataclasses

from specdec_compile import passes, pipeline
from specdec_compile.passes import PassContext
from specdec_compile.passes.fuse_rotary import find_sites, with_tables
from specdec_compile.verify import verify
from specdec_compile.options import Options

ROTARY = ["llama_gqa", "llama_dynamo", "qwen2", "mistral", "phi3", "gpt_neox", "llama3_rope", "qwen2_yarn"]


def _until(path):
    """The graph fuse_rotary gets in an ort compile with its rotary read from tables (what the
    pass does first), and the context with the pass switched on."""
    g, ctx = pipeline_until(path, "fuse_rotary", target="ort")
    ctx = dataclasses.replace(ctx, fuse_rotary=True)
    return with_tables(g, ctx), ctx


def test_off_by_default_it_changes_nothing(fixture_path):
    """The default compile keeps the export's own rotation (bit for bit the export's rounding)."""
    g, ctx = pipeline_until(fixture_path("llama_gqa"), "fuse_rotary", target="ort")
    assert not ctx.fuse_rotary and any(n.op == "Cos" for n in g.nodes)
    assert passes.fuse_rotary(g, ctx) is g
    model = pipeline.compile_model(str(fixture_path("llama_gqa")), Options(role="dlm", target="ort", ctx_len=64))
    assert not any(n.op_type in ("RotaryEmbedding", "Gather") and "rotary" in n.name for n in model.graph.node)
    assert "specdec.ctx_len" not in {p.key for p in model.metadata_props}   # any context length


def test_on_its_context_is_fixed_and_recorded(fixture_path):
    """The tables hold ctx_len rows: the fused graph records its context, as a qaic graph does."""
    model = pipeline.compile_model(str(fixture_path("llama_gqa")),
                                   Options(role="dlm", target="ort", ctx_len=64), fuse_rotary=True)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["specdec.ctx_len"] == "64"
    assert not any(n.op_type in ("Cos", "Sin") for n in model.graph.node)


def test_the_tables_are_the_exports_own_bits(fixture_path):
    """Before fusing: the tables (ONNX Runtime's kernels, the export's dtypes) leave the graph's
    outputs bit for bit those of the graph computing Cos/Sin per call (valid positions)."""
    g, ctx = pipeline_until(fixture_path("llama_gqa"), "fuse_rotary", target="ort")
    tab = with_tables(g, dataclasses.replace(ctx, fuse_rotary=True))
    assert not any(n.op in ("Cos", "Sin") for n in tab.nodes)
    assert_same_outputs(g, tab, padded_logits=False, atol=0.0)


def _ops(g) -> dict:
    out: dict = {}
    for n in g.nodes:
        out[n.op] = out.get(n.op, 0) + 1
    return out


@pytest.mark.parametrize("name", ROTARY)
def test_every_rotation_is_one_rotary_embedding(fixture_path, name):
    """q and k of every layer; the input graph untouched; no Neg (rotate_half) left; the
    outputs those of the graph before the pass (logits and every cache, padding included)."""
    g, ctx = _until(fixture_path(name))
    sites, skipped = find_sites(g)
    assert len(sites) == 2 * ctx.detection.info.num_layers and not skipped, skipped
    before = serialized(g)
    out = passes.fuse_rotary(g, ctx)
    assert serialized(g) == before
    ops = _ops(out)
    assert ops.get("RotaryEmbedding") == len(sites) and "Neg" not in ops
    assert sum(_ops(g).values()) - sum(ops.values()) >= 6 * len(sites)
    assert_same_outputs(g, out, atol=1e-5)


def test_the_interleaved_layout_fuses_too():
    """Cohere (coverage row): rotate_half over interleaved pairs, tables from repeat_interleave;
    one RotaryEmbedding(interleaved=1) each, the outputs those of the unfused graph."""
    from families import rows
    from matrix import export_row
    row = next(r for r in rows()[0] if r.id == "cohere")
    g, ctx = _until(export_row(row))
    sites, skipped = find_sites(g)
    assert len(sites) == 2 * ctx.detection.info.num_layers and not skipped, skipped
    assert all(s.interleaved for s in sites)
    out = passes.fuse_rotary(g, ctx)
    assert [n.attrs["interleaved"] for n in out.nodes if n.op == "RotaryEmbedding"] == [1] * len(sites)
    assert_same_outputs(g, out, atol=1e-5)


def test_the_compiled_rewrite_verifies_against_the_export(fixture_path, tmp_path):
    """The whole ort pipeline, fused, against the original export (the contract's 1e-4)."""
    model = pipeline.compile_model(str(fixture_path("llama_gqa")),
                                   Options(role="tlm", target="ort", k=3, ctx_len=64), fuse_rotary=True)
    assert sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) == 4
    onnx.checker.check_model(model, full_check=True)
    report = verify(fixture_path("llama_gqa"), model, k=3, prefill_len=16, ctx_len=64,
                    original_source=fixture_path("llama_gqa"))
    assert report.ok, report.per_shape()
    assert report.max_logits_diff <= 1e-4


def test_onnx_runtime_runs_the_fused_op(fixture_path, tmp_path):
    """What the session actually runs (its optimized model dump): one RotaryEmbedding per q/k per
    layer, and no rotate_half (Neg) anywhere."""
    model = pipeline.compile_model(str(fixture_path("llama_gqa")),
                                   Options(role="dlm", target="ort", ctx_len=64), fuse_rotary=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert ops.count("RotaryEmbedding") == 4 and "Neg" not in ops


@pytest.mark.parametrize("name", ["gpt2", "gptj"])
def test_no_rotate_half_is_a_no_op(fixture_path, name):
    """GPT-2 has no rotary; GPT-J rotates interleaved pairs from its own table: left as is."""
    g, ctx = _until(fixture_path(name))
    assert find_sites(g) == ([], [])
    assert serialized(passes.fuse_rotary(g, ctx)) == serialized(g)


def test_below_opset_23_is_left_alone(fixture_path):
    g, ctx = _until(fixture_path("llama_gqa"))
    g.opset = 22
    assert serialized(passes.fuse_rotary(g, ctx)) == serialized(g)


def test_a_position_past_the_table_is_an_error_not_a_read(fixture_path):
    """The kernel checks the row range as the Gather did: padding (-1) reads row 0, and a position
    >= ctx_len fails the run (the contract never sends one)."""
    g, ctx = _until(fixture_path("llama_gqa"))
    from pass_helpers import session
    sess = session(passes.fuse_rotary(g, ctx))
    feeds = {"input_ids": np.zeros((1, 2), np.int64), "position_ids": np.array([[CTX_LEN - 1, -1]])}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            feeds[i.name] = np.zeros((1, i.shape[1], CTX_LEN, i.shape[3]), np.float32)
    sess.run(None, feeds)
    feeds["position_ids"] = np.array([[CTX_LEN, -1]])
    with pytest.raises(Exception, match="out of range"):
        sess.run(None, feeds)


def test_needs_only_a_context():
    with pytest.raises(TypeError, match="PassContext"):
        passes.fuse_rotary(None, None)
    assert passes.get("fuse_rotary").targets == ("ort",)
    assert isinstance(PassContext(), PassContext)
