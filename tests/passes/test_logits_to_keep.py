"""Pass logits_to_keep (--interface qeff, TLM): QEfficient's num_logits_to_keep."""
from __future__ import annotations

import numpy as np
import pytest
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes


def _canonical(path):
    g, det = load(path)
    c = ctx(det, role="tlm", target="ort", ctx_len=16)
    for p in passes.select("tlm", "ort"):
        if p.name == "rotary_tables":
            break
        g = p.run(g, c)
    return g, c


def _feeds(sess, ids, pos):
    f = {"input_ids": ids, "position_ids": pos}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            f[i.name] = np.zeros((ids.shape[0], i.shape[1], 16, i.shape[3]), np.float32)
    return f


@pytest.mark.parametrize("fixture", ["llama_gqa", "codegen"])
def test_keeps_the_n_positions_ending_at_the_last_valid(fixture_path, fixture):
    """Rows of the full logits: L+1-n .. L for the last valid column L, or 0 .. n-1 when L+1 < n
    (QEfficient's filter_hidden_states), with n read from the input's shape alone."""
    g, c = _canonical(fixture_path(fixture))
    before = serialized(g)
    kept = passes.logits_to_keep(g, c)
    assert serialized(g) == before, "the input graph is untouched"
    nlk = kept.inputs[-1]
    assert nlk.name == "num_logits_to_keep" and nlk.shape == ["num_logits_to_keep", 1]
    rng = np.random.default_rng(5)
    ids = rng.integers(3, 211, (3, 5))
    pos = np.array([[0, 1, 2, 3, 4], [0, 1, -1, -1, -1], [3, 4, 5, 6, -1]])
    ref = session(g)
    full = ref.run(["logits"], _feeds(ref, ids, pos))[0]
    sess = session(kept)
    for n in (1, 2, 4):
        got = sess.run(["logits"], {**_feeds(sess, ids, pos), "num_logits_to_keep": np.full((n, 1), 7, np.int64)})[0]
        assert got.shape == (3, n, 211)
        for row, last in enumerate((4, 1, 3)):
            start = max(last + 1 - n, 0)
            np.testing.assert_allclose(got[row], full[row, start:start + n], atol=1e-5)


def test_picks_before_the_head(fixture_path):
    g, c = _canonical(fixture_path("llama_gqa"))
    kept = passes.logits_to_keep(g, c)
    logits = next(t for t in kept.outputs if t.name == "logits")
    assert logits.shape == ["batch_size", "num_logits_to_keep", 211]
    head = logits.inputs[0]
    assert head.op == "MatMul" and head.inputs[0].inputs[0].op == "GatherElements"
