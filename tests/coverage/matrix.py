"""Run one row of the coverage matrix: export (cached), compile both roles for
both targets, verify each against the export; then one more TLM per target
exposing the hidden states of two layers (``HIDDEN``), verified against the
export's own internal tensors. Used by tests/coverage/ and
by scripts/coverage_matrix.py (which writes docs/coverage.md). Imported by its
bare name, like families.py beside it: pytest has tests/coverage on its path
(pyproject.toml), the script puts it there."""
from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx

from families import Row
from models import export_spec

from specdec_compile.errors import SpecdecError
from specdec_compile.pipeline import rewrite
from specdec_compile.verify import verify
from specdec_compile.options import Options

#: speculation length, prefill chunk, context (> the families' window), rows per call
K, PL, CL, BATCH = 4, 16, 64, 2
ROLES = ("tlm", "dlm")
TARGETS = ("qaic", "ort")
TOL = 1e-4
#: the layers the extra TLM cell exposes (the tiny models have 2: both, first and last)
HIDDEN = (0, -1)
#: the role label of that cell
TLM_HIDDEN = "tlm+hidden"


@dataclass
class Cell:
    """One (row, role, target): ``status`` is pass | fail | refused | export failed."""
    row: str
    family: str
    exporter: str
    role: str
    target: str
    status: str
    max_logits_diff: float | None = None
    reason: str = ""
    seconds: float = 0.0
    #: the sliding windows detection found, per layer (None: none)
    windows: list | None = None
    #: the hidden_states output against the export's internal tensors (the TLM_HIDDEN cell)
    max_hidden_diff: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def spec_of(row: Row) -> dict:
    return {"kind": row.family, "exporter": row.exporter, "config": row.config}


def export_row(row: Row) -> Path:
    return export_spec(f"cov-{row.id}", spec_of(row))


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return (text[:300] + "...") if len(text) > 300 else text


def run_cell(row: Row, source: Path, role: str, target: str, work: Path) -> Cell:
    t0 = time.perf_counter()
    cell = Cell(row.name, row.family, row.exporter, role, target, "refused")
    hidden = HIDDEN if role == TLM_HIDDEN else None
    try:
        res = rewrite(str(source), Options(role="tlm" if hidden else role, target=target,
                                           k=K if role != "dlm" else None, hidden_states=hidden))
    except SpecdecError as e:
        cell.reason = _one_line(e)
        cell.seconds = time.perf_counter() - t0
        return cell
    cell.windows = [layer.window for layer in res.detection.layers]
    out = work / f"{row.id}-{role}-{target}.onnx"
    onnx.save(res.model, str(out))
    try:
        report = verify(source, out, k=K, prefill_len=PL, ctx_len=CL, batch_size=BATCH, tol=TOL)
    except SpecdecError as e:
        cell.status, cell.reason = "fail", f"verify: {_one_line(e)}"
        cell.seconds = time.perf_counter() - t0
        return cell
    cell.max_logits_diff = report.max_logits_diff
    cell.max_hidden_diff = report.max_hidden_diff if hidden else None
    cell.status = "pass" if report.ok else "fail"
    if not report.ok:
        bad = [r for r in report.per_shape() if r["logits_max_abs_diff"] > TOL or r["cache_max_abs_diff"] > TOL
               or r["hidden_max_abs_diff"] > TOL or r["history_changed"] or r["non_finite"]]
        cell.reason = "; ".join(f"{r['shape']}: logits {r['logits_max_abs_diff']:.2e} cache "
                                f"{r['cache_max_abs_diff']:.2e} hidden {r['hidden_max_abs_diff']:.2e}"
                                for r in bad[:3])
    cell.seconds = time.perf_counter() - t0
    return cell


def run_row(row: Row) -> list[Cell]:
    """Every (role, target) cell of ``row``, then the hidden-states cell of each target; an
    export failure fills all six."""
    try:
        source = export_row(row)
    except Exception as e:  # an exporter failure is a row of the matrix, not a crash
        return [Cell(row.name, row.family, row.exporter, r, t, "export failed",
                     reason="..." + " ".join(str(e).split())[-300:])
                for r, t in _cells(row)]
    with tempfile.TemporaryDirectory(prefix=f"cov-{row.id}-") as d:
        return [run_cell(row, source, r, t, Path(d)) for r, t in _cells(row)]


def _cells(row: Row) -> list[tuple[str, str]]:
    return [(r, t) for r in ROLES for t in TARGETS] + [(TLM_HIDDEN, t) for t in TARGETS]
