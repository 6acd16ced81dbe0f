"""Held-out evaluation of the demo's feature draft: the chain agreement (teacher-forced, the
matched passes of ``feature_train.unrolled``) and the exact greedy loop replayed with a KV cache.

Draft j's agreement at answer position q, given drafts 1..j-1 of the same round were right, is
the acceptance of draft j in the loop: ``unrolled`` gives draft j exactly the context the loop
gives it, so chain agreement and replay agree (the replay also counts rounds cut by the answer's
end).
"""
from __future__ import annotations

from .feature_train import FeatureSet, unrolled


def chain_agreement(head, ds: FeatureSet, k_max: int) -> dict:
    """Draft j at answer position q reads pass j-1's predicted feature of q-1 (teacher-forced
    on the head's own features): its agreement with the target's greedy token, unconditional
    and given drafts 1..j-1 of the same chain were right (the acceptance of draft j)."""
    import torch
    hits = [0] * k_max
    tot = [0] * k_max
    cond_hit = [0] * k_max
    cond_tot = [0] * k_max
    with torch.inference_mode():
        for which in ds.batches(8, None):
            b = ds.collate(which)
            outs = unrolled(head, b, k_max)
            # match[j][r, q]: draft j+1's argmax at position q equals the target's token at q+1
            B, T = b["x"].shape
            m = torch.zeros(k_max, B, T, dtype=torch.bool)
            ok = torch.zeros(B, T, dtype=torch.bool)
            ok[b["rows"], b["cols"]] = True
            nxt = torch.zeros(B, T, dtype=torch.long)
            nxt[b["rows"], b["cols"]] = b["labels"]
            ids = torch.nonzero(ds.inv >= 0).squeeze(1)
            for j, pre in enumerate(outs):
                arg = ids[head.sub_logits(pre).argmax(-1)]
                m[j] = (arg == nxt) & ok
            for j in range(k_max):
                # draft j+1 of the chain starting at s = q - j: positions s..q all answer rows
                if j:
                    okc = ok[:, j:] & ok[:, :-j]
                    prev = torch.ones_like(okc)
                    for i in range(j):
                        prev &= m[i][:, i: T - j + i]
                else:
                    okc, prev = ok, torch.ones_like(ok)
                cur = m[j][:, j:] if j else m[0]
                hits[j] += int((cur & okc).sum())
                tot[j] += int(okc.sum())
                cond_hit[j] += int((cur & okc & prev).sum())
                cond_tot[j] += int((okc & prev).sum())
    return {"agreement": [round(hits[j] / max(1, tot[j]), 4) for j in range(k_max)],
            "acceptance_given_previous": [round(cond_hit[j] / max(1, cond_tot[j]), 4) for j in range(k_max)]}


def replay(head, ds: FeatureSet, k: int) -> dict:
    """The greedy feature-draft loop (docs/CONTRACT.md section 6) replayed exactly with a KV
    cache against the target's own greedy answers: tokens per TLM call and accepted drafts."""
    import torch
    from transformers.cache_utils import DynamicCache
    ids = torch.nonzero(ds.inv >= 0).squeeze(1)
    produced = calls = drafted = accepted = 0
    at = [0] * k                  # drafts at index j proposed with drafts 0..j-1 accepted ...
    hit = [0] * k                 # ... and accepted themselves
    with torch.inference_mode():
        for it in ds.items:
            seq, n, g = it["seq"], it["n"], it["g"]
            F = it["feat"].float()[None]
            x = torch.tensor(seq)[None]
            L = n + g
            past = DynamicCache()
            # prefill: rows 0..n with (x_p, f_{p-1}); the target's prefill gave x_n
            pos = torch.arange(n + 1)[None]
            pre = head.pre_norm(x[:, : n + 1], torch.cat([torch.zeros_like(F[:, :1]), F[:, :n]], 1), pos, past)
            m = n
            while m < L - 1:
                last = pre[:, -1:]
                drafts = []
                for i in range(min(k, L - 1 - m)):
                    d = int(ids[head.sub_logits(last)[0, -1].argmax()])
                    drafts.append(d)
                    if i + 1 < min(k, L - 1 - m):
                        last = head.pre_norm(torch.tensor([[d]]), last, torch.tensor([[m + 1 + i]]), past)
                a = 0
                while a < len(drafts) and drafts[a] == seq[m + 1 + a]:
                    a += 1
                for j in range(min(a + 1, len(drafts))):
                    at[j] += 1
                    hit[j] += j < a
                step = min(a + 1, L - 1 - m)
                produced += step
                calls += 1
                drafted += len(drafts)
                accepted += a
                past.crop(m + 1)
                pre = head.pre_norm(x[:, m + 1: m + 1 + step], F[:, m: m + step],
                                    torch.arange(m + 1, m + 1 + step)[None], past)
                m += step
    return {"k": k, "tokens_per_tlm_call": round(produced / max(1, calls), 3),
            "alpha": round(accepted / max(1, drafted), 4), "calls": calls, "tokens": produced,
            "acceptance_given_previous": [round(hit[j] / at[j], 4) if at[j] else None for j in range(k)]}


def evaluate(head, ds: FeatureSet, cfg: dict) -> dict:
    ec = cfg["eval"]
    res = chain_agreement(head, ds, ec["k_max"])
    res["replay"] = {str(k): replay(head, ds, k) for k in ec["replay_k"]}
    res["eval_answers"] = len(ds.items)
    res["eval_tokens"] = sum(it["g"] for it in ds.items)
    return res
