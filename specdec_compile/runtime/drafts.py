"""Draft sources: where a speculative round's drafts come from.

The interface the decoding loop sees is tiny; a draft source makes one
``drafter`` per sequence (``drafter(gen)``), and the drafter has three methods:

    first(prompt)      -> (d1, dist) or None   the first draft, right after prefill
    draft(seq, q, n)   -> (drafts, dists)      up to n drafts for positions q..
    rollback(valid)                            the sequence is only seq[:valid] now

``dists`` are the distributions (over the target's ids) the drafts were drawn
from; None when greedy. A source may return fewer drafts than asked (an
n-gram source with no match returns none): the round then verifies what it has.

Two sources: the DLM (a draft model with its own retained state, in
decoding.py, where its calls are scheduled per the contract) and
:class:`NgramDraft` (prompt lookup: no model at all).
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecdecError


class NgramDraft:
    """Prompt-lookup drafts: match the longest recent n-gram (n <= ``max_n``) of
    prompt + generated text that ends the sequence, and propose the tokens that
    followed its latest earlier occurrence. Nothing matched: no drafts.

    The draft distribution is one-hot (the proposal is deterministic given the
    text), so the acceptance rule keeps sampling exact and greedy output equals
    target-only decoding.
    """

    kind = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1):
        if int(max_n) != max_n or max_n < 1:
            raise SpecdecError(f"n-gram size must be a positive integer (got {max_n})")
        if int(min_n) != min_n or not 1 <= min_n <= max_n:
            raise SpecdecError(f"minimum n-gram size must be in [1, {max_n}] (got {min_n})")
        self.max_n, self.min_n = int(max_n), int(min_n)

    def drafter(self, vocab: int | None, greedy: bool) -> "NgramIndex":
        return NgramIndex(self.max_n, self.min_n, vocab, greedy)

    def __repr__(self):
        return f"NgramDraft(max_n={self.max_n})"


class NgramIndex:
    """One sequence's n-gram index: n-gram -> where its latest continuation starts.

    Grows incrementally with the sequence (each new position adds max_n
    entries), so a lookup costs O(max_n) whatever the context length.
    """

    def __init__(self, max_n: int, min_n: int, vocab: int | None, greedy: bool):
        self.max_n, self.min_n = max_n, min_n
        self.vocab, self.greedy = vocab, greedy
        self.maps: list[dict] = [dict() for _ in range(max_n + 1)]
        self.indexed = 0          # n-grams ending before this position are in the maps

    def _catch_up(self, seq: list[int]) -> None:
        if len(seq) < self.indexed:      # a shorter sequence than indexed: start over
            self.maps = [dict() for _ in range(self.max_n + 1)]
            self.indexed = 0
        end = len(seq) - 1        # the n-gram ending at the last token is the query, not an entry
        for i in range(self.indexed, end):
            for n in range(1, self.max_n + 1):
                if i - n + 1 < 0:
                    break
                self.maps[n][tuple(seq[i - n + 1:i + 1])] = i + 1
        self.indexed = max(end, self.indexed)

    def propose(self, seq: list[int], n: int) -> list[int]:
        """Up to ``n`` tokens that followed the longest matching n-gram; [] when none matches."""
        if n <= 0 or len(seq) < 2:
            return []
        self._catch_up(seq)
        for size in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            at = self.maps[size].get(tuple(seq[-size:]))
            if at is not None:
                return [int(t) for t in seq[at:at + n]]
        return []

    def _dists(self, drafts):
        if self.greedy or self.vocab is None:
            return [None] * len(drafts)
        out = []
        for d in drafts:
            q = np.zeros(self.vocab, np.float64)
            q[d] = 1.0
            out.append(q)
        return out

    # -- the drafter interface ----------------------------------------------
    def first(self, prompt: list[int]):
        d = self.propose(list(prompt), 1)
        if not d:
            return None
        return d[0], self._dists(d)[0]

    def draft(self, seq: list[int], q: int, n: int):
        d = self.propose(seq[:q], n)
        if self.vocab is not None:
            d = [t for t in d if 0 <= t < self.vocab][:n]
        return d, self._dists(d)

    def rollback(self, valid: int) -> None:
        pass   # the index only holds accepted text


def make_draft_source(draft, ngram_max: int | None = None):
    """``draft``: None (a DLM backend is given), "ngram", "dlm", or an NgramDraft."""
    if draft is None or draft == "dlm":
        return None
    if isinstance(draft, NgramDraft):
        return draft
    if draft == "ngram":
        return NgramDraft(3 if ngram_max is None else ngram_max)
    raise SpecdecError(f"unknown draft source {draft!r} (expected 'dlm' or 'ngram')")
