"""--interface qeff over the coverage matrix's families (tests/coverage): for each row, both roles
and both targets (run on ONNX Runtime), QEfficient's continuous-batching calls give, row by row, the
logits of the default interface's graph for the same target (itself verified against the export by
the matrix) run on each prompt alone.

A quick selection of rows by default (plain, ALiBi, sliding window, synthesized positions, MoE,
latent attention, dynamo, partial rotary, learned positions); SPECDEC_QEFF_ALL=1 runs every row
(all 39 passed on ort, 2026-11-24; CONTRACT.md section 7)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from qeff_helpers import Replay

from specdec_compile.errors import SpecdecError
from specdec_compile.pipeline import rewrite
from specdec_compile.options import Options

QUICK = ("llama", "gpt2", "codegen", "bloom", "mistral", "gemma2", "qwen3_moe", "deepseek_v3", "opt",
         "gpt_neox", "falcon-alibi", "llama-dynamo")
K, PL, CL, FBS = 3, 8, 32, 3
TOL = 1e-5


def _rows():
    from families import rows
    found = rows()[0]
    if os.environ.get("SPECDEC_QEFF_ALL"):
        return found
    return [r for r in found if r.id in QUICK]


def _calls(rng, vocab: int):
    """(prompt, prefill positions) of rows 0..2 (row 2 empty), then one wide call's ids and positions."""
    a, b = rng.integers(3, vocab, 5), rng.integers(3, vocab, 8)
    wide = rng.integers(3, vocab, (FBS, K + 1))
    pos = np.array([[5, 6, 7, 8], [8, 9, -1, -1], [-1, -1, -1, -1]])      # row 2 idle
    return {1: a, 0: b}, wide, pos


def _run_qeff(model, role, prompts, wide, pos):
    q = Replay(model, FBS)
    for row, p in prompts.items():
        ids = np.concatenate([p, np.zeros(PL - len(p), np.int64)])[None]
        q(ids, np.concatenate([np.arange(len(p)), -np.ones(PL - len(p), np.int64)])[None], [row],
          1 if role == "tlm" else None)
    order = [1, 0, 2]     # call row r is cache row order[r]
    ids, p = wide[order], pos[order]
    if role == "dlm":
        ids, p = ids[:, :1], p[:, :1]
    return q(ids, p, order, K + 1 if role == "tlm" else None), order


def _run_default(model, role, prompts, wide, pos, order):
    out = {}
    for r, cache_row in enumerate(order):
        if cache_row not in prompts:
            continue
        d = Replay(model, 1)
        p = prompts[cache_row]
        d(np.concatenate([p, np.zeros(PL - len(p), np.int64)])[None],
          np.concatenate([np.arange(len(p)), -np.ones(PL - len(p), np.int64)])[None])
        ids, q = wide[cache_row:cache_row + 1], pos[cache_row:cache_row + 1]
        out[r] = d(ids[:, :1], q[:, :1]) if role == "dlm" else d(ids, q)
    return out


@pytest.mark.parametrize("target", ["ort", "qaic"])
@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.id)
def test_qeff_rows_equal_the_default_interface(row, target):
    from matrix import export_row
    try:
        source = export_row(row)
    except Exception as e:  # the matrix marks such a row "export failed"; not this test's subject
        pytest.skip(f"export failed: {' '.join(str(e).split())[:120]}")
    for role in ("tlm", "dlm"):
        try:
            ours = rewrite(str(source), Options(role=role, target=target, k=K if role == "tlm" else None, ctx_len=CL))
        except SpecdecError as e:
            pytest.skip(f"refused by the default interface too: {e}")
        qeff = rewrite(str(source),
                       Options(role=role, target=target, k=K if role == "tlm" else None, ctx_len=CL, interface="qeff",
                               continuous_batching=True))
        prompts, wide, pos = _calls(np.random.default_rng(7), ours.info.vocab_size)
        got, order = _run_qeff(qeff.model, role, prompts, wide, pos)
        assert np.isfinite(got).all()
        for r, want in _run_default(ours.model, role, prompts, wide, pos, order).items():
            valid = int((pos[order[r]] >= 0).sum()) if role == "tlm" else 1
            np.testing.assert_allclose(got[r, :valid], want[0, :valid], atol=TOL, err_msg=f"{role} row {r}")
