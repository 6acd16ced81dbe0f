"""Benchmark section ``real_model``: SmolLM2-135M-Instruct with its drafts, greedy and sampled.

Called by ``python -m bench.run_bench`` (``--only real``); needs ``make demo``'s
build (``build/demo``; built here when missing, which takes the demo's time).

Drafts: ``feature`` (the demo's feature draft, EAGLE-style, over the TLM compiled
with ``--hidden-states -1``; k = 2..5 and "auto"), ``distilled`` (the demo's
distilled draft model) and ``ngram`` (the
runtime's prompt lookup, ``SpecDecoder(tlm, None, draft="ngram")``: no draft
model), each at fixed k (drafts per round) and ``k = "auto"`` (the runtime's
adaptive choice over the compiled widths, with the K=0 fallback). Per draft,
mode and k, on the demo's instructions (chat template, 128 new tokens),
target-only and speculative runs interleaved and repeated (greedy: fastest
decode kept; sampling at T 0.7, top-p 0.95: one seed per repeat, every run
counted):

* ``target_tokens_per_s``, ``spec_tokens_per_s``, ``speedup``: decode phase
  (after the first token), summed over the prompts.
* ``alpha``: fixed k: per-draft acceptance, accepted / (accepted + rejections)
  (a round with fewer than k accepted ended in one rejection); rounds that
  draft a varying number (n-gram, "auto") have no such count in the runtime's
  metrics and report accepted / drafted (``alpha_def`` says which).
* ``c``: draft step / target step (both measured in the run; 0 for n-gram).
* ``predicted_speedup``: decode tokens x target step / the model time of the
  speculative run's decode phase (its own TLM and DLM calls): the speedup
  if the host loop cost nothing; ``achieved_over_predicted`` is what the host
  (Python loop, sampling arithmetic, binding) leaves of it.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from demo import real_demo
from demo.rates import busy_time_s, decode_rate, decode_time_s
from workshop import prompts as prompt_sets
from workshop import smollm2

from .spec import alpha_from, merge_width_times

KS = [2, 4, "auto"]
FEATURE_KS = [2, 3, 4, 5, "auto"]      # the feature draft: every fixed k the picture draws
SAMPLING = {"temperature": 0.7, "top_p": 0.95}


def tokens_and_time(ms: list[dict]) -> tuple[int, float]:
    tok = sum(m["new_tokens"] - 1 for m in ms)
    t = sum(decode_time_s(m) for m in ms)
    return tok, t


def _decode_model_time(m: dict) -> float:
    pre = m.get("prefill_time_s") or {}
    return m["tlm_time_s"] + m["dlm_time_s"] - pre.get("tlm", 0.0) - pre.get("dlm", 0.0)


def speed_row(draft: str, mode: str, k, ms: list[dict], tms: list[dict]) -> dict:
    s_tok, s_t = tokens_and_time(ms)
    t_tok, t_t = tokens_and_time(tms)
    rate, trate = s_tok / s_t, t_tok / t_t
    n1, t1 = merge_width_times(tms)["tlm"]["1"]                      # the decode steps
    t_step = t1 / n1
    widths = merge_width_times(ms)
    d_n = sum(widths.get("dlm", {}).get(w, [0, 0])[0] for w in ("1", "2"))
    d_t = sum(widths.get("dlm", {}).get(w, [0, 0.0])[1] for w in ("1", "2"))
    dlm_step = d_t / d_n if d_n else 0.0
    vcalls = sum(m["tlm_verify_calls"] for m in ms)
    produced = sum((m["mean_tokens_per_tlm_call"] or 0) * m["tlm_verify_calls"] for m in ms)
    acc, drafted = sum(m["accepted_tokens"] for m in ms), sum(m["drafted_tokens"] for m in ms)
    if isinstance(k, int):
        hl = max(len(m["acceptance_histogram"]) for m in ms)
        hist = [sum(m["acceptance_histogram"][i] if i < len(m["acceptance_histogram"]) else 0 for m in ms)
                for i in range(hl)]
        alpha, adef = alpha_from({"acceptance_histogram": hist, "accepted_tokens": acc}, k), \
            "accepted/(accepted+rejections)"
    else:
        alpha, adef = (acc / drafted if drafted else None), "accepted/drafted"
    model_t = sum(_decode_model_time(m) for m in ms)
    pred = s_tok * t_step / model_t if model_t > 0 else None
    speedup = rate / trate
    host = sum(m["host_time_s"] for m in ms) / sum(busy_time_s(m) for m in ms)
    return {"draft": draft, "mode": mode, "k": k, "measured": True,
            "target_tokens_per_s": round(trate, 2), "spec_tokens_per_s": round(rate, 2),
            "speedup": round(speedup, 3), "alpha": round(alpha, 4) if alpha is not None else None,
            "alpha_def": adef, "acceptance_rate": round(acc / drafted, 4) if drafted else None,
            "tokens_per_tlm_call": round(produced / vcalls, 3) if vcalls else None,
            "c": round(dlm_step / t_step, 4), "predicted_speedup": round(pred, 3) if pred else None,
            "achieved_over_predicted": round(speedup / pred, 3) if pred else None,
            "target_step_ms": round(t_step * 1e3, 2), "draft_step_ms": round(dlm_step * 1e3, 3),
            "host_share": round(host, 4), "new_tokens": s_tok + len(ms),
            "verify_drafts_histogram": _merge_hist([m.get("verify_drafts_histogram") or {} for m in ms])}


def _merge_hist(hs: list[dict]) -> dict:
    out: dict = {}
    for h in hs:
        for j, c in h.items():
            out[j] = out.get(j, 0) + c
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def decoders(tlm, dlm, eos, tlm_hs=None, fdlm=None) -> dict:
    """(draft, k) -> decoder; the n-gram ones only when the runtime has n-gram drafts; the feature
    draft's (``fdlm`` over the TLM with hidden states ``tlm_hs``) and the hybrid's (prompt lookup,
    else that feature draft; adaptive k only) when given."""
    from specdec_compile.runtime import SpecDecoder
    out = {}
    if fdlm is not None:
        for k in FEATURE_KS:
            fixed = k if isinstance(k, int) else None
            out[("feature", k)] = SpecDecoder(tlm_hs, fdlm, eos_token_id=eos, k=fixed, adaptive=fixed is None)
        # prompt lookup when a 2+ token n-gram matches, the feature draft otherwise (drafts/hybrid.py)
        out[("hybrid", "auto")] = SpecDecoder(tlm_hs, fdlm, draft="hybrid", ngram_max=real_demo.NGRAM_MAX,
                                              eos_token_id=eos)
    for k in KS:
        fixed = k if isinstance(k, int) else None
        out[("distilled", k)] = SpecDecoder(tlm, dlm, eos_token_id=eos, k=fixed, adaptive=fixed is None)
        ng = real_demo.runtime_ngram_decoder(tlm, eos, fixed)
        if ng is not None:
            out[("ngram", k)] = ng
    return out


def build(out: Path, a, log=print) -> dict:
    """``make demo``'s build with its feature pair (every stage cached)."""
    return real_demo.build(out, k=4, prefill_len=64, ctx_len=256, threads=a.real_threads, log=log,
                           fdraft_head=a.fdraft_head, feature_head=True)


