"""Benchmark section ``real_ood``: SmolLM2-135M-Instruct's drafts on requests unlike the feature
draft's training text (stdlib-style instructions answered by SmolLM2).

    python -m bench.run_bench --only real-ood      # needs make demo's build (built when missing)

Three requests: two code completions of docstring-first stubs written for this benchmark
(``ood_prompts``; plain completion, no chat template) and one multi-turn chat (a user turn, an
assistant turn, a follow-up, through the chat template). Greedy, 128 new tokens, target-only and
each draft at ``k = "auto"`` (the adaptive width choice with the K=0 fallback) interleaved and
repeated, fastest decode kept; every speculative output checked token for token against
target-only. The rows are ``real_model``'s (same columns, ``bench/real_model.py``), one per
request and draft, plus one summed over the requests.
"""
from __future__ import annotations

import time
from pathlib import Path

from demo import real_demo
from demo.rates import decode_rate
from workshop import smollm2

from . import ood_prompts, real_model

CHAT = [
    {"role": "user", "content": "I am planning three days in Lisbon in April with my parents, who do not "
                                "like steep walks."},
    {"role": "assistant", "content": "Lisbon in April is lovely: mild days, some rain. Its hills are steep, so "
                                     "plan around trams, taxis and the flatter riverside districts."},
    {"role": "user", "content": "Which neighbourhoods should we stay in, and what should we pack?"},
]
DRAFTS = ["feature", "hybrid", "ngram", "distilled"]


def requests(tok) -> list[tuple[str, list[int]]]:
    """(name, prompt ids): the two stubs as raw text, the chat through the template."""
    out = []
    for i in (0, 3):
        ids = tok(ood_prompts.PROMPTS[i], add_special_tokens=False)["input_ids"]
        out.append((f"code stub {i}", [int(t) for t in ids]))
    chat = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    out.append(("multi-turn chat", [int(t) for t in (chat["input_ids"] if isinstance(chat, dict) else chat)]))
    return out


def run(out: Path, a, log=print) -> tuple[list[dict], dict]:
    """The ``real_ood`` rows and their settings."""
    from specdec_compile.runtime import SamplingParams, TargetOnlyDecoder

    real_demo.build(out, k=4, prefill_len=64, ctx_len=256, threads=a.real_threads, log=log,
                    fdraft_head=a.fdraft_head)
    tok, tlm, dlm, base = real_demo.open_backends(out, a.ort_threads)
    tlm_hs, fdlm = real_demo.open_feature_pair(out, a.ort_threads)
    eos = tlm.artifact.manifest.get("eos_token_ids") or tok.eos_token_id
    target = TargetOnlyDecoder(base, eos_token_id=eos)
    decs = {key: d for key, d in real_model.decoders(tlm, dlm, eos, tlm_hs, fdlm).items()
            if key[1] == "auto" and key[0] in DRAFTS}
    reqs = requests(tok)
    n_new = a.real_max_new_tokens
    warm = smollm2.chat_ids(tok, "Write a short poem about the sea.")
    for dec in decs.values():
        dec.generate(warm, max_new_tokens=24)
    target.generate(warm, max_new_tokens=4)
    best: dict = {}
    answers: dict = {}
    for r in range(a.real_repeats):
        for name, ids in reqs:
            for key in [("target", "auto")] + list(decs):
                dec = target if key[0] == "target" else decs[key]
                res = dec.generate(ids, max_new_tokens=n_new, sampling=SamplingParams())
                if key[0] == "target":
                    answers[name] = res.generated_ids
                elif res.generated_ids != answers[name]:
                    raise SystemExit(f"real_ood, {name}, {key[0]}: speculative output differs from target-only")
                bk = (key[0], name)
                if bk not in best or (decode_rate(res.metrics) or 0.0) > (decode_rate(best[bk]) or 0.0):
                    best[bk] = res.metrics
        log(f"  real_ood: repeat {r + 1}/{a.real_repeats} done")
    rows = []
    for draft in [k[0] for k in decs]:
        for name, _ in reqs + [("all", None)]:
            names = [n for n, _ in reqs] if name == "all" else [name]
            row = real_model.speed_row(draft, "greedy", "auto", [best[(draft, n)] for n in names],
                                  [best[("target", n)] for n in names])
            row["request"] = name
            rows.append(row)
            log(f"  {draft} on {name}: {row['speedup']:.2f}x, {row['tokens_per_tlm_call']} tokens per TLM call")
    for b in (tlm, dlm, base, tlm_hs, fdlm):
        b.close()
    info = {"requests": [n for n, _ in reqs], "chat": CHAT, "max_new_tokens": n_new, "repeats": a.real_repeats,
            "ort_threads": a.ort_threads, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    return rows, info


def markdown(rows: list[dict], info: dict) -> list[str]:
    L = ["", "### Requests unlike the training text (`real_ood`)", "",
         f"SmolLM2-135M-Instruct, greedy, {info['max_new_tokens']} new tokens, k = auto (adaptive, K=0 "
         f"fallback), best of {info['repeats']}; every output identical to target-only. Requests: "
         + ", ".join(info["requests"]) + ".", "",
         "| draft | request | target tok/s | spec tok/s | speedup | tokens / TLM call | accepted / drafted |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        L.append(f"| {r['draft']} | {r['request']} | {r['target_tokens_per_s']} | {r['spec_tokens_per_s']} | "
                 f"{r['speedup']:.2f}x | {r['tokens_per_tlm_call']} | {r['acceptance_rate']} |")
    return L
