"""The decode step against the speed limit (``python -m bench.run_bench --only step_floor``).

On CPU a decode step of a small model is bound by reading its weights: every weight matrix is
read once per step. This section measures, in one run, interleaved:

floor        one matrix-vector product over every weight matrix the step reads (each rank-2
             float initializer a MatMul/Gemm consumes, directly or through a Transpose: the tied
             LM head too), as one ONNX Runtime graph of MatMuls, ``--ort-threads`` threads: the
             time to read the weights once.
target step  the export compiled ``--role dlm --target ort`` at each ``--step-floor-ctx``
             (seq_len 1, last-token logits: the target-only step), run bare: caches bound once,
             each output bound to its input's buffer (updated in place), per step only
             input_ids and position_ids bound.
widths       the export compiled ``--role tlm`` (at the first context), one call of each
             ``--step-floor-widths`` width (speculative verification), bare as above.
int4         (``--step-floor-int4``, on by default) the export quantized weight-only to int4 by
             ONNX Runtime's ``MatMulNBitsQuantizer`` (block 32, symmetric; accuracy_level 0, and
             4: int8 activations) before compiling, its
             target step at the first context: as a ratio to the float32 floor and to the float32
             target step (the tied LM head and the embedding stay float32: they are no MatMul
             with a constant weight). With ``make demo``'s build (not ``--step-floor-model``), also
             its speculative decode of the demo's instructions: prompt lookup, the hybrid and the
             feature draft on the int4 target, against the int4 and float32 targets alone
             (``bench/int4_spec.py``; ``--real-prompts``, ``--real-repeats``,
             ``--real-max-new-tokens``).

Each time is the best median over ``--rounds`` interleaved rounds of ``--steps`` calls, and is
reported as a ratio to the floor of the same run (widths also to the target step at that
context). ``nodes_per_step``: the kernels ONNX Runtime's profiler records per decode step of the
target graph at the first context (after its own graph optimizations), with the counts by op.

The model: SmolLM2-135M-Instruct from ``make demo``'s build (``--real-build DIR``; the export
at DIR/export/tlm/model.onnx), or any optimum export (``--step-floor-model PATH``). Without
either the section is skipped, with the reason printed. Written to bench/results/results-step-floor.{json,md}
and the step_floor key of bench/results/results.json.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "results-step-floor.json"
#: the int4 exports (under the section's output folder) by accuracy_level: 0 float32 activations, 4 int8
INT4_EXPORTS = {0: "int4", 4: "int4a4"}


def int4_export(out: Path, level: int) -> Path:
    """Where ``quantize_int4`` keeps the export at ``level`` (``out``: the section's folder)."""
    return out / f"{INT4_EXPORTS[level]}-export" / "model.onnx"


def _ort():
    import onnxruntime as ort
    return ort


def _options(threads: int, profile_prefix: str | None = None):
    so = _ort().SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


# --------------------------------------------------------------------------- the floor

def weight_matrices(model_path: Path) -> list[np.ndarray]:
    """Every rank-2 float initializer a MatMul/Gemm reads (through a Transpose: transposed, as
    ONNX Runtime folds it), each as the [in, out] matrix a matrix-vector product reads."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(str(model_path), load_external_data=True, )
    consumers: dict[str, list] = {}
    for n in m.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out = []
    for t in m.graph.initializer:
        if len(t.dims) != 2 or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        uses = consumers.get(t.name, [])
        direct = any(n.op_type in ("MatMul", "Gemm") and n.input[1] == t.name for n in uses)
        via_t = any(n.op_type == "Transpose" and any(c.op_type in ("MatMul", "Gemm")
                                                     for c in consumers.get(n.output[0], [])) for n in uses)
        if direct or via_t:
            w = numpy_helper.to_array(t).astype(np.float32)
            out.append(np.ascontiguousarray(w if direct else w.T))
    return out


def floor_session(weights: list[np.ndarray], threads: int):
    """One graph: x_d [1, d] @ W for every weight (one input per distinct input width)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    widths = sorted({w.shape[0] for w in weights})
    inputs = [helper.make_tensor_value_info(f"x{d}", TensorProto.FLOAT, [1, d]) for d in widths]
    nodes, outs, inits = [], [], []
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{w.shape[0]}", f"w{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, w.shape[1]]))
    g = helper.make_graph(nodes, "weight_read_floor", inputs, outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = _ort().InferenceSession(model.SerializeToString(), _options(threads), providers=["CPUExecutionProvider"])
    feeds = {f"x{d}": np.random.default_rng(0).standard_normal((1, d)).astype(np.float32) for d in widths}
    return lambda: sess.run(None, feeds)


# --------------------------------------------------------------------------- the compiled steps

def bare_step(model: Path, ctx_len: int, width: int, threads: int, profile_prefix: str | None = None):
    """A call of ``width`` tokens of a compiled ort artifact, caches bound in place; returns
    (step function, session)."""
    ort = _ort()
    sess = ort.InferenceSession(str(model), _options(threads, profile_prefix), providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    keep = []
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            dtype = np.float16 if "float16" in i.type else np.float32
            v = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, i.shape[1], ctx_len, i.shape[3]), dtype))
            keep.append(v)
            io.bind_ortvalue_input(i.name, v)
            io.bind_ortvalue_output(f"{i.name}_RetainedState", v)
    for o in sess.get_outputs():
        if not o.name.endswith("_RetainedState"):
            io.bind_output(o.name, "cpu")
    start = max(0, ctx_len - 64)
    state = {"p": start, "keep": keep}
    ids = np.full((1, width), 7, np.int64)

    def step():
        p = state["p"]
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("position_ids", np.arange(p, p + width, dtype=np.int64)[None])
        sess.run_with_iobinding(io)
        state["p"] = start if p + 2 * width > ctx_len else p + width
    return step, sess


