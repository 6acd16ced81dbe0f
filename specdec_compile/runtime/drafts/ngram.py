"""Prompt-lookup drafts: the tokens that followed the longest recent n-gram."""
from __future__ import annotations

from ...errors import SpecdecError
from . import whole_number


class NgramDraft:
    """Prompt-lookup drafts: match the longest recent n-gram (n <= ``max_n``) of
    prompt + generated text that ends the sequence, and propose the tokens that
    followed its latest earlier occurrence. Nothing matched: no drafts.

    A proposal is accepted when it equals the target's own token, so greedy
    output equals target-only decoding and sampling stays exact (sampling.py).
    ``max_n`` is at most :data:`MAX_N` (the index keeps max_n entries for every
    position; longer n-grams add nothing that a shorter one misses in practice)
    and at most the TLM's context length.
    """

    kind = "ngram"
    MAX_N = 32

    def __init__(self, max_n: int = 3, min_n: int = 1):
        max_n, min_n = whole_number(max_n, "n-gram size"), whole_number(min_n, "minimum n-gram size")
        if max_n < 1:
            raise SpecdecError(f"n-gram size must be a positive integer (got {max_n})")
        if max_n > self.MAX_N:
            raise SpecdecError(f"n-gram size must be at most {self.MAX_N} (got {max_n})")
        if not 1 <= min_n <= max_n:
            raise SpecdecError(f"minimum n-gram size must be in [1, {max_n}] (got {min_n})")
        self.max_n, self.min_n = max_n, min_n

    def bind(self, tlm) -> None:
        CL = getattr(tlm, "ctx_len", None)
        if CL and self.max_n > CL:
            raise SpecdecError(f"n-gram size {self.max_n} is longer than the TLM's context ({CL} tokens)")

    def backends(self) -> list:
        return []

    def drafter(self, ctx) -> "NgramIndex":
        return NgramIndex(self.max_n, self.min_n, ctx.target_vocab)

    def __repr__(self):
        return f"NgramDraft(max_n={self.max_n})"


class NgramIndex:
    """One sequence's n-gram index: n-gram -> where its latest continuation starts.

    Grows incrementally with the sequence (each new position adds max_n
    entries), so a lookup costs O(max_n) whatever the context length.
    """

    def __init__(self, max_n: int, min_n: int, vocab: int | None):
        self.max_n, self.min_n = max_n, min_n
        self.vocab = vocab
        self.maps: dict[int, dict] = {}     # n -> {n-gram: where its continuation starts}, made as needed
        self.indexed = 0          # n-grams ending before this position are in the maps

    def _catch_up(self, seq: list[int]) -> None:
        if len(seq) < self.indexed:      # a shorter sequence than indexed: start over
            self.maps = {}
            self.indexed = 0
        end = len(seq) - 1        # the n-gram ending at the last token is the query, not an entry
        for i in range(self.indexed, end):
            for n in range(1, self.max_n + 1):
                if i - n + 1 < 0:
                    break
                self.maps.setdefault(n, {})[tuple(seq[i - n + 1:i + 1])] = i + 1
        self.indexed = max(end, self.indexed)

    def propose(self, seq: list[int], n: int) -> list[int]:
        """Up to ``n`` tokens that followed the longest matching n-gram; [] when none matches."""
        if n <= 0 or len(seq) < 2:
            return []
        self._catch_up(seq)
        for size in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            at = self.maps.get(size, {}).get(tuple(seq[-size:]))
            if at is not None:
                return [int(t) for t in seq[at:at + n]]
        return []

    # -- the drafter interface ----------------------------------------------
    def first(self, prompt: list[int]):
        d = self.propose(list(prompt), 1)
        return d[0] if d else None

    def draft(self, seq: list[int], q: int, n: int) -> list[int]:
        d = self.propose(seq[:q], n)[:n]
        if self.vocab is not None:      # drafts are positions: cut at an id the target lacks, never close the gap
            d = d[:next((i for i, t in enumerate(d) if not 0 <= t < self.vocab), len(d))]
        return d

    def verified(self, step) -> None:
        pass   # the index reads the text itself

    def rollback(self, valid: int) -> None:
        pass   # the index only holds accepted text

    def finish(self, seq) -> None:
        pass   # nothing outlives the generation
