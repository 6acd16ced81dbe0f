"""Suffix drafts against n-gram drafts and target-only (``python -m bench.run_bench --only suffix``):
{workload, draft, tokens_per_tlm_call, speedup} on the toy pair, batch 1, fallback on (K=0 compiled).

Workloads, each through one decoder per draft source, in order (the suffix source's
global trie is cleared at the start of each pass, so a pass learns only from its own
earlier requests, never from an earlier pass over the same prompts):

demo_instructions  the instructions ``make demo`` decodes (demo/prompts.py), as plain text.
repeated           a few held-out def + docstring prompts, each asked three times with small
                   changes: as is, the function renamed, and renamed again with its first
                   parameter renamed and a number changed (as agents and code-edit tools ask).
grounded, free     the n-gram section's prompts (bench/serving.py).

tokens_per_tlm_call: new tokens / TLM calls over the workload, the prefill counted as one
call (target-only: 1);
speedup: the per-prompt mean decode rate over target-only's (best of ``--serve-repeats``
interleaved passes). Greedy outputs are checked equal to target-only.
"""
from __future__ import annotations

import re
from pathlib import Path

from demo.prompts import DEMO_PROMPTS
from demo.rates import decode_rate

from .serving import _backends, grounded, held_out_functions


def variants(fn_text: str) -> list[str]:
    """The prompt, then with the function renamed, then also its first parameter renamed
    and a number changed (or one added to the docstring)."""
    name = re.match(r"def (\w+)", fn_text).group(1)
    v1 = re.sub(rf"\b{name}\b", f"{name}_new", fn_text)
    v2 = re.sub(rf"\b{name}\b", f"new_{name}", fn_text)
    params = re.match(r"def \w+\(\s*(\w+)", fn_text)
    if params and params.group(1) not in ("self", "cls"):
        v2 = re.sub(rf"\b{params.group(1)}\b", f"{params.group(1)}_in", v2)
    num = re.search(r"\b\d+\b", v2)
    if num:
        v2 = v2[:num.start()] + str(int(num.group()) + 7) + v2[num.end():]
    else:
        v2 = v2.replace('"""', '"""(Version 2.) ', 1)
    return [fn_text, v1, v2]


def workloads(tok, a) -> dict:
    budget = a.ctx_len - a.serve_new_tokens
    rep = [v for _, t in held_out_functions(3, budget - 20, tok) for v in variants(t)]
    return {
        "demo_instructions": [tok(t)["input_ids"] for t in DEMO_PROMPTS],
        "repeated": [tok(t)["input_ids"] for t in rep],
        "grounded": [tok(grounded(t))["input_ids"] for _, t in held_out_functions(6, budget - 40, tok, whole=True)],
        "free": [tok(t)["input_ids"] for _, t in held_out_functions(6, budget, tok)],
    }


def _pass(decs: dict, ids: list, a, best: dict, calls: dict) -> None:
    """One pass over a workload, every decoder per prompt in turn; keeps per-prompt best rates."""
    for i, p in enumerate(ids):
        want = None
        for name, dec in decs.items():
            r = dec.generate(p, max_new_tokens=a.serve_new_tokens)
            if want is None:
                want = r.generated_ids
            elif r.generated_ids != want:
                raise SystemExit(f"{name}: speculative output differs from target-only output")
            best[name][i] = max(best[name][i], decode_rate(r.metrics) or 0.0)
            m = r.metrics
            calls[name][0] += m["new_tokens"]
            calls[name][1] += m["tlm_verify_calls"] + (1 if m["new_tokens"] else 0)   # + the prefill's token


def bench_suffix(pair: dict, out: Path, a, tok) -> list:
    from specdec_compile.runtime import SpecDecoder, SuffixDraft, TargetOnlyDecoder
    eos = tok.eos_token_id
    tlm, _ = _backends(pair, out, a, 1, dlm=False, k_list="0,1,2,4")
    tlm.warmup()
    decs = {"none": TargetOnlyDecoder(tlm, eos_token_id=eos),
            "ngram": SpecDecoder(tlm, None, draft="ngram", eos_token_id=eos),
            "suffix": SpecDecoder(tlm, SuffixDraft(), eos_token_id=eos)}
    rows = []
    for kind, ids in workloads(tok, a).items():
        best = {k: [0.0] * len(ids) for k in decs}
        calls = {k: [0, 0] for k in decs}
        for r in range(a.serve_repeats):
            decs["suffix"].source.clear()
            _pass(decs, ids, a, best, calls)
        base = len(ids) / sum(1 / x for x in best["none"])
        for name in decs:
            rate = len(ids) / sum(1 / x for x in best[name])
            tpc = calls[name][0] / max(1, calls[name][1])
            rows.append({"workload": kind, "draft": name, "prompts": len(ids),
                         "tokens_per_tlm_call": round(tpc, 3), "tokens_per_s": round(rate, 1),
                         "speedup": round(rate / base, 3)})
            a.log(f"[suffix] {kind:17s} {name:6s}: {tpc:.2f} tokens/TLM call, {rate:.1f} tok/s "
                  f"({rate / base:.2f}x)")
    tlm.close()
    return rows


def run(pair: dict, out: Path, a, only: set) -> dict:
    if "suffix" not in only:
        return {}
    from specdec_compile.runtime.tokenizer import load_tokenizer
    return {"suffix_drafts": bench_suffix(pair, out, a, load_tokenizer(Path(pair["paths"]["tokenizer"])))}


def markdown(rows: list) -> list[str]:
    L = ["| workload | draft | tokens / TLM call | speedup vs none |", "|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['workload']} | {r['draft']} | {r['tokens_per_tlm_call']:.2f} | {r['speedup']:.2f}x |")
    return L + [""]
