"""The K=0 floor of a feature pair (``python -m bench.run_bench --only fallback_feature``; issue 30, part 5).

Where drafts fail, the width policy drafts nothing (K=0) and each round is one width-1 call of the
TLM. With a feature draft that TLM is the one compiled with ``--hidden-states -1``: its width-1
call also returns the features the draft reads when drafting resumes. This section measures, on
SmolLM2 (``make demo``'s build, read only: tlm-base, tlm, tlm-hs, fdlm), in one run, interleaved
(each round runs every decoder on every prompt, the order rotating round by round):

target          target-only decoding on ``tlm-base`` (the export compiled ``--role dlm``: the
                plain seq_len-1 step), the baseline
feature_k0      the feature pair (tlm-hs + fdlm) with drafting forced off (``k=0``, not adaptive)
tlm_hs_alone    target-only decoding on tlm-hs itself (its width-1 call, no drafter): the graph's
                own cost, apart from the loop's
plain_k0        the plain TLM (no hidden states) with n-gram drafts forced off (``k=0``)

Per decoder: decode tokens/s (all prompts' decode tokens over their decode time, best round), the
median width-1 TLM call (ms) and the host time per token (the loop's own work); and the paired
ratio to ``target`` of each round's rate (the median over rounds): the issue's goal is
feature_k0 >= 0.98x. Every greedy output, of every round, must equal target-only's of the same round
or the section fails. ORT threads: each of ``--fallback-feature-threads`` (default 1,2), one side-by-side
run each.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from .record import verdict

ARTIFACTS = ("tlm-base", "tlm", "tlm-hs", "fdlm")
DECODERS = ("target", "feature_k0", "tlm_hs_alone", "plain_k0")
GOAL = 0.98          # issue 30 part 5: feature_k0 over target-only


def add_args(ap) -> None:
    ap.add_argument("--fallback-feature-threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2],
                    help="fallback_feature: comma list of ORT thread counts, one side-by-side run each (1,2)")
    ap.add_argument("--fallback-feature-rounds", type=int, default=3,
                    help="fallback_feature: interleaved rounds (each decoder on every prompt once per round)")
    ap.add_argument("--fallback-feature-prompts", type=int, default=2,
                    help="fallback_feature: the demo's instructions decoded (chat-formatted)")
    ap.add_argument("--fallback-feature-new-tokens", type=int, default=48,
                    help="fallback_feature: new tokens per prompt")


def run(a, only: set) -> dict:
    """The section: {"fallback_feature": record}, or {} (skipped in one line) without make demo's build."""
    if "fallback_feature" not in only:
        return {}
    build = a.real_out
    missing = [n for n in ARTIFACTS if not (build / n / "manifest.json").is_file()]
    if missing or not (build / "tokenizer").is_dir():
        a.log(f"[fallback_feature] skipped: no {', '.join(missing) or 'tokenizer'} in {build} (`make demo` builds them)")
        return {}
    from workshop.prompts import DEMO_PROMPTS
    from workshop.smollm2 import chat_ids
    from specdec_compile.runtime.tokenizer import load_tokenizer
    tok = load_tokenizer(build / "tokenizer")
    prompts = [chat_ids(tok, t) for t in DEMO_PROMPTS[:a.fallback_feature_prompts]]
    runs = [measure(build, prompts, th, a.fallback_feature_rounds, a.fallback_feature_new_tokens, a.log)
            for th in a.fallback_feature_threads]
    return {"fallback_feature": {"build": str(build), "prompts": len(prompts),
                                 "new_tokens": a.fallback_feature_new_tokens,
                                 "rounds": a.fallback_feature_rounds, "runs": runs}}


def decoders(bk: dict, eos) -> dict:
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    return {"target": TargetOnlyDecoder(bk["tlm-base"], eos_token_id=eos),
            "feature_k0": SpecDecoder(bk["tlm-hs"], bk["fdlm"], k=0, adaptive=False, eos_token_id=eos),
            "tlm_hs_alone": TargetOnlyDecoder(bk["tlm-hs"], eos_token_id=eos),
            "plain_k0": SpecDecoder(bk["tlm"], None, draft="ngram", k=0, adaptive=False, eos_token_id=eos)}