def ensure_feature_pair(out: Path, a, log=print) -> None:
    """The feature pair in ``make demo``'s build, for the sections that read it (step_floor's int4
    rows, fallback_feature, mtbench's hybrid): ``make demo`` builds it only without an EAGLE-3
    head (docs/demo.md), so it is built here when the build's target is there and it is not."""
    if (out / "export" / "tlm" / "model.onnx").is_file() and not (out / "fdlm" / "manifest.json").is_file():
        log(f"[bench] {out}: no feature pair (make demo builds it only without an EAGLE-3 head): building it")
        build(out, a, log)


def run(out: Path, a, log=print) -> tuple[list[dict], dict]:
    """The ``real_model`` rows and the settings they were measured with."""
    from specdec_compile.runtime import SamplingParams, TargetOnlyDecoder

    built = build(out, a, log)
    tok, tlm, dlm, base = real_demo.open_backends(out, a.ort_threads)
    tlm_hs, fdlm = real_demo.open_feature_pair(out, a.ort_threads)
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    target = TargetOnlyDecoder(base, eos_token_id=eos)
    decs = decoders(tlm, dlm, eos, tlm_hs, fdlm)
    costs = real_demo.width_costs(tlm, dlm, base, tlm_hs=tlm_hs, fdlm=fdlm)
    ids_list = [smollm2.chat_ids(tok, t) for t in prompt_sets.DEMO_PROMPTS[: a.real_prompts]]
    n_new = a.real_max_new_tokens
    log(f"[real] {len(ids_list)} instructions, {n_new} new tokens, drafts x k = {sorted(map(str, decs))}, "
        f"{a.real_repeats} repeats, ORT {a.ort_threads} thread(s); c from the isolated call costs: "
        f"{costs['dlm_s'] / costs['step_s']:.3f}")
    warm = smollm2.chat_ids(tok, prompt_sets.WARMUP_PROMPT)
    for dec in decs.values():
        dec.generate(warm, max_new_tokens=24)
    target.generate(warm, max_new_tokens=4)

    rows: list[dict] = []
    answers: dict = {}
    for mode in ("greedy", "sampling"):
        best: dict = {}
        for r in range(a.real_repeats):
            sp = (SamplingParams() if mode == "greedy" else
                  SamplingParams(SAMPLING["temperature"], 0, SAMPLING["top_p"], seed=1000 + r))
            for pi, ids in enumerate(ids_list):
                for key in [("target", 0)] + list(decs):
                    dec = target if key[0] == "target" else decs[key]
                    res = dec.generate(ids, max_new_tokens=n_new, sampling=sp)
                    if mode == "greedy" and key[0] == "target":
                        answers[pi] = res.generated_ids
                    elif mode == "greedy" and res.generated_ids != answers[pi]:
                        raise SystemExit(f"real model, {key}: speculative output differs from target-only")
                    bk = (key, pi, r if mode == "sampling" else 0)
                    if mode == "sampling" or bk not in best or (decode_rate(res.metrics) or 0.0) > (decode_rate(best[bk]) or 0.0):
                        best[bk] = res.metrics
            log(f"  {mode}: repeat {r + 1}/{a.real_repeats} done")
        reps = range(a.real_repeats) if mode == "sampling" else [0]
        tms = [best[(("target", 0), pi, r)] for pi in range(len(ids_list)) for r in reps]
        for key in decs:
            row = speed_row(key[0], mode, key[1], [best[(key, pi, r)] for pi in range(len(ids_list)) for r in reps], tms)
            rows.append(row)
            log(f"  {key[0]} {mode} k={key[1]}: {row['spec_tokens_per_s']:.1f} vs {row['target_tokens_per_s']:.1f} "
                f"tok/s -> {row['speedup']:.2f}x (predicted {row['predicted_speedup']}x); alpha {row['alpha']}, "
                f"c {row['c']}, host {row['host_share']:.1%}")

    ng = real_demo.ngram_prediction([(ids_list[i], answers[i]) for i in range(len(ids_list))], costs)
    log(f"  ngram replay on the greedy answers (a prediction, not a measurement): best k {ng['best_k']}, "
        f"{ng['predicted_speedup']}x")
    for b in (tlm, dlm, base, tlm_hs, fdlm):
        b.close()
    fd = built["fdraft"]
    info = {"model": built["target"]["name"], "source": built["target"]["source"],
            "draft": {k: built["draft"][k] for k in ("params", "head_rows", "layers", "train_answer_tokens",
                                                     "metrics")},
            "fdraft": {"trained_params": fd["trained_params"], "head_rows": fd["head_rows"],
                       "trained_elsewhere": fd.get("trained_elsewhere"),
                       "train_answer_tokens": fd["train_answer_tokens"],
                       "acceptance_given_previous": fd["metrics"]["acceptance_given_previous"],
                       "replay": {k: r["tokens_per_tlm_call"] for k, r in fd["metrics"]["replay"].items()}},
            "prompts": prompt_sets.DEMO_PROMPTS[: a.real_prompts], "max_new_tokens": n_new,
            "repeats": a.real_repeats, "sampling": SAMPLING, "ort_threads": a.ort_threads,
            "costs_ms": {"target_step": round(costs["step_s"] * 1e3, 2), "draft_step": round(costs["dlm_s"] * 1e3, 3),
                         "feature_draft_step": round(costs["fdlm_s"] * 1e3, 3),
                         "verify": {str(w): round(t * 1e3, 2) for w, t in costs["verify_s"].items()},
                         "verify_with_hidden_states": {str(w): round(t * 1e3, 2)
                                                       for w, t in costs["verify_hs_s"].items()}},
            "ngram_replay_prediction": ng, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    return rows, info


def markdown(rows: list[dict], info: dict) -> list[str]:
    d, sm = info.get("draft") or {}, info.get("sampling") or SAMPLING
    fd = info.get("fdraft") or {}
    where = f", trained elsewhere: {fd['trained_elsewhere']}" if fd.get("trained_elsewhere") else ""
    feat = (f"feature draft: EAGLE-style head over the TLM's last-layer features ({fd['trained_params'] / 1e6:.1f}M "
            f"trained parameters, head {fd.get('head_rows')} rows{where}); " if fd.get("trained_params") else "")
    L = [f"real_model: {info.get('model')}; {feat}distilled draft: layer(s) {d.get('layers')}, head "
         f"{d.get('head_rows')} rows; ngram: the runtime's prompt lookup; sampling T={sm['temperature']}, "
         f"top-p {sm['top_p']}; all rows measured", "",
         "| draft | mode | k | target tok/s | spec tok/s | speedup | alpha | tok/TLM call | c | predicted | achieved/predicted |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=2, s="": "-" if v is None else f"{v:.{p}f}{s}"  # noqa: E731
    for r in rows:
        L.append(f"| {r['draft']} | {r['mode']} | {r['k']} | {f(r['target_tokens_per_s'], 1)} | "
                 f"{f(r['spec_tokens_per_s'], 1)} | {f(r['speedup'], 2, 'x')} | {f(r['alpha'], 3)} | "
                 f"{f(r['tokens_per_tlm_call'])} | {f(r['c'], 3)} | {f(r['predicted_speedup'], 2, 'x')} | "
                 f"{f(r['achieved_over_predicted'])} |")
    return L + [""]


COLORS = {"feature": "#d62728", "distilled": "#1f77b4", "ngram": "#2ca02c", "hybrid": "#9467bd",
          "eagle3": "#ff7f0e", "eagle3-hybrid": "#8c564b"}
#: for a second variant of one draft (``eagle3:4`` beside ``eagle3``, a head's ``+int8``) and unknown names
SPARE_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                "#c5b0d5", "#c49c94")


def series_colors(names: list) -> dict:
    """A color per series name, no two alike: a draft's own (``COLORS``, by the name before ``:``, ``+``
    or ``@``) to the first name that claims it, exact names first; the others the next unused spare."""
    out: dict = {}
    for n in sorted(names, key=lambda n: (str(n) not in COLORS, str(n))):
        own = COLORS.get(re.split(r"[:+@]", str(n))[0])
        free = [c for c in (own, *SPARE_COLORS, *COLORS.values()) if c and c not in out.values()]
        out[n] = free[0] if free else "#555"
    return out


def picture(rows: list[dict], path: Path) -> Path:
    """One SVG, drawn by hand (no plotting library needed): speedup (left) and tokens per TLM
    call (right) against k, one line per draft and mode (greedy solid, sampling dashed); the
    adaptive rows ("auto") as a marker at the right edge."""
    fixed = sorted({r["k"] for r in rows if isinstance(r["k"], int)})
    if not fixed:
        raise ValueError("no fixed-k rows to draw")
    return draw(rows, path, xs=fixed + ["auto"], xkey="k", marker="auto", xlabel="k (drafts per round)")


def draw(rows: list[dict], path: Path, *, xs: list, xkey: str, marker, xlabel: str, series: str = "draft") -> Path:
    """The two panels (speedup, tokens per TLM call) against ``rows[i][xkey]`` over ``xs``, one line
    per (``series``, mode): greedy solid, sampling dashed; the x value ``marker`` drawn as a square
    (not joined). Long x labels are slanted."""
    W, H, pad, gap = 360, 260, 48, 40
    slant = max(len(str(x)) for x in xs) > 5
    bottom = pad + (36 if slant else 0)

    color = series_colors(list({r[series] for r in rows})).get      # one color per line, no two alike

    def panel(x0: int, key: str, title: str) -> list[str]:
        vals = [r[key] for r in rows if r.get(key) is not None]
        lo, hi = min(vals + [1.0]), max(vals + [1.0])
        lo, hi = lo - 0.05 * (hi - lo + 0.1), hi + 0.05 * (hi - lo + 0.1)
        X = lambda k: x0 + pad + (W - pad - 10) * (xs.index(k) / max(1, len(xs) - 1))  # noqa: E731
        Y = lambda v: 20 + (H - 20 - pad) * (1 - (v - lo) / (hi - lo))  # noqa: E731
        out = [f'<text x="{x0 + W / 2}" y="14" text-anchor="middle" font-size="13">{title}</text>',
               f'<line x1="{x0 + pad}" y1="{H - pad}" x2="{x0 + W - 10}" y2="{H - pad}" stroke="#000"/>',
               f'<line x1="{x0 + pad}" y1="20" x2="{x0 + pad}" y2="{H - pad}" stroke="#000"/>',
               f'<line x1="{x0 + pad}" y1="{Y(1.0):.1f}" x2="{x0 + W - 10}" y2="{Y(1.0):.1f}" stroke="#999" '
               f'stroke-dasharray="2,3"/>']
        for i in range(5):
            v = lo + (hi - lo) * i / 4
            out.append(f'<text x="{x0 + pad - 4}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="10">{v:.2f}</text>')
        for k in xs:
            tilt = f' transform="rotate(-35 {X(k):.1f} {H - pad + 12})"' if slant else ""
            out.append(f'<text x="{X(k):.1f}" y="{H - pad + 14}" text-anchor="{"end" if slant else "middle"}" '
                       f'font-size="10"{tilt}>{k}</text>')
        out.append(f'<text x="{x0 + W / 2}" y="{H - pad + 30 + bottom - pad}" text-anchor="middle" '
                   f'font-size="11">{xlabel}</text>')
        for (name, mode) in sorted({(r[series], r["mode"]) for r in rows}):
            pts = [(r[xkey], r[key]) for r in rows if r[series] == name and r["mode"] == mode
                   and r.get(key) is not None and r[xkey] in xs]
            line = [(X(k), Y(v)) for k, v in sorted((p for p in pts if p[0] != marker), key=lambda p: xs.index(p[0]))]
            dash = "" if mode == "greedy" else ' stroke-dasharray="6,4"'
            c = color(name)
            if len(line) > 1:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in line)
                out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"{dash}/>')
            for x, y in line:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>')
            for k, v in pts:
                if k == marker:
                    shape = "none" if mode == "sampling" else c
                    out.append(f'<rect x="{X(k) - 4:.1f}" y="{Y(v) - 4:.1f}" width="8" height="8" fill="{shape}" '
                               f'stroke="{c}"/>')
        return out

    body = panel(0, "speedup", "speedup over target-only") + panel(W + gap, "tokens_per_tlm_call",
                                                                   "tokens per TLM call")
    ly = H + bottom - pad + 6
    names = list(dict.fromkeys(r[series] for r in sorted(rows, key=lambda r: str(r[series]))))
    legend = []
    for i, name in enumerate(names):
        c = color(name)
        legend.append(f'<line x1="{pad + i * 130}" y1="{ly}" x2="{pad + i * 130 + 24}" y2="{ly}" stroke="{c}" '
                      f'stroke-width="2"/><text x="{pad + i * 130 + 30}" y="{ly + 4}" font-size="11">{name}</text>')
    legend.append(f'<text x="{pad}" y="{ly + 20}" font-size="11">solid: greedy, dashed: sampling; '
                  f'square: {marker}</text>')
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(2 * W + gap, pad + 130 * len(names))}" '
           f'height="{ly + 30}" font-family="sans-serif">', '<rect width="100%" height="100%" fill="#fff"/>',
           *body, *legend, "</svg>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(svg) + "\n")
    return path
