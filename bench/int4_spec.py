"""``step_floor``'s speculative rows on the int4 target: SmolLM2-135M-Instruct quantized weight-only
to int4 (``step_floor.quantize_int4``, ``MatMulNBits``) before compiling, decoding the demo's
instructions target-only and with drafts, as CPU users would run it.

Needs ``make demo``'s build (its tokenizer, its export and its feature draft ``fdlm``). Compiled
here with the demo's settings (ctx 256, prefill 64, widths 1..9): from the int4 export, the TLM
with ``--hidden-states -1`` (the hybrid's and the feature draft's target; prompt lookup runs on
it too) and the target-only baseline (``--role dlm``); from the float32 export, its target-only
baseline, by the same compiler.
The feature draft is the demo's, trained on the float32 target's features: the int4 target's
features differ a little, which its acceptance shows.

Greedy, ``k = "auto"`` (the adaptive width choice with the K=0 fallback), 128 new tokens per
instruction, every speculative output checked token for token against the int4 target alone;
target-only (float32 and int4) and each draft interleaved and repeated, fastest decode kept.
The rows are ``real_model``'s columns (``speedup`` over the int4 target alone) plus
``over_float32_target``: the same decode rate over the float32 target alone, measured in the
same run.
"""
from __future__ import annotations

from pathlib import Path

from demo import real_demo
from demo.compiling import compile_artifact
from demo.rates import decode_rate
from workshop import prompts as prompt_sets
from workshop import smollm2

DRAFTS = ("ngram", "hybrid", "feature")
#: the demo's compile settings (``real_demo.build``)
COMMON = ["--target", "ort", "--prefill-len", "64", "--ctx-len", "256"]


def compile_int4(int4_export: Path, float_export: Path, out: Path, log=print,
                 fdraft: Path | None = None) -> dict:
    """The int4 TLM with hidden states and the int4 target-only baseline, as the demo compiles its own;
    the float32 target-only baseline by the same compiler (``float32-base``); and ``fdraft`` (the demo's
    feature draft export) compiled for the int4 target (``fdlm``: a feature draft records the target
    it reads, and the runtime refuses it with another)."""
    ks = ["--k", "4", "--k-list", ",".join(map(str, real_demo.K_LIST))]
    extra = {} if fdraft is None else {"fdlm": compile_artifact(fdraft, out / "fdlm", [
        "--role", "dlm", *ks, "--feature-layers", "-1", "--feature-target", str(int4_export), *COMMON], log=log)}
    return {**extra, "tlm-hs": compile_artifact(int4_export, out / "tlm-hs", ["--role", "tlm", *ks, "--hidden-states", "-1",
                                                                     *COMMON], log=log),
            "tlm-base": compile_artifact(int4_export, out / "tlm-base", ["--role", "dlm", *COMMON], log=log),
            "float32-base": compile_artifact(float_export, out / "float32-base", ["--role", "dlm", *COMMON], log=log)}


def width_dependence(tlm_model: Path, *, tokens: int = 24, width: int = 4, seed: int = 0, ctx_len: int = 256) -> dict:
    """How much a compiled TLM's logits depend on the width of the call: ``tokens`` random tokens
    fed one at a time and ``width`` at a time from an empty cache; the largest |difference| of
    their logits and the positions whose top token differs. A speculative loop reproduces the
    target's own greedy decoding only where this is (close to) 0: its verification computes a
    position's logits in a call of several tokens, target-only decoding in a call of one."""
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(tlm_model), so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    vocab = next(o.shape[-1] for o in sess.get_outputs() if o.name == "logits")
    ids = np.random.default_rng(seed).integers(0, vocab if isinstance(vocab, int) else 5000, tokens)
    logits = {}
    for w in (1, width):
        feeds = {i.name: np.zeros((1, i.shape[1], ctx_len, i.shape[3]), np.float32)
                 for i in sess.get_inputs() if i.name.startswith("past_")}
        rows = []
        for st in range(0, tokens, w):
            feeds["input_ids"] = ids[None, st:st + w].astype(np.int64)
            feeds["position_ids"] = np.arange(st, st + w, dtype=np.int64)[None]
            o = dict(zip(outs, sess.run(None, feeds)))
            for k in [k for k in feeds if k.startswith("past_")]:
                feeds[k] = o[k + "_RetainedState"]
            rows.append(o["logits"][0])
        logits[w] = np.concatenate(rows)
    return {"max_abs_diff": float(np.max(np.abs(logits[1] - logits[width]))),
            "top_token_differs": int((logits[1].argmax(-1) != logits[width].argmax(-1)).sum()),
            "tokens": tokens, "width": width}


