"""Pass batch_index (--interface qeff): a cache of full_batch_size rows, routed by batch_index."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes, pipeline
from specdec_compile.errors import UnsupportedPatternError
from specdec_compile.options import Options


def _upto_canonical(path, target):
    g, det = load(path)
    c = ctx(det, role="tlm", target=target, ctx_len=16, interface="qeff", continuous_batching=True)
    for p in passes.select("tlm", target, "qeff"):
        if p.name == "batch_index":
            return g, c
        g = p.run(g, c)


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_batch_index_adds_the_input_and_cache_rows(fixture_path, target):
    g, c = _upto_canonical(fixture_path("llama_gqa"), target)
    before = serialized(g)
    out = passes.batch_index(g, c)
    assert serialized(g) == before, "the input graph is untouched"
    bi = out.inputs[-1]
    assert bi.name == "batch_index" and bi.shape == ["batch_size", 1] and bi.dtype == np.int64
    pasts = [t for t in out.inputs if t.name.startswith("past_")]
    assert all(t.shape[0] == "full_batch_size" for t in pasts)
    ops = {(n.domain or "", n.op) for n in out.nodes}
    assert not any(op == "CacheWrite" for _, op in ops)
    if target == "qaic":
        assert ("com.qualcomm.cloud", "CtxScatterCB") in ops and ("com.qualcomm.cloud", "CtxGatherCB") in ops
        assert {f.name for f in out.functions} >= {"CtxScatterCB", "CtxGatherCB"}
    else:
        assert ("", "ScatterND") in ops and ("", "GatherND") in ops


def test_batch_index_needs_cache_writes():
    g = gs.Graph(inputs=[], outputs=[])
    with pytest.raises(UnsupportedPatternError, match="no cache writes"):
        passes.batch_index(g, ctx(target="ort"))


def _run(model, ids, pos, rows, state):
    s = session(model)
    names = [o.name for o in s.get_outputs()]
    feed = {"input_ids": ids, "position_ids": pos, **state}
    if rows is not None:
        feed["batch_index"] = np.asarray(rows, np.int64).reshape(-1, 1)
    out = dict(zip(names, s.run(names, feed)))
    return out["logits"], {k: out[k + "_RetainedState"] for k in state}


@pytest.mark.parametrize("target", ["ort", "qaic"])
def test_rows_are_routed_and_padding_changes_nothing(fixture_path, target):
    """A row prefilled at batch 1 into cache row 2 decodes, inside a call of 3 rows routed out of
    order, to the logits the default interface gives that prompt alone; the cache rows the call does
    not name are unchanged, and a left-padded row (QEfficient's decode form) writes only its token."""
    path = fixture_path("llama_gqa")
    qeff = pipeline.rewrite(path, Options(role="dlm", target=target, ctx_len=16, prefill_len=8, interface="qeff",
                                          continuous_batching=True)).model
    ours = pipeline.rewrite(path, Options(role="dlm", target=target, ctx_len=16, prefill_len=8)).model
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, 211, (1, 6))
    zeros = {f"past_{kind}.{i}": np.zeros((4, 2, 16, 16), np.float32) for i in range(2) for kind in ("key", "value")}
    _, cache = _run(qeff, prompt, np.arange(6)[None], [2], zeros)
    assert all(np.abs(v[[0, 1, 3]]).max() == 0 for v in cache.values()), "only row 2 is written"
    one = {k: v[:1] for k, v in zeros.items()}
    _, alone = _run(ours, prompt, np.arange(6)[None], None, one)
    nxt = rng.integers(3, 211, (3, 3))
    pos = np.array([[-1, -1, 6], [0, 1, 2], [-1, -1, -1]])          # row 0 left-padded, row 2 idle
    got, after = _run(qeff, nxt, pos, [2, 0, 3], cache)
    want, _ = _run(ours, nxt[:1, 2:], np.array([[6]]), None, alone)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    for k in cache:
        np.testing.assert_array_equal(after[k][1], cache[k][1])           # row 1: not in the call
        np.testing.assert_array_equal(after[k][3], cache[k][3])           # row 3: idle
        np.testing.assert_array_equal(after[k][2][:, :6], cache[k][2][:, :6])
        assert np.abs(after[k][2][:, 7:]).max() == 0, "the padded columns wrote nothing"
