"""How a batched call is shaped: which width it runs at when some rows prefill.

A call of width W carries every row waiting on that model. Rows that decode
(verify or draft) need W >= their own width; rows that prefill take as many
prompt tokens as the call holds (up to their chunk). Every row of the call pays
for W, so a wide prefill chunk taxes the decoding rows, and a narrow one keeps
the prefilling row (which produces nothing yet) busy for more calls. The width
minimizes row-time lost per prompt token ingested:

    loss(W) = D * (c(W) - c(w_dec)) + P * c(W)       gain(W) = sum_p min(W, m_p)

D decoding rows (each would have run at w_dec anyway, so only the difference is
lost), P prefilling rows with m_p tokens left in their chunk, c the measured
mean call time of each width at this batch size. With no decoding row that is
the cheapest width per prompt token; with many it is usually the decoding
width itself (the prompt rides in slots that would be padding).
"""
from __future__ import annotations

from .costs import CallCosts


def choose_width(widths, decode_widths, prefill_left, costs: CallCosts | None) -> int:
    """The width of a call: ``widths`` compiled, ``decode_widths`` the widths the
    decoding rows need, ``prefill_left`` the tokens each prefilling row has left in
    its chunk (at most the prefill length). Without prefilling rows: the widest
    decoding row. Without measured costs: the smallest width that holds every
    row's tokens (prefill chunks whole)."""
    need = max(decode_widths, default=0)
    if not prefill_left:
        return need
    cands = [w for w in sorted(widths) if w >= max(need, 1)]
    whole = next((w for w in cands if w >= max(prefill_left)), cands[-1])
    if costs is None or costs.estimate(whole) is None:
        return whole
    D, P = len(decode_widths), len(prefill_left)
    base = costs.estimate(need) if need else 0.0
    best, best_score = whole, None
    for w in cands:
        c = costs.estimate(w)
        gain = sum(min(w, m) for m in prefill_left)
        score = (D * max(c - base, 0.0) + P * c) / gain
        if best_score is None or score < best_score - 1e-12:
            best, best_score = w, score
        if w >= max(prefill_left):
            break          # wider holds no more prompt tokens
    return best