def run(build: Path, int4_export: Path, out: Path, int8_act_export: Path | None = None, *, ort_threads: int = 1,
        repeats: int = 2, prompts: int = 4, max_new_tokens: int = 128, log=print) -> dict:
    """The rows and their settings; ``{"skipped": reason}`` without the demo's build.
    ``int8_act_export``: the int4 export with int8 activations (accuracy_level 4), of which only
    the width dependence is measured (its speculative output cannot equal its own target-only)."""
    from specdec_compile.runtime import OrtBackend, SamplingParams, SpecDecoder, TargetOnlyDecoder
    from specdec_compile.runtime.tokenizer import load_tokenizer

    from . import real_model

    need = ("tokenizer", "export/tlm/model.onnx", "export/fdraft/model.onnx")
    missing = [p for p in need if not (build / p).exists()]
    if missing:
        return {"skipped": f"no {', '.join(missing)} in {build} (`make demo` builds them)"}
    compile_int4(int4_export, build / "export" / "tlm" / "model.onnx", out, log,
                 fdraft=build / "export" / "fdraft" / "model.onnx")
    dep = {"float32": width_dependence(build / "tlm-hs" / "model.onnx") if (build / "tlm-hs").exists() else None,
           "int4": width_dependence(out / "tlm-hs" / "model.onnx")}
    if int8_act_export is not None and int8_act_export.exists():
        compile_artifact(int8_act_export, out / "int8-act-tlm", ["--role", "tlm", "--k", "4", *COMMON], log=log)
        dep["int4, int8 activations"] = width_dependence(out / "int8-act-tlm" / "model.onnx")
    log("  [step_floor] logits' dependence on the call width (1 vs 4 tokens a call): " + "; ".join(
        f"{k}: max |diff| {v['max_abs_diff']:.2g}, {v['top_token_differs']} top tokens differ"
        for k, v in dep.items() if v))
    kw = {"intra_op_threads": ort_threads}
    tok = load_tokenizer(build / "tokenizer")
    tlm, base, fbase, fdlm = (OrtBackend(out / "tlm-hs", **kw), OrtBackend(out / "tlm-base", **kw),
                              OrtBackend(out / "float32-base", **kw), OrtBackend(out / "fdlm", **kw))
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    decs = {"target": TargetOnlyDecoder(base, eos_token_id=eos),
            "float32 target": TargetOnlyDecoder(fbase, eos_token_id=eos),
            "ngram": real_demo.runtime_ngram_decoder(tlm, eos),
            "hybrid": SpecDecoder(tlm, fdlm, draft="hybrid", ngram_max=real_demo.NGRAM_MAX, eos_token_id=eos),
            "feature": SpecDecoder(tlm, fdlm, eos_token_id=eos, adaptive=True)}
    decs = {k: d for k, d in decs.items() if d is not None}
    ids_list = [smollm2.chat_ids(tok, t) for t in prompt_sets.DEMO_PROMPTS[:prompts]]
    warm = smollm2.chat_ids(tok, prompt_sets.WARMUP_PROMPT)
    for d in decs.values():
        d.generate(warm, max_new_tokens=16)
    best: dict = {}
    answers: dict = {}
    for r in range(repeats):
        for pi, ids in enumerate(ids_list):
            for name, d in decs.items():
                res = d.generate(ids, max_new_tokens=max_new_tokens, sampling=SamplingParams())
                if name == "target":
                    answers[pi] = res.generated_ids
                elif name != "float32 target" and res.generated_ids != answers[pi]:
                    raise SystemExit(f"int4 target, {name}: speculative output differs from the int4 target alone")
                key = (name, pi)
                if key not in best or (decode_rate(res.metrics) or 0.0) > (decode_rate(best[key]) or 0.0):
                    best[key] = res.metrics
        log(f"  [step_floor] int4 speculative: repeat {r + 1}/{repeats} done")
    per = range(len(ids_list))
    tms = [best[("target", p)] for p in per]
    f_tok, f_t = real_model.tokens_and_time([best[("float32 target", p)] for p in per])
    rows = []
    for name in [d for d in DRAFTS if d in decs]:
        row = real_model.speed_row(name, "greedy", "auto", [best[(name, p)] for p in per], tms)
        row["over_float32_target"] = round(row["spec_tokens_per_s"] / (f_tok / f_t), 3)
        rows.append(row)
        log(f"  [step_floor] int4 {name}: {row['speedup']:.2f}x over int4 target-only "
            f"({row['over_float32_target']:.2f}x over float32 target-only), "
            f"{row['tokens_per_tlm_call']} tokens per TLM call")
    for b in (tlm, base, fbase, fdlm):
        b.close()
    int4_rate = real_model.tokens_and_time(tms)
    return {"rows": rows, "width_dependence": dep, "int4_target_tokens_per_s": round(int4_rate[0] / int4_rate[1], 2),
            "float32_target_tokens_per_s": round(f_tok / f_t, 2), "prompts": prompts,
            "max_new_tokens": max_new_tokens, "repeats": repeats, "ort_threads": ort_threads}


def markdown(rec: dict) -> list[str]:
    if not rec or "rows" not in rec:
        return [f"int4 speculative rows skipped: {rec.get('skipped')}", ""] if rec else []
    L = [f"The int4 target decoding the demo's {rec['prompts']} instructions (greedy, k = auto, "
         f"{rec['max_new_tokens']} new tokens, best of {rec['repeats']}; every output identical to the int4 "
         f"target alone): int4 target-only {rec['int4_target_tokens_per_s']} tok/s, float32 target-only "
         f"{rec['float32_target_tokens_per_s']} tok/s.", "",
         "| draft on the int4 target | tok/s | speedup over int4 target-only | over float32 target-only "
         "| tokens / TLM call |", "|---|---|---|---|---|"]
    for r in rec["rows"]:
        L.append(f"| {r['draft']} | {r['spec_tokens_per_s']} | {r['speedup']:.2f}x | {r['over_float32_target']:.2f}x "
                 f"| {r['tokens_per_tlm_call']} |")
    dep = {k: v for k, v in (rec.get("width_dependence") or {}).items() if v}
    if dep:
        L += ["", "How much the TLM's logits depend on the call width (24 random tokens, 1 vs 4 a call):", "",
              "| target | max abs logit difference | top tokens that differ |", "|---|---|---|"]
        L += [f"| {k} | {v['max_abs_diff']:.2g} | {v['top_token_differs']} of {v['tokens']} |" for k, v in dep.items()]
    return L + [""]