def measure(build: Path, prompts: list, threads: int, rounds: int, n_new: int, log=print) -> dict:
    """One side-by-side run at ``threads`` ORT threads (see the module doc)."""
    from specdec_compile.runtime import OrtBackend
    bk = {n: OrtBackend(build / n, intra_op_threads=threads) for n in ARTIFACTS}
    for b in bk.values():
        b.warmup()
    eos = bk["tlm-base"].artifact.manifest.get("eos_token_ids")
    decs = decoders(bk, eos)
    rates = {d: [] for d in DECODERS}
    calls = {d: [] for d in DECODERS}
    host = {d: [] for d in DECODERS}
    outs: dict = {}
    for r in range(rounds):
        order = DECODERS[r % len(DECODERS):] + DECODERS[:r % len(DECODERS)]
        tokens, secs = dict.fromkeys(DECODERS, 0), dict.fromkeys(DECODERS, 0.0)
        for i, p in enumerate(prompts):
            for d in order:
                res = decs[d].generate(p, max_new_tokens=n_new)
                outs.setdefault((r, i), {})[d] = res.generated_ids      # every round's, not only the last
                m = res.metrics
                n, t = m["new_tokens"] - 1, m["total_time_s"] - m["ttft_s"]
                tokens[d] += n
                secs[d] += t
                w1 = m["call_time_by_width"]["tlm"].get("1")
                if w1:
                    calls[d].append(w1[1] / w1[0])
                host[d].append(m["host_time_s"] / max(m["new_tokens"], 1))
        for d in DECODERS:
            rates[d].append(tokens[d] / secs[d] if secs[d] else 0.0)
    for (r, i), got in outs.items():     # greedy: every output is target-only's of its round, else the section fails
        bad = [d for d in DECODERS if got[d] != got["target"]]
        if bad:
            raise SystemExit(f"fallback_feature: {bad[0]}'s greedy output differs from target-only's (prompt {i}, "
                             f"round {r + 1})")
    ratios = {d: statistics.median(x / y for x, y in zip(rates[d], rates["target"])) for d in DECODERS}
    rec = {"threads": threads, "decoders": {}, "goal": verdict(ratios["feature_k0"], GOAL)}   # unrounded
    for d in DECODERS:
        rec["decoders"][d] = {
            "decode_tokens_per_s": round(max(rates[d]), 2),
            "ratio_to_target": round(ratios[d], 3),
            "width1_call_ms": round(1e3 * statistics.median(calls[d]), 2) if calls[d] else None,
            "host_ms_per_token": round(1e3 * statistics.median(host[d]), 3)}
    log(f"[fallback_feature] {threads} thread(s): " + ", ".join(
        f"{d} {v['decode_tokens_per_s']} tok/s ({v['ratio_to_target']}x)" for d, v in rec["decoders"].items()))
    for b in bk.values():
        b.close()
    return rec


def markdown(rec: dict) -> list[str]:
    L = ["", "### fallback_feature (issue 30 part 5: the K=0 floor of a feature pair, SmolLM2)", "",
         f"{rec['prompts']} demo instructions, {rec['new_tokens']} new tokens, {rec['rounds']} interleaved rounds; "
         f"ratio: the median over rounds of each round's decode rate over target-only's (goal: feature_k0 >= 0.98x).",
         "", "| threads | decoder | decode tok/s | ratio to target | width-1 call ms | host ms/token |",
         "|---|---|---|---|---|---|"]
    for run in rec["runs"]:
        for d, v in run["decoders"].items():
            L.append(f"| {run['threads']} | {d} | {v['decode_tokens_per_s']} | {v['ratio_to_target']:.3f}x | "
                     f"{v['width1_call_ms'] if v['width1_call_ms'] is not None else '-'} | {v['host_ms_per_token']} |")
    L += [""] + [f"Goal feature_k0 >= {GOAL}x at {run['threads']} thread(s): {run['goal']}."
                 for run in rec["runs"] if "goal" in run]     # runs recorded before the verdict have none
    return L
