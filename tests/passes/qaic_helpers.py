"""Shared by the tests of the qaic legalization passes: a fixture run through
the pipeline up to one pass, and a numerical comparison of two graphs with the
contract's interface (random tokens, history in the cache, right padding)."""
from __future__ import annotations

import numpy as np
from pass_helpers import load, session

from specdec_compile import passes
from specdec_compile.contract import INPUT_IDS, LOGITS, POSITION_IDS
from specdec_compile.passes import PassContext

CTX_LEN = 64


def pipeline_until(path, name: str, role: str = "tlm", target: str = "qaic"):
    """(graph just before pass ``name`` of a qaic compile, its context)."""
    g, det = load(path)
    ctx = PassContext(detection=det, role=role, target=target, k=3, source_opset=g.opset, ctx_len=CTX_LEN)
    for p in passes.select(role, target):
        if p.name == name:
            return g, ctx
        g = p.run(g, ctx)
    raise KeyError(name)


def _feeds(sess, rng):
    """Two rows: one with 7 valid tokens and 1 padding at positions 20.., one all valid at 0.."""
    feeds = {INPUT_IDS: rng.integers(0, 211, (2, 8)),
             POSITION_IDS: np.array([[20, 21, 22, 23, 24, 25, 26, -1], list(range(8))])}
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            cache = rng.standard_normal((2, i.shape[1], CTX_LEN, i.shape[3])).astype(np.float32)
            cache[1, :, 8:] = 0.0  # row 1 has no history
            feeds[i.name] = cache
    return feeds


def assert_same_outputs(before, after, *, padded_logits: bool = True, atol: float = 0.0) -> None:
    """Run both graphs on the same feeds; logits (at padded positions too, unless
    ``padded_logits`` is False) and every retained cache must agree."""
    a, b = session(before), session(after)
    feeds = _feeds(a, np.random.default_rng(0))
    names = [o.name for o in a.get_outputs()]
    want = dict(zip(names, a.run(names, feeds)))
    got = dict(zip(names, b.run(names, feeds)))
    for n in names:
        x, y = want[n], got[n]
        if n == LOGITS and not padded_logits and x.shape[1] == 8:
            x, y = x[:, :7], y[:, :7]
        np.testing.assert_allclose(y, x, atol=atol, rtol=0, err_msg=n)