def time_median(fn, n: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def profile_nodes(model: Path, ctx_len: int, threads: int, prefix: Path, runs: int = 5) -> dict:
    """The kernels ONNX Runtime runs per decode step (its profiler), total and by op."""
    step, sess = bare_step(model, ctx_len, 1, threads, str(prefix))
    for _ in range(runs):
        step()
    path = Path(sess.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    n_runs = sum(1 for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kernels = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    n_runs = n_runs or runs
    by_op = Counter(e.get("args", {}).get("op_name", "?") for e in kernels)
    return {"nodes_per_step": round(len(kernels) / n_runs),
            "by_op": {k: round(v / n_runs) for k, v in by_op.most_common()}}


# --------------------------------------------------------------------------- the section

def _compile(export: Path, out: Path, args: list[str], log) -> Path:
    from demo.compiling import compile_artifact
    compile_artifact(export, out, args, log=log)
    return out / "model.onnx"


def quantize_int4(export: Path, out: Path, log=print, accuracy_level: int = 0) -> Path:
    """``export`` quantized weight-only to int4 by ONNX Runtime's ``MatMulNBitsQuantizer`` (block
    32, symmetric; every MatMul with a constant weight becomes ``com.microsoft::MatMulNBits``),
    cached in ``out``. ``accuracy_level`` 4: the kernels quantize the activations to int8 per block
    and multiply in int8 (as CPU engines' 4-bit formats do); on this CPU that made SmolLM2's step
    18.9 ms instead of 22.7 and a width-5 verification 1.55 steps instead of 2.0, but its logits
    then depend on the width of the call (``int4_spec.width_dependence``), so a speculative loop
    cannot reproduce the target's own one-token decoding."""
    dst = out / "model.onnx"
    stamp = out / "source.txt"
    key = f"{export.resolve()} with its config and tokenizer files, accuracy_level {accuracy_level}"
    if dst.exists() and stamp.exists() and stamp.read_text() == key:
        return dst
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    t = time.time()
    q = MatMulNBitsQuantizer(onnx.load(str(export)), block_size=32, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(q.model.model, str(dst))
    for side in export.parent.iterdir():      # config, tokenizer, generation config: the manifest's facts
        if side.is_file() and side.suffix in (".json", ".jinja", ".txt") and side.name != "specdec-stamp.json":
            shutil.copyfile(side, out / side.name)
    stamp.write_text(key)
    log(f"[step_floor] int4 weight-only export: {dst} ({time.time() - t:.0f} s)")
    return dst


def _fns(export: Path, out: Path, ctxs, widths, threads, log, int4: bool = False) -> tuple[dict, dict]:
    """name -> step function, name -> (ctx, width); the compiled artifacts under ``out``."""
    common = ["--target", "ort", "--prefill-len", "32"]
    fns, what = {}, {}
    if int4:
        for level, tag in INT4_EXPORTS.items():
            q = quantize_int4(export, int4_export(out, level).parent, log, accuracy_level=level)
            m = _compile(q, out / f"{tag}-dlm-{ctxs[0]}", ["--role", "dlm", *common, "--ctx-len", str(ctxs[0])], log)
            fns[f"{tag}step{ctxs[0]}"], _ = bare_step(m, ctxs[0], 1, threads)
            what[f"{tag}step{ctxs[0]}"] = (ctxs[0], 1)
    for c in ctxs:
        m = _compile(export, out / f"dlm-{c}", ["--role", "dlm", *common, "--ctx-len", str(c)], log)
        fns[f"step{c}"], _ = bare_step(m, c, 1, threads)
        what[f"step{c}"] = (c, 1)
    if widths:
        k = max(1, max(widths) - 1)
        tlm = _compile(export, out / f"tlm-{ctxs[0]}",
                       ["--role", "tlm", "--k", str(k), *common, "--ctx-len", str(ctxs[0])], log)
        for w in widths:
            fns[f"width{w}"], _ = bare_step(tlm, ctxs[0], w, threads)
            what[f"width{w}"] = (ctxs[0], w)
    return fns, what


def _call(name: str) -> str:
    if name.startswith("int4a4"):
        return "int4 target step, int8 activations"
    return "int4 target step" if name.startswith("int4") else "target step" if name.startswith("step") else "verify"


def measure(export: Path, out: Path, *, ctxs=(256, 2048), widths=(1, 2, 5, 8), steps: int = 50,
            rounds: int = 5, threads: int = 1, log=print, int4: bool = False) -> dict:
    """The section's record for the optimum export ``export`` (artifacts compiled under ``out``);
    ``int4``: also the target step of the export quantized weight-only to int4 (first context)."""
    out.mkdir(parents=True, exist_ok=True)
    weights = weight_matrices(export)
    weight_bytes = int(sum(w.nbytes for w in weights))
    fns, what = _fns(export, out, list(ctxs), list(widths), threads, log, int4)
    fns = {"floor": floor_session(weights, threads), **fns}
    del weights
    best = {n: float("inf") for n in fns}
    for _ in range(rounds):  # interleaved, so that a change of load hits all of them
        for n, fn in fns.items():
            best[n] = min(best[n], time_median(fn, steps))
    floor = best["floor"]
    rows = []
    for n, (c, w) in what.items():
        row = {"call": _call(n), "ctx_len": c, "width": w,
               "ms": round(best[n] * 1e3, 3), "over_floor": round(best[n] / floor, 3)}
        if not n.startswith("step") and f"step{c}" in best:
            row["over_target_step"] = round(best[n] / best[f"step{c}"], 3)
        rows.append(row)
    prof = profile_nodes(out / f"dlm-{ctxs[0]}" / "model.onnx", ctxs[0], threads, out / "profile")
    log(f"[step_floor] floor {floor * 1e3:.2f} ms ({weight_bytes / 1e6:.0f} MB, "
        f"{weight_bytes / floor / 1e9:.1f} GB/s); " + "; ".join(
            f"{r['call']} ctx {r['ctx_len']} w {r['width']}: {r['ms']:.2f} ms ({r['over_floor']:.2f}x)" for r in rows)
        + f"; {prof['nodes_per_step']} kernels per step")
    return {"model": str(export), "weight_bytes": weight_bytes, "floor_ms": round(floor * 1e3, 3),
            "floor_gb_per_s": round(weight_bytes / floor / 1e9, 2), "rows": rows, "profile_ctx_len": ctxs[0],
            **prof, "steps": steps, "rounds": rounds, "ort_threads": threads}


def add_args(ap) -> None:
    """run_bench's options for this section (the SmolLM2 build: ``--real-build``)."""
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--step-floor-model", type=Path, default=None,
                    help="step_floor: an optimum export (default: the build's export/tlm/model.onnx)")
    ap.add_argument("--step-floor-ctx", type=ints, default=[256, 2048], help="step_floor: context lengths")
    ap.add_argument("--step-floor-widths", type=ints, default=[1, 2, 5, 8],
                    help="step_floor: verification widths (TLM at the first context)")
    ap.add_argument("--step-floor-steps", type=int, default=50, help="step_floor: calls per timing")
    ap.add_argument("--step-floor-int4", action=argparse.BooleanOptionalAction, default=True,
                    help="step_floor: also the int4 weight-only (MatMulNBits) target step, and (with make demo's "
                         "build) its speculative decode (bench/int4_spec.py)")


def run(a, only: set) -> dict:
    """The section (skipped, with the reason printed, when there is no model)."""
    if "step_floor" not in only:
        return {}
    export = a.step_floor_model or a.real_out / "export" / "tlm" / "model.onnx"
    if not export.exists():
        a.log(f"[step_floor] skipped: no model at {export} (`make demo` builds it, or --step-floor-model PATH)")
        return {}
    rec = measure(export, a.out / "step-floor", ctxs=a.step_floor_ctx, widths=a.step_floor_widths,
                  steps=a.step_floor_steps, rounds=a.rounds, threads=a.ort_threads, log=a.log,
                  int4=a.step_floor_int4)
    if a.step_floor_int4 and a.step_floor_model is None:
        from . import int4_spec
        rec["int4_speculative"] = int4_spec.run(
            a.real_out, int4_export(a.out / "step-floor", 0), a.out / "step-floor" / "int4",
            int4_export(a.out / "step-floor", 4),
            ort_threads=a.ort_threads, repeats=a.real_repeats, prompts=a.real_prompts,
            max_new_tokens=a.real_max_new_tokens, log=a.log)
    rec["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    from .record import beside_results
    path = beside_results(a, RESULTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    path.with_suffix(".md").write_text("\n".join(markdown(rec)))
    a.log(f"[step_floor] wrote {path} and {path.with_suffix('.md')}")
    return {"step_floor": rec}


def markdown(rec: dict) -> list[str]:
    L = [f"decode step against the weight-read floor ({rec['model']}): floor {rec['floor_ms']:.2f} ms "
         f"({rec['weight_bytes'] / 1e6:.0f} MB of weights, {rec['floor_gb_per_s']:.1f} GB/s), "
         f"{rec['ort_threads']} ORT thread(s); {rec['nodes_per_step']} kernels per step "
         f"(ctx {rec['profile_ctx_len']})", "",
         "| call | ctx_len | width | ms | / floor | / target step |", "|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        ts = f"{r['over_target_step']:.2f}" if "over_target_step" in r else "-"
        L.append(f"| {r['call']} | {r['ctx_len']} | {r['width']} | {r['ms']:.2f} | {r['over_floor']:.2f}x | {ts} |")
    top = ", ".join(f"{k} {v}" for k, v in list(rec["by_op"].items())[:10])
    from . import int4_spec
    return L + ["", f"Kernels per step by op (top 10): {top}.", ""] + int4_spec.markdown(rec.get("int4_speculative") or {})
