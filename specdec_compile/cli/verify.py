"""``specdec-compile verify ORIGINAL REWRITTEN``: numerical equivalence of a rewrite and its export.

The command line over ``specdec_compile.verify``: defaults from the artifact's
manifest, the report as a table (or JSON), the exit status.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..contract import MANIFEST_FILE, MODEL_FILE, SPECIALIZATIONS_FILE
from ..errors import SpecdecError
from ..model_io import load_model, resolve_model_path
from ..artifact.manifest import Manifest
from ..options import MAX_BATCH_SIZE, MAX_CTX_LEN, check_options
from ..verify.replay import VerifyReport, check_verify_options, compiled_ctx_len, history_past_windows, verify
from .common import Parser, add_progress_flags, start_progress


def defaults_from_manifest(rewritten: Path) -> dict:
    """k, prefill_len, ctx_len, batch_size and the call widths (specializations) of the artifact REWRITTEN
    sits in ({} outside an artifact); a manifest whose shapes no verification can use is refused
    in one line naming it (``check_options``' bounds, widths 1 to ctx_len)."""
    if not (rewritten.parent / MANIFEST_FILE).exists():
        return {}
    m = Manifest.read(rewritten.parent)
    where = rewritten.parent / MANIFEST_FILE
    try:
        check_options(k=m.k, prefill_len=m.prefill_len, ctx_len=m.ctx_len, batch_size=m.batch_size, optional=True)
    except SpecdecError as e:
        raise SpecdecError(f"{where}: {e}") from None
    _check_graph_agrees(m, rewritten, where)
    if rewritten.resolve() == (rewritten.parent / MODEL_FILE).resolve():
        from ..artifact.records import check_digests
        check_digests(rewritten.parent, m)
    widths = list(m.specializations or [])
    bad = [w for w in widths if not 1 <= w <= m.ctx_len]
    if bad:
        raise SpecdecError(f"{where}: specializations lists seq_len {bad[0]}, outside 1 to ctx_len {m.ctx_len}")
    spec_file = rewritten.parent / SPECIALIZATIONS_FILE
    if spec_file.is_file():    # the widths verified are the compiled ones: an edited list drops none
        from ..artifact.reader import check_listed_seq_lens, read_specializations
        specs = read_specializations(spec_file)
        check_listed_seq_lens(rewritten.parent, m, specs)
        listed = [s["seq_len"] for s in specs]
        if not widths:
            raise SpecdecError(f"{rewritten.parent}: {MANIFEST_FILE} lists the seq_lens [] but "
                               f"{SPECIALIZATIONS_FILE} has {listed}")
    out = {"prefill_len": m.prefill_len, "ctx_len": m.ctx_len, "widths": widths}
    if m.batch_size is not None:     # every compiled row (a qeff artifact's batch_index rows too)
        out["batch_size"] = m.batch_size
    if m.k is not None:
        out["k"] = m.k
    return out


def _check_graph_agrees(m: Manifest, rewritten: Path, where: Path) -> None:
    """Refuse a manifest whose role, target, ctx_len or batch is not the graph's (what the graph
    says of itself, ``graph_facts``), or whose ``interface`` is not the graph's inputs and outputs:
    the replay would verify another artifact than it describes. A graph an optimizer changed after
    the compile is named as such first (``check_cache_writes``), before its digests differ."""
    from types import SimpleNamespace
    from ..artifact.graph_facts import graph_claims
    from ..artifact.cache_writes import check_cache_writes, graph_target
    from ..artifact.writer import io_signature
    model = load_model(rewritten)
    check_cache_writes(model, graph_target(model), str(rewritten))   # the likeliest change, named first
    if io_signature(model) != m.interface:
        raise SpecdecError(f"{where}: its interface (inputs and outputs) is not {rewritten}'s")
    claims = graph_claims(SimpleNamespace(model=model))
    for key in ("role", "target", "ctx_len", "batch_size"):
        for got, source in claims[key]:
            if got != getattr(m, key):
                raise SpecdecError(f"{where}: {key} {getattr(m, key)}, but {rewritten} is for {key} {got} ({source})")


def _looks_rewritten(model) -> bool:
    """A graph this compiler wrote (its metadata, or retained-state outputs)."""
    return (any(p.key == "specdec.role" for p in model.metadata_props)
            or any(o.name.endswith("_RetainedState") for o in model.graph.output))


def _check_pair(original: Path, rewritten: Path) -> None:
    """One-line errors for unreadable models and for a pair given in the wrong order."""
    a, b = load_model(original), load_model(rewritten)  # one-line errors before ORT sees them
    if _looks_rewritten(a) and not _looks_rewritten(b):
        raise SpecdecError(f"the two models look swapped: {original} is a rewrite (retained-state graph) and "
                           f"{rewritten} is not; give the stock export first, then the rewrite")


def render(report: VerifyReport, file=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console(file=file or sys.stdout, highlight=False)
    t = Table(box=None, title=f"verify {report.role.upper()}: k={report.k} PL={report.prefill_len} "
                    f"CL={report.ctx_len} B={report.batch_size}")
    for col in ("shape", "seq_len", "calls", "|Δ logits|", "|Δ cache|", "history", "finite"):
        t.add_column(col, justify="right" if col not in ("shape",) else "left", no_wrap=True)
    for r in report.per_shape():
        t.add_row(r["shape"], str(r["seq_len"]), str(r["calls"]), f"{r['logits_max_abs_diff']:.2e}",
                  f"{r['cache_max_abs_diff']:.2e}", "CHANGED" if r["history_changed"] else "kept",
                  "NO" if r["non_finite"] else "yes")
    console.print(t)
    verdict = "PASS" if report.ok else "FAIL"
    if report.width_max_abs_diff is not None:
        flips = report.width_top_token_changes
        console.print(f"width: the export's logits in one call of k+1 tokens against k+1 calls of one differ by "
                      f"{report.width_max_abs_diff:.3e}; top token differs at {flips} of {report.k + 1} positions"
                      + (" (greedy speculative output would not equal one-token decoding)"
                         if report.width_dependent else ""))
    if report.backend_width_max_abs_diff is not None:
        console.print(f"width on {report.backend} at {report.precision}: the rewrite's logits in one call of k+1 "
                      f"tokens against k+1 calls of one differ by {report.backend_width_max_abs_diff:.3e}; top token "
                      f"differs at {report.backend_width_top_token_changes} of {report.k + 1} positions")
    if report.caches:
        console.print(f"OpenVINO caches replayed: {' and '.join(report.caches)}"
                      + (f" (no fused cache: {report.fused_note})" if report.fused_note else ""))
    hidden = f", max |Δ {report.hidden_output}| = {report.max_hidden_diff:.3e}" if report.hidden_output else ""
    console.print(f"{verdict}: max |Δ logits| = {report.max_logits_diff:.3e}, max |Δ cache| = "
                  f"{report.max_cache_diff:.3e}{hidden} (tolerance {report.tol:g})"
                  + ("; the export's top tokens depend on the call width" if report.width_dependent else ""))


def main(argv: list[str], prog: str = "specdec-compile verify") -> int:
    p = Parser(prog=prog, help_hint=f" (see {prog} --help)", description=__doc__.split("\n\n")[0].rstrip(".") + ".",
               epilog="Defaults for k, prefill length and context length come from "
                      "manifest.json beside REWRITTEN when there is one, and every "
                      "specialization's width it lists is called once; the default "
                      "context is lengthened past the longest sliding window of the "
                      "model. For a TLM it also checks that the export gives each "
                      "position the same top token in one call of k+1 tokens as in "
                      "k+1 calls of one (greedy speculative output rests on it). "
                      "Exit: 0 pass, 1 numerical mismatch, 2 bad input.")
    p.add_argument("original", type=Path, help="the stock export (concatenating KV cache)")
    p.add_argument("rewritten", type=Path, help="the rewrite: OUT/model.onnx, or the artifact directory OUT")
    p.add_argument("--k", type=int, default=None, help="speculation length (default: manifest, else 7)")
    p.add_argument("--prefill-len", type=int, default=None, help="prefill chunk (default: manifest, else 32)")
    p.add_argument("--ctx-len", type=int, default=None,
                   help=f"context length (default: manifest, else 256; at most {MAX_CTX_LEN})")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"rows per call (default: the artifact's batch, else 1; at most {MAX_BATCH_SIZE})")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random token histories (an integer >= 0; default 0): the same seed "
                        "replays the same tokens")
    p.add_argument("--tol", type=float, default=1e-4,
                   help="the largest absolute difference of logits, cache and hidden states that passes "
                        "(default 1e-4, float32)")
    p.add_argument("--backend", choices=("auto", "ort", "openvino"), default="auto",
                   help="where the rewrite runs: ONNX Runtime, or OpenVINO with its cache in state variables "
                        "(MakeStateful; needs the [openvino] extra) where the width check then also runs on the "
                        "rewrite; auto (default): openvino for a --target openvino graph, else ort")
    p.add_argument("--ov-precision", choices=("f32", "bf16", "f16"), default="f32",
                   help="--backend openvino: the inference precision (default f32; below it the logits "
                        "differ from the export's, so raise --tol to check the rest)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_progress_flags(p)
    args = p.parse_args(argv)
    start_progress(prog, args)
    check_verify_options(seed=args.seed, tol=args.tol, widths=(), dash="--")
    check_options(k=args.k, prefill_len=args.prefill_len, ctx_len=args.ctx_len, batch_size=args.batch_size,
                  optional=True)
    original, rewritten = resolve_model_path(args.original), resolve_model_path(args.rewritten)
    _check_pair(original, rewritten)
    d = defaults_from_manifest(rewritten)
    prefill_len = _given(args.prefill_len, d.get("prefill_len", 32))
    ctx_len = args.ctx_len if args.ctx_len is not None else history_past_windows(
        original, d.get("ctx_len", 256), prefill_len, limit=compiled_ctx_len(rewritten))
    report = verify(original, rewritten, k=_given(args.k, d.get("k", 7)), prefill_len=prefill_len,
                    ctx_len=ctx_len, batch_size=_given(args.batch_size, d.get("batch_size", 1)), seed=args.seed,
                    tol=args.tol,
                    widths=d.get("widths", ()), backend=args.backend, precision=args.ov_precision)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        render(report)
    return 0 if report.ok else 1


def _given(value, default):
    """An option as given (0 included: ``check_options`` refuses it), else the default."""
    return default if value is None else value
