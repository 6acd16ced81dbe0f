"""Prompt-lookup (n-gram) drafting, replayed offline to measure what it would reach.

This module only measures: given the target's greedy answer to a prompt, how
many drafts would the runtime's prompt-lookup drafter (``NgramIndex``, the one
``--draft ngram`` serves with) get accepted per round? It looks for the most
recent earlier occurrence of the last n tokens of the text so far (prompt +
answer), n from ``max_ngram`` down to ``min_ngram``, and proposes the up-to-k
tokens that followed it. Greedy
acceptance is exact to replay: drafts are accepted while they equal the
target's greedy tokens, which are known.
"""
from __future__ import annotations

from specdec_compile.runtime.drafts.ngram import NgramIndex


def propose(context: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to k tokens following the latest earlier match of the context's last n-gram."""
    return NgramIndex(max_ngram, min_ngram, None).propose(list(context), k)


def replay(prompt: list[int], answer: list[int], k: int, **kw) -> dict:
    """Greedy speculative decoding with prompt lookup, replayed on a known greedy answer.
    Returns rounds (TLM calls), the drafts per round, accepted drafts, tokens."""
    ctx = list(prompt)
    index = NgramIndex(kw.get("max_ngram", 3), kw.get("min_ngram", 1), None)   # grows with ctx
    i = 0
    rounds, drafted, accepted, rejected = 0, 0, 0, 0
    widths: dict[int, int] = {}
    while i < len(answer):
        d = index.propose(ctx, min(k, len(answer) - i - 1)) if len(answer) - i > 1 else []
        a = 0
        while a < len(d) and d[a] == answer[i + a]:
            a += 1
        n = a + 1                                   # accepted drafts + the target's own token
        ctx.extend(answer[i: i + n])
        i += n
        rounds += 1
        drafted += len(d)
        accepted += a
        rejected += a < len(d)
        widths[len(d)] = widths.get(len(d), 0) + 1
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted, "rejected": rejected,
            "tokens": len(answer), "widths": widths}


def measure(pairs: list[tuple[list[int], list[int]]], k: int, **kw) -> dict:
    """Replay over (prompt, answer) pairs: tokens per TLM call, acceptance of proposed drafts,
    per-draft alpha (accepted / (accepted + rejections)), and the calls by drafts per round."""
    tot = {"rounds": 0, "drafted": 0, "accepted": 0, "rejected": 0, "tokens": 0}
    widths: dict[int, int] = {}
    for p, a in pairs:
        r = replay(p, a, k, **kw)
        for key in tot:
            tot[key] += r[key]
        for w, c in r["widths"].items():
            widths[w] = widths.get(w, 0) + c
    return {"k": k, "tokens_per_tlm_call": tot["tokens"] / max(1, tot["rounds"]),
            "acceptance_rate": tot["accepted"] / max(1, tot["drafted"]),
            "alpha": tot["accepted"] / max(1, tot["accepted"] + tot["rejected"]),
            "rounds": tot["rounds"], "tokens": tot["tokens"], "drafted": tot["drafted"],
            "calls_by_drafts": {str(w): c for w, c in sorted(widths.items())}}


def predicted_speedup(stats: dict, step_s: float, verify_s: dict[int, float]) -> float:
    """Tokens per second with prompt lookup over target-only decoding, from measured call costs:
    a round of d drafts costs one TLM call of width d+1 (lookup itself is host time, ~0)."""
    t = sum(c * verify_s[int(w) + 1] for w, c in stats["calls_by_drafts"].items())
    return (stats["tokens"] * step_s) / t if t else 0.0
