"""``backends`` section: one model on ONNX Runtime f32, OpenVINO f32 and OpenVINO bf16, side by side.

    python -m bench.backends --export build/demo/export/tlm/model.onnx --tokenizer build/demo/tokenizer

SmolLM2-135M-Instruct's export (``make demo``'s) compiled twice, ``--target ort`` and ``--target
openvino`` (k 4, widths 1/2/3/5 with the K=0 fallback, prefill 64, ctx 256), run on the demo's
prompts (chat template, greedy, 128 new tokens), one thread per model:

* per backend and precision: target-only, n-gram (prompt lookup), suffix and, with the committed
  EAGLE-3 head (``workshop/heads/smollm2-eagle3``, imported for each target beside its TLM with the
  hidden states it reads), ``eagle3-hybrid`` (prompt lookup first, the head otherwise: MT-bench's
  best draft) decoding, tokens/s (wall, all prompts), the speedup over that backend's own
  target-only, and whether the speculative text equals target-only's on every prompt
  (``greedy_equal``; for eagle3-hybrid, the target-only text of its own TLM, the same model with
  the head's hidden states as outputs, and ``eagle3_tlm_equals_target_only``: that text against
  the plain TLM's); OpenVINO with its default cache (``openvino``: fused where the graph allows
  it, rolled back by trimming below f32 on one thread, else by masking) and with the copy path
  (``openvino-copy``);
* per OpenVINO precision, the width check over the same texts (OpenVINO f32's target-only answers):
  each prompt and answer re-scored in calls of k+1 tokens against calls of one; ``width_flips``:
  positions whose top token differs, of ``positions``; ``vs_f32_flips``: positions whose top token
  (width 1) differs from f32's on the same text; ``texts_equal_f32``: target-only text equal to f32's;
* the same width check over MT-bench's first turns (``mtbench_width``; bench/mtbench.py's fixed
  subset, 2 questions per category, those that fit the context with 64 new tokens): OpenVINO f32's
  target-only answers re-scored at each precision;
* OpenVINO GenAI's own pipeline beside them (bench/ovgenai.py; when ``openvino-genai`` is installed
  here or ``SPECDEC_OVGENAI_PYTHON`` names a Python that has it, else one line says so): target-only
  and prompt lookup, at f32 and at the CPU plugin's default precision, on an OpenVINO IR of the same
  checkpoint, the same prompt ids and new tokens, greedy; ``greedy_equal_ours_f32``: its ids equal
  our OpenVINO f32 target-only ids, per prompt;
* ``paired_f32_target_only`` and ``paired_best_spec`` (``paired``): after GenAI's runs, each goal's
  two sides again, each in a fresh process (ours: bench/ov_worker.py; GenAI's: its worker),
  alternated four times with the order swapped every round (``--paired-rounds``), with the median
  of each side. The rows above are minutes apart from GenAI's runs, and this machine drifts by more
  than the goals' margins in that time; and ours in this process against GenAI in a fresh one
  compared unlike processes (bench/ov_worker.py). The best-speculative pair is our best draft at
  the precision OpenVINO picks, as ``goals`` chooses it from the rows, against GenAI's best run;
* ``goals`` (issue 34), each from the paired medians where measured, else from the rows: our OpenVINO
  f32 target-only over GenAI's f32 target-only (goal >= 0.95), and
  our best speculative decoding on OpenVINO at the precision OpenVINO picks over GenAI's best run
  (goal >= 1.2): the faster draft whose greedy output equals our target-only there on every prompt,
  else the faster one, flagged.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from specdec_compile.eagle3.quantize import WEIGHTS

from . import ovgenai
from .record import verdict

K, K_LIST, PL, CTX, NEW = 4, "0,1,2,4", 64, 256, 128
DRAFTS = ("ngram", "suffix", "eagle3-hybrid")
MT_NEW = 64           # new tokens per MT-bench first turn in its width check (as bench/mtbench.py's turns)
PAIRED_ROUNDS = 4     # each goal's pair, ours and GenAI's in fresh processes, alternated this many times
ROOT = Path(__file__).resolve().parents[1]


def compile_both(export: Path, out: Path, log=print) -> dict[str, Path]:
    from specdec_compile import cli, passes
    dirs = {}
    for target in ("ort", "openvino"):
        d = out / f"tlm-{target}"
        want = [p.name for p in passes.select("tlm", target)]
        if not (d / "manifest.json").is_file() or json.loads((d / "manifest.json").read_text()).get("passes") != want:
            log(f"compiling {export} for --target {target} -> {d}")
            code = cli.main([str(export), "--role", "tlm", "--target", target, "--k", str(K), "--k-list", K_LIST,
                             "--prefill-len", str(PL), "--ctx-len", str(CTX), "-o", str(d), "--force"])
            if code != 0:
                raise SystemExit(f"compile for {target} failed ({code})")
        dirs[target] = d
    return dirs


def compile_eagle3s(export: Path, out: Path, head: Path, log=print, weights: str = "float") -> dict | str:
    """{target: (TLM with the head's hidden states, the imported head)} for ort and openvino, or a
    line saying why there is none (no head). ``weights``: the head's (``import-head --weights``)."""
    from demo.compiling import compile_eagle3
    if not (head / "config.json").is_file() or not (head / "model.safetensors").is_file():
        return f"no EAGLE-3 head at {head}"
    return {t: compile_eagle3(export, head, out / f"eagle3-{t}", k=K, k_list=[int(x) for x in K_LIST.split(",")],
                              prefill_len=PL, ctx_len=CTX, log=log, target=t, weights=weights)[:2]
            for t in ("ort", "openvino")}


def decode(backend, prompts, draft: str | None, new: int = NEW, dlm=None):
    """Greedy decoding of every prompt (``draft`` None: target-only; ``eagle3-hybrid``: with the head
    ``dlm``): (the generated ids per prompt, tokens/s over the wall time of all of them). The rows
    and bench/ov_worker.py both time with it."""
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    from .mtbench import NGRAM_MAX
    if draft == "eagle3-hybrid":
        dec = SpecDecoder(backend, dlm, draft="hybrid", ngram_max=NGRAM_MAX)
    else:
        dec = TargetOnlyDecoder(backend) if draft is None else SpecDecoder(backend, None, draft=draft)
    t0 = time.perf_counter()
    outs = [dec.generate(p, max_new_tokens=new).generated_ids for p in prompts]
    wall = time.perf_counter() - t0
    return outs, sum(map(len, outs)) / wall


def width_flips(backend, prompts, answers, width: int) -> tuple[int, int, list]:
    """Each prompt + answer re-scored: calls of ``width`` tokens against calls of one. Returns
    (positions whose argmax differs, positions, the width-1 argmaxes per prompt)."""
    flips = total = 0
    ones = []
    for p, ans in zip(prompts, answers):
        seq = list(p) + list(ans)
        n0 = len(p)

        def prefill():
            backend.reset()
            for s in range(0, n0, PL):
                chunk = seq[s:min(s + PL, n0)]
                ids = np.zeros((1, PL), np.int64)
                pos = np.full((1, PL), -1, np.int64)
                ids[0, :len(chunk)] = chunk
                pos[0, :len(chunk)] = np.arange(s, s + len(chunk))
                backend.run(ids, pos)
        prefill()
        wide = []
        for s in range(n0, len(seq) - width + 1, width):
            wide += list(backend.run(np.array([seq[s:s + width]]), np.arange(s, s + width)[None])[0].argmax(-1))
        prefill()
        one = [int(backend.run(np.array([[seq[s]]]), np.array([[s]]))[0, 0].argmax()) for s in range(n0, len(seq))]
        ones.append(one)
        flips += int(np.sum(np.array(wide) != np.array(one[:len(wide)])))
        total += len(wide)
    return flips, total, ones


def mtbench_prompts(tok, per_category: int, room: int) -> tuple[list[list[int]], int]:
    """MT-bench's first turns (bench/mtbench.py's subset) through the chat template, those that
    leave ``room`` tokens in the context; (the prompts, how many did not fit)."""
    from . import mtbench
    ids = [mtbench.turn_ids(tok, q, 1) for q in mtbench.select(mtbench.questions(), per_category)]
    fit = [p for p in ids if len(p) + room <= CTX]
    return fit, len(ids) - len(fit)


def mtbench_width(ov_dir: Path, tok, threads: int, per_category: int, log=print) -> dict | str:
    """The width check over MT-bench's first turns on OpenVINO: f32's target-only answers re-scored
    at f32 and at the precision OpenVINO picks; a line saying why when it cannot run."""
    try:
        prompts, skipped = mtbench_prompts(tok, per_category, MT_NEW)
    except SystemExit as e:
        return f"not measured: {e}"
    from specdec_compile.runtime import OpenVinoBackend
    res = {"questions": len(prompts) + skipped, "too_long": skipped, "max_new_tokens": MT_NEW, "rows": []}
    ref = f32_ones = None
    for prec in dict.fromkeys(("f32", default_precision())):
        b = OpenVinoBackend(ov_dir, precision=prec, threads=threads)
        if ref is None:
            ref, _ = decode(b, prompts, None, MT_NEW)
        flips, total, ones = width_flips(b, prompts, ref, K + 1)
        row = {"precision": prec, "width_flips": flips, "positions": total}
        if f32_ones is None:
            f32_ones = ones
        else:
            row["vs_f32_flips"] = int(sum(np.sum(np.array(a) != np.array(o)) for a, o in zip(ones, f32_ones)))
            row["vs_f32_positions"] = int(sum(len(o) for o in ones))
        log(json.dumps({"mtbench_width": row}))
        res["rows"].append(row)
        b.close()
    return res


def default_precision() -> str:
    """The precision OpenVINO's CPU plugin picks here when none is asked for ("f32" or "bf16", ...)."""
    import openvino as ov
    got = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
    return got.get_type_name() if hasattr(got, "get_type_name") else str(got)


def _backends(dirs: dict, threads: int, e3: dict | str | None = None) -> list:
    """(backend kind, precision, maker, EAGLE-3 pair maker or None): ORT f32, OpenVINO f32 and
    OpenVINO at the precision it picks here when that is not f32 (bf16 on a CPU with avx512_bf16 or
    AMX), each with its default cache (``openvino``: fused where the graph allows it; the EAGLE-3
    head's attention is not that form and keeps the copy path) and then the copy path
    (``openvino-copy``)."""
    from specdec_compile.runtime import OpenVinoBackend, OrtBackend
    e3 = e3 if isinstance(e3, dict) else {}

    def pair(target, make):
        return (lambda: (make(e3[target][0]), make(e3[target][1]))) if target in e3 else None

    ort = lambda d: OrtBackend(d, intra_op_threads=threads)       # noqa: E731
    rows = [("ort", "f32", lambda: ort(dirs["ort"]), pair("ort", ort))]
    for prec in dict.fromkeys(("f32", default_precision())):
        for kind, cache in (("openvino", None), ("openvino-copy", "copy")):
            ov = lambda d, prec=prec, cache=cache: OpenVinoBackend(d, precision=prec, threads=threads,  # noqa: E731
                                                                   cache=cache)
            rows.append((kind, prec, lambda ov=ov: ov(dirs["openvino"]), pair("openvino", ov)))
    return rows


def _measure_row(b, kind, prec, prompts, new, e3=None):
    """One backend's row: target-only, n-gram, suffix and (``e3``: the EAGLE-3 pair's maker)
    eagle3-hybrid; (the row, target-only's ids)."""
    b.warmup()
    base, base_rate = decode(b, prompts, None, new)
    row = {"backend": kind, "precision": prec, "target_only_tok_s": base_rate}
    if hasattr(b, "cache_kind"):
        row["cache"] = b.cache_kind

    def put(draft, got, rate, ref=base):
        row[f"{draft}_tok_s"] = rate
        row[f"{draft}_speedup"] = rate / base_rate
        row[f"{draft}_greedy_equal"] = [g == t for g, t in zip(got, ref)]

    for draft in ("ngram", "suffix"):
        put(draft, *decode(b, prompts, draft, new))
    if e3 is not None:
        tlm, head = e3()
        tlm.warmup()
        head.warmup()
        # the pair's TLM (the same model with the head's hidden states as outputs) decoding alone: what
        # its speculative text must equal (below f32 its logits can differ from the plain TLM's)
        own = decode(tlm, prompts, None, new)[0]
        put("eagle3-hybrid", *decode(tlm, prompts, "eagle3-hybrid", new, dlm=head), ref=own)
        row["eagle3_tlm_equals_target_only"] = [a == b for a, b in zip(own, base)]
        row["eagle3_caches"] = [getattr(x, "cache_kind", None) for x in (tlm, head)]
        tlm.close()
        head.close()
    return row, base


def run(export: Path, tokenizer: Path, out: Path, threads: int = 1, n_prompts: int = 4, log=print,
        new: int = NEW, hf: Path | None = None, width_check: bool = True, mt_per_category: int = 2,
        head: Path | None = None, paired_rounds: int = PAIRED_ROUNDS, head_weights: str = "float") -> dict:
    """The rows at ``threads`` threads; GenAI's beside them when ``hf`` (the checkpoint ``export``
    was made from) is given, and then ``paired_rounds`` alternated f32 target-only rounds of ours
    and GenAI's (0: none); the width checks when ``width_check`` (MT-bench's with
    ``mt_per_category`` questions per category; 0: not run)."""
    from workshop import prompts as prompt_sets
    from workshop.smollm2 import chat_ids
    from specdec_compile.runtime.tokenizer import load_tokenizer

    dirs = compile_both(export, out, log)
    e3 = compile_eagle3s(export, out, head, log, head_weights) if head is not None else "no EAGLE-3 head given"
    tok = load_tokenizer(str(tokenizer))
    prompts = [chat_ids(tok, t) for t in prompt_sets.DEMO_PROMPTS[:n_prompts]]
    res = {"model": str(export), "threads": threads, "k": K, "ctx_len": CTX, "max_new_tokens": new,
           "prompts": len(prompts), "rows": [], "eagle3": e3 if isinstance(e3, str) else str(head),
           "eagle3_weights": head_weights}
    ref = None            # OpenVINO f32's target-only texts and their width-1 top tokens: what bf16 re-scores
    for kind, prec, make, e3_make in _backends(dirs, threads, e3):
        b = make()
        row, base = _measure_row(b, kind, prec, prompts, new, e3_make)
        if kind == "openvino" and ref is None:
            ref = (base, None)
        if kind == "openvino" and width_check:
            flips, total, ones = width_flips(b, prompts, ref[0], K + 1)
            row.update(width_flips=flips, positions=total)
            if ref[1] is None:
                ref = (base, ones)
            else:
                row["vs_f32_flips"] = int(sum(np.sum(np.array(a) != np.array(o)) for a, o in zip(ones, ref[1])))
                row["vs_f32_positions"] = int(sum(len(o) for o in ones))
        if kind == "openvino" and prec != "f32":
            row["texts_equal_f32"] = [g == t for g, t in zip(base, ref[0])]
        log(json.dumps(row))
        res["rows"].append(row)
        b.close()
    if width_check and mt_per_category:
        res["mtbench_width"] = mtbench_width(dirs["openvino"], tok, threads, mt_per_category, log)
    res["genai"] = "not measured: no Hugging Face checkpoint given (--hf)" if hf is None else \
        ovgenai.measure(hf, out / "genai-ir", prompts, new, threads, K, ref[0], log)
    if isinstance(res["genai"], dict) and paired_rounds:
        _paired_runs(res, dirs, e3, prompts, new, threads, paired_rounds, log)
    res["goals"] = goals(res)
    return res


def _ours_worker(request: dict) -> dict:
    """One run of ours in a fresh process (bench/ov_worker.py), under this Python."""
    return ovgenai.run_worker(sys.executable, request, args=["-m", "bench.ov_worker"], cwd=ROOT)


def paired(ours: dict, theirs: dict, prompts, new: int, threads: int, rounds: int = PAIRED_ROUNDS,
           what: str = "f32 target-only", log=print) -> dict | str:
    """Ours (an ov_worker request: artifact, precision, cache, draft, eagle3) and GenAI's (one
    ovgenai_worker run: precision, mode) on the same ``prompts``, each in a fresh process, alternated
    ``rounds`` times with the order swapped every round (ours first in the odd rounds): per side the
    tokens/s of each round and their median. Both sides are started the same way from the same
    process, so that neither the drift of the machine over minutes nor the state of the bench's
    process (bench/ov_worker.py says what it changed) decides the ratio. A string (one line) when
    either side cannot run."""
    python, which = ovgenai.genai_python()
    if python is None:
        return f"not measured: {which}"
    ours_req = {**ours, "threads": threads, "prompts": prompts, "max_new_tokens": new}
    their_req = {"ir": theirs["ir"], "prompts": prompts, "max_new_tokens": new, "threads": threads,
                 "runs": [{"precision": theirs["precision"], "mode": theirs["mode"]}],
                 "num_assistant_tokens": K, "max_ngram_size": ovgenai.MAX_NGRAM}
    got = {"ours": [], "genai": []}
    cache = None
    try:
        for i in range(rounds):
            for side in (("ours", "genai") if i % 2 == 0 else ("genai", "ours")):
                if side == "ours":
                    ans = _ours_worker(ours_req)
                    got["ours"].append(ans["tok_s"])
                    cache = ans["cache"]
                else:
                    got["genai"].append(ovgenai.run_worker(python, their_req)["runs"][0]["tok_s"])
            log(f"[backends] paired {what}, round {i + 1}: ours {got['ours'][-1]:.1f}, GenAI {got['genai'][-1]:.1f} tok/s")
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"not measured: {' '.join(str(e).split())[:300]}"
    return {"what": what, "rounds": rounds, "cache": cache, "ours": got["ours"], "genai": got["genai"],
            "ours_median": float(np.median(got["ours"])), "genai_median": float(np.median(got["genai"])),
            "measured": f"medians of {rounds} alternated rounds, each side in a fresh process"}


def _paired_runs(res: dict, dirs: dict, e3, prompts, new: int, threads: int, rounds: int, log) -> None:
    """The two goals' pairs, after the rows and GenAI's runs: f32 target-only against GenAI's, and
    our best speculative decoding at the precision OpenVINO picks (as ``goals`` chooses it from the
    rows) against GenAI's best run."""
    g = res["genai"]
    res["paired_f32_target_only"] = paired({"artifact": str(dirs["openvino"]), "precision": "f32"},
                                           {"ir": g["ir"], "precision": "f32", "mode": "target"},
                                           prompts, new, threads, rounds, "f32 target-only", log)
    pick = goals(res)
    b = pick[f"best_spec_{pick['picked_precision']}"]
    best = max(g["rows"], key=lambda r: r["tok_s"])
    ours = {"artifact": str(dirs["openvino"]), "precision": b["precision"], "draft": b["draft"],
            "cache": "copy" if b["backend"] == "openvino-copy" else None,
            "eagle3": [str(p) for p in e3["openvino"]] if b["draft"] == "eagle3-hybrid" else None}
    res["paired_best_spec"] = paired(ours, {"ir": g["ir"], "precision": best["precision"], "mode": best["mode"]},
                                     prompts, new, threads, rounds, f"best speculative ({b['draft']} at {b['precision']}, "
                                     f"{b['backend']}) against GenAI's {best['mode']} at {best['runs_at']}", log)


def goals(res: dict) -> dict | None:
    """Issue 34's two ratios from one run's rows (None without GenAI's rows). Ours: the OpenVINO
    backend with either cache (``--ov-cache``; the row's ``cache``, the default one first)."""
    g = res.get("genai")
    if not isinstance(g, dict):
        return None
    ov: dict[str, list[dict]] = {}
    for r in res["rows"]:
        if r["backend"].startswith("openvino"):
            ov.setdefault(r["precision"], []).append(r)
    genai = {(r["precision"], r["mode"]): r for r in g["rows"]}
    pick = g["cpu_default_precision"] if g["cpu_default_precision"] in ov else "f32"
    best_genai = max(g["rows"], key=lambda r: r["tok_s"])
    base = max(ov["f32"], key=lambda r: r["target_only_tok_s"])
    out = {"f32_target_only": {"ours": base["target_only_tok_s"], "cache": base.get("cache"),
                               "genai": genai["f32", "target"]["tok_s"], "goal": 0.95, "measured": "the rows"}}
    for prec in dict.fromkeys((pick, "f32")):
        # the fastest draft whose greedy output equals target-only on every prompt (the goal's
        # condition), else the fastest, flagged
        row, draft = max(((r, d) for r in ov[prec] for d in DRAFTS if f"{d}_tok_s" in r),
                         key=lambda rd: (all(rd[0][f"{rd[1]}_greedy_equal"]), rd[0][f"{rd[1]}_tok_s"]))
        out[f"best_spec_{prec}"] = {"ours": row[f"{draft}_tok_s"], "draft": draft, "precision": prec,
                                    "cache": row.get("cache"), "backend": row["backend"], "measured": "the rows",
                                    "greedy_equal_target_only": all(row[f"{draft}_greedy_equal"]),
                                    "genai": best_genai["tok_s"], "genai_run": f"{best_genai['mode']} at "
                                    f"{best_genai['runs_at']}", "goal": 1.2}
    # the paired rounds' medians where they were measured (the pair of the best draft is the one
    # chosen here from the rows, at the picked precision)
    for key, goal in (("paired_f32_target_only", "f32_target_only"), ("paired_best_spec", f"best_spec_{pick}")):
        p = res.get(key)
        if isinstance(p, dict):
            out[goal].update(ours=p["ours_median"], genai=p["genai_median"], cache=p["cache"], measured=p["measured"])
    for v in out.values():
        v["ratio"] = v["ours"] / v["genai"]
    out["picked_precision"] = pick
    return out


def run_section(real_out: Path, out: Path, threads: list[int] | int, n_prompts: int, log=print,
                new: int = NEW, mt_per_category: int = 2) -> dict | str:
    """``make bench``'s section: one run per thread count (the width check in the first only), or a
    line saying why it was skipped."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return "skipped: openvino is not installed (pip install 'specdec-compile[openvino]')"
    export, tokenizer, hf = real_out / "export" / "tlm" / "model.onnx", real_out / "tokenizer", real_out / "hf" / "tlm"
    if not export.is_file() or not tokenizer.is_dir():
        return f"skipped: no SmolLM2 export in {real_out} (make demo builds it)"
    from .mtbench import DEFAULT_HEAD
    runs = [run(export, tokenizer, out, t, n_prompts, log, new, hf if hf.is_dir() else None, width_check=i == 0,
                mt_per_category=mt_per_category, head=DEFAULT_HEAD)
            for i, t in enumerate([threads] if isinstance(threads, int) else threads)]
    return {"runs": runs}


def _goal_lines(res: dict) -> list[str]:
    gl = res.get("goals")
    if not gl:
        return []
    f = gl["f32_target_only"]
    cache = lambda v: f", {v['cache']} cache" if v.get("cache") else ""     # noqa: E731
    lines = [f"goal: OpenVINO f32 target-only{cache(f)} / GenAI f32 target-only ({f.get('measured', 'the rows')}) = "
             f"{f['ours']:.1f} / {f['genai']:.1f} = {f['ratio']:.2f} (goal >= {f['goal']}): "
             f"{verdict(f['ratio'], f['goal'])}"]
    for key in (k for k in gl if k.startswith("best_spec_")):
        b = gl[key]
        lines.append(f"goal: our best speculative on OpenVINO at {b['precision']} ({b['draft']}{cache(b)}, "
                     f"greedy == target-only: "
                     f"{'yes' if b['greedy_equal_target_only'] else 'NO'}) / GenAI's best ({b['genai_run']}; "
                     f"{b.get('measured', 'the rows')}) = "
                     f"{b['ours']:.1f} / {b['genai']:.1f} = {b['ratio']:.2f} (goal >= {b['goal']}): "
                     f"{verdict(b['ratio'], b['goal'], b['greedy_equal_target_only'])}")
    for key in ("paired_f32_target_only", "paired_best_spec"):
        p = res.get(key)
        if isinstance(p, dict):
            lines.append(f"paired rounds, {p['what']}, tok/s: ours {', '.join(f'{x:.1f}' for x in p['ours'])}; "
                         f"GenAI {', '.join(f'{x:.1f}' for x in p['genai'])}")
        elif p is not None:
            lines.append(f"paired rounds ({key}): {p}")
    return [""] + lines


def _mtbench_width_lines(m) -> list[str]:
    if m is None:
        return []
    if not isinstance(m, dict):
        return ["", f"MT-bench width check: {m}"]
    rows = "; ".join(f"{r['precision']}: {r['width_flips']}/{r['positions']} positions change their top token with "
                     f"the width" + (f", {r['vs_f32_flips']}/{r['vs_f32_positions']} differ from f32's"
                                     if "vs_f32_flips" in r else "") for r in m["rows"])
    left = f", {m['too_long']} too long for ctx {CTX} left out" if m["too_long"] else ""
    return ["", f"MT-bench width check (OpenVINO; {m['questions'] - m['too_long']} first turns of the subset{left}; "
                f"f32 target-only answers of {m['max_new_tokens']} tokens re-scored in calls of {K + 1} against calls "
                f"of 1): {rows}"]


def _genai_lines(g) -> list[str]:
    if not isinstance(g, dict):
        return ["", f"OpenVINO GenAI: {g}"]
    lines = ["", f"OpenVINO GenAI {g['openvino_genai']} ({g['python']}; its CPU default precision "
             f"{g['cpu_default_precision']}; prompt lookup: {g['num_assistant_tokens']} candidates, n-grams up to "
             f"{g['max_ngram_size']}):", "", "| run | precision | tok/s | ids == our OpenVINO f32 target-only |",
             "|---|---|---|---|"]
    for r in g["rows"]:
        eq = r["greedy_equal_ours_f32"]
        kv = f", KV cache {r['kv_cache_precision']}" if r.get("kv_cache_precision") else ""
        lines.append(f"| {r['mode']} | {r['runs_at']}{'' if r['precision'] else ' (default)'}{kv} | {r['tok_s']:.1f} | "
                     f"{sum(eq)}/{len(eq)} prompts |")
    return lines


def markdown(res: dict) -> str:
    if "runs" in res:
        return "\n".join(markdown(r) for r in res["runs"])
    lines = [f"backends: {res['model']}, {res['prompts']} prompts x {res['max_new_tokens']} new tokens, greedy, "
             f"{res['threads']} thread(s), k {res['k']}, ctx {res['ctx_len']}, EAGLE-3 head weights "
             f"{res.get('eagle3_weights', 'float')}", "",
             "| backend | precision | cache | target-only tok/s | n-gram tok/s (x) | suffix tok/s (x) | "
             "eagle3-hybrid tok/s (x) | spec == target-only | width flips | flips vs f32 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        eq = all(all(r[f"{d}_greedy_equal"]) for d in DRAFTS if f"{d}_greedy_equal" in r)
        e3 = (f"{r['eagle3-hybrid_tok_s']:.1f} ({r['eagle3-hybrid_speedup']:.2f})"
              if "eagle3-hybrid_tok_s" in r else "-")
        wf = f"{r['width_flips']}/{r['positions']}" if "width_flips" in r else "-"
        vf = f"{r['vs_f32_flips']}/{r['vs_f32_positions']}" if "vs_f32_flips" in r else "-"
        lines.append(f"| {r['backend']} | {r['precision']} | {r.get('cache', '-')} | {r['target_only_tok_s']:.1f} | "
                     f"{r['ngram_tok_s']:.1f} "
                     f"({r['ngram_speedup']:.2f}) | {r['suffix_tok_s']:.1f} ({r['suffix_speedup']:.2f}) | {e3} | "
                     f"{'yes' if eq else 'NO'} | {wf} | {vf} |")
    lines += _mtbench_width_lines(res.get("mtbench_width")) + _genai_lines(res["genai"]) + _goal_lines(res)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", type=Path, default=Path("build/demo/export/tlm/model.onnx"))
    ap.add_argument("--tokenizer", type=Path, default=Path("build/demo/tokenizer"))
    ap.add_argument("--hf", type=Path, default=Path("build/demo/hf/tlm"),
                    help="the checkpoint the export was made from (OpenVINO GenAI's IR is exported from it)")
    ap.add_argument("--out", type=Path, default=Path("build/bench/backends"))
    ap.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1],
                    help="comma list of thread counts, one run each")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=NEW)
    ap.add_argument("--mtbench-per-category", type=int, default=2,
                    help="MT-bench's width check: first turns per category (0: not run)")
    ap.add_argument("--paired-rounds", type=int, default=PAIRED_ROUNDS,
                    help="each goal's pair (ours and GenAI's, each in a fresh process) alternated this many times, "
                         "the order swapped every round (0: the goals from the rows)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--head", type=Path, default=None,
                    help="the EAGLE-3 head for the eagle3-hybrid rows (default workshop/heads/smollm2-eagle3)")
    ap.add_argument("--head-weights", choices=WEIGHTS, default="float",
                    help="the EAGLE-3 head's weights (import-head --weights; default float)")
    a = ap.parse_args(argv)
    from .mtbench import DEFAULT_HEAD
    hf = a.hf if a.hf.is_dir() else None
    res = {"runs": [run(a.export, a.tokenizer, a.out, t, a.prompts, new=a.max_new_tokens, hf=hf, width_check=i == 0,
                        mt_per_category=a.mtbench_per_category, head=a.head or DEFAULT_HEAD,
                        paired_rounds=a.paired_rounds, head_weights=a.head_weights)
                    for i, t in enumerate(a.threads)]}
    print(markdown(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
