"""Pass dense_experts (qaic): HF's sparse MoE routing (NonZero per expert) becomes
dense, exactly: on a hand-built block in both mask orientations, and on the tiny
qwen3_moe and deepseek_v3 exports of the coverage matrix (both roles, verified
against the export); anything that is not exactly that routing is left alone."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from moe_graphs import moe_block, reference
from pass_helpers import serialized, session

from specdec_compile import cli, passes
from specdec_compile.passes import PassContext
from specdec_compile.artifact.qaic_ops import without_precedent
from specdec_compile.verify import verify


def _ops(g):
    return [n.op for n in g.nodes]


def _run(g, x):
    return session(g).run(None, {"x": x})


@pytest.mark.parametrize("perm", [(2, 1, 0), (2, 0, 1)], ids=["mask-slot-token", "mask-token-slot"])
def test_every_expert_becomes_dense_and_the_output_is_unchanged(perm):
    g = moe_block(perm=perm)
    before = serialized(g)
    out = passes.dense_experts(g, PassContext())
    assert serialized(g) == before, "the input graph is untouched"
    assert "NonZero" not in _ops(out) and "NonZero" in _ops(g)
    x = np.random.default_rng(1).standard_normal((13, 8)).astype(np.float32)
    x[5] = 0.0  # a row of zeros (a quiet token) routes like any other
    want, got = _run(g, x)[0], _run(out, x)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, reference(x, g), rtol=0, atol=1e-5)
    one = x[:1]  # a single token: each expert has zero or one pair
    np.testing.assert_allclose(_run(out, one)[0], _run(g, one)[0], rtol=0, atol=1e-6)


def test_a_token_that_did_not_choose_an_overflowing_expert_gets_exactly_nothing_from_it():
    """Dense computes expert 3 on every token; where its output is inf, y * 0 would be NaN."""
    g = moe_block(overflow=True)
    out = passes.dense_experts(g, PassContext())
    x = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    want, got = _run(g, x)[0], _run(out, x)[0]
    assert np.isfinite(want).any(axis=1).sum() > 0 and not np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # inf and NaN where the export has them, only


def test_with_flatten_to_reshape_every_op_has_precedent():
    g = passes.flatten_to_reshape(passes.dense_experts(moe_block(), PassContext()), PassContext())
    assert without_precedent(gs.export_onnx(g)) == []


@pytest.mark.parametrize("knob,sparse_left", [
    ({"on_off": (0, 2)}, 4),       # the mask is not 0/1: its weights would be scaled by 2
    ({"mix_rows": True}, 1),       # expert 1 mixes tokens (a sum over rows): dense would change its rows
    ({"leak_scaled": True}, 1),    # expert 2's per-pair rows are a graph output: dense would change them
])
def test_what_is_not_exactly_the_routing_is_left_alone(knob, sparse_left):
    g = moe_block(**knob)
    out = passes.dense_experts(g, PassContext())
    assert _ops(out).count("NonZero") == sparse_left
    x = np.random.default_rng(2).standard_normal((9, 8)).astype(np.float32)
    for want, got in zip(_run(g, x), _run(out, x)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_graph_without_nonzero_is_returned_as_is():
    dense = passes.dense_experts(moe_block(), PassContext())
    assert passes.dense_experts(dense, PassContext()) is dense


def _coverage_export(row_id):
    from families import rows  # tests/coverage, on pytest's path (pyproject.toml)
    from matrix import export_row

    return export_row(next(r for r in rows()[0] if r.id == row_id))


@pytest.mark.slow
@pytest.mark.parametrize("role", ["tlm", "dlm"])
@pytest.mark.parametrize("row_id", ["qwen3_moe", "deepseek_v3"])
def test_moe_exports_lower_to_ops_with_precedent_and_verify(row_id, role, tmp_path):
    """The coverage matrix's settings: batch 2, padded rows, k 4, prefill 16, context 64, 1e-4."""
    source = _coverage_export(row_id)
    original = onnx.load(str(source), load_external_data=False)
    assert {"NonZero", "Flatten"} <= {n.op_type for n in original.graph.node}
    out = tmp_path / "art"
    argv = [str(source), "--role", role, "--target", "qaic", "--prefill-len", "16", "--ctx-len", "64", "-o", str(out)]
    assert cli.main(argv + (["--k", "4"] if role == "tlm" else [])) == 0
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert without_precedent(model) == [], [u.describe() for u in without_precedent(model)]
    assert not {"NonZero", "Flatten"} & {n.op_type for n in model.graph.node}
    report = verify(source, out / "model.onnx", k=4, prefill_len=16, ctx_len=64, batch_size=2, tol=1e-4)
    assert report.ok and report.max_logits_diff <= 1e-4, report.per_shape()
