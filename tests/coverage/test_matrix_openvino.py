"""The coverage matrix on OpenVINO: every row compiled with ``--target openvino`` (TLM, DLM and
the TLM exposing two layers' hidden states) and verified on OpenVINO's CPU plugin with its cache
in state variables (``verify``'s automatic backend for that target), batch 2, at 1e-4 in f32.
Skipped without openvino. SPECDEC_MATRIX=core runs the core rows only, as test_matrix.py."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from matrix import TLM_HIDDEN, TOL, export_row, run_cell
from test_matrix import SELECTED

pytest.importorskip("openvino")


@pytest.mark.slow
@pytest.mark.parametrize("row", SELECTED, ids=[r.id for r in SELECTED])
def test_row_compiles_for_openvino_and_verifies_on_it(row):
    source = export_row(row)
    with tempfile.TemporaryDirectory(prefix=f"cov-ov-{row.id}-") as d:
        cells = [run_cell(row, source, role, "openvino", Path(d)) for role in ("tlm", "dlm", TLM_HIDDEN)]
    bad = [f"{c.role}: {c.status} {c.reason}" for c in cells if c.status != "pass"]
    assert not bad, f"{row.id}: " + "; ".join(bad)
    assert all(c.max_logits_diff <= TOL for c in cells)
    hidden = cells[-1]
    assert hidden.max_hidden_diff is not None and hidden.max_hidden_diff <= TOL
