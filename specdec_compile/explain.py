"""What each compile pass changed: the pipeline run with recording on, its snapshots diffed.

The pipeline side of ``specdec-compile MODEL ... --explain`` and
``specdec-compile diff --passes ORIGINAL``: ``pipeline.rewrite(record=True)``
gives ``[("original", m0), (pass, m1), ...]``; the diff library compares each
snapshot with the one before (and the first with the last) and renders the
report. The pass names shown are the ones the pipeline recorded.

    explain_result(res) -> dict                                 # res: rewrite(..., record=True)
    explain_file(path, *, role, target="qaic", k=None) -> dict  # runs the pipeline
"""
from __future__ import annotations

from . import pipeline
from .diff import diff_snapshots, resolve_model_path
from .model_io import load_model
from .options import Options


def explain_result(res: pipeline.CompileResult) -> dict:
    """The explain report of a ``pipeline.rewrite(..., record=True)`` result."""
    return diff_snapshots(res.snapshots, base_dir=res.source_dir)


def explain_file(path, *, role: str, target: str = "qaic", k: int | None = None) -> dict:
    """Compile ``path`` (a model or an artifact directory) with recording on and explain its passes."""
    p = resolve_model_path(path)
    load_model(p)  # one-line errors for missing / truncated files before the pipeline runs
    if k is None and role == "tlm":
        k = 1   # no pass's graph depends on k (--k is optional here)
    rep = explain_result(pipeline.rewrite(str(p), Options(role=role, target=target, k=k), record=True))
    rep["source"] = str(path)
    rep["role"], rep["target"] = role, target
    return rep
