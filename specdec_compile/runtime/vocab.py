"""One tokenizer, two table sizes: the vocabulary a draft and a target share.

A draft and a target that share a tokenizer need not share a table size:
models pad their embedding and LM-head tables differently (Qwen2.5-0.5B has
151936 rows, the larger Qwen2.5 models 152064, the tokenizer 151665 ids), and
a draft may keep only the first rows of the table as a cheaper LM head. The
loop works on the common prefix of the vocabulary:

* the draft proposes only ids below its own logits width, the target's, and
  the tokenizer's length: its distribution q is computed over those ids and is
  0 on every other id (``draft_logits`` then ``draft_dist``);
* the target's distribution p stays its own, over all of its rows, so greedy
  output equals target-only decoding and the rejection rule (which only needs
  q to be the distribution the draft really sampled from) stays exact; the
  target may emit an id the draft never proposes, and the residual
  max(0, p - q) carries exactly that mass;
* the draft reads every token of the text, also those the target emitted: an
  id beyond the draft's embedding table (``draft_reads``) is read as
  ``fill_id`` instead. That only makes the draft's guesses worse, never the
  output different.

Every function takes arrays with any leading dimensions ([V], [S, V], [B, S, V]),
so the same object serves each row of a batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: the id a draft reads in place of a token beyond its embedding table
FILL_ID = 0


@dataclass(frozen=True)
class PairVocab:
    """How the ids of one tokenizer map onto a draft's and a target's tables."""

    target_size: int        # rows of the target's logits: the support of p
    draft_size: int         # rows of the draft's logits
    propose: int            # the draft proposes ids < propose only
    draft_reads: int        # the draft reads ids < draft_reads (its embedding rows)
    fill_id: int = FILL_ID  # what it reads in place of any other id

    @classmethod
    def of(cls, target_size: int, draft_size: int, *, tokenizer_len: int | None = None,
           draft_reads: int | None = None, fill_id: int = FILL_ID) -> "PairVocab":
        propose = min(target_size, draft_size, tokenizer_len or target_size)
        reads = draft_size if draft_reads is None else draft_reads
        if not 0 <= fill_id < reads:
            fill_id = 0
        return cls(target_size=target_size, draft_size=draft_size, propose=propose, draft_reads=reads,
                   fill_id=fill_id)

    @property
    def same(self) -> bool:
        """True when nothing needs mapping (the common case: one table size)."""
        return (self.propose == self.target_size == self.draft_size
                and self.draft_reads >= self.target_size)

    def draft_logits(self, logits: np.ndarray) -> np.ndarray:
        """The draft's logits over the ids it may propose (last axis cut to ``propose``)."""
        return logits[..., : self.propose]

    def draft_dist(self, q: np.ndarray | None) -> np.ndarray | None:
        """A draft distribution over ``propose`` ids as one over the target's ids (0 beyond)."""
        if q is None or q.shape[-1] == self.target_size:
            return q
        out = np.zeros(q.shape[:-1] + (self.target_size,), dtype=q.dtype)
        out[..., : q.shape[-1]] = q
        return out

    def draft_ids(self, ids: np.ndarray) -> np.ndarray:
        """Token ids as the draft reads them: ids beyond its table become ``fill_id``."""
        ids = np.asarray(ids)
        if ids.size == 0 or int(ids.max()) < self.draft_reads:
            return ids
        return np.where(ids < self.draft_reads, ids, self.fill_id)

    def describe(self) -> str:
        return (f"target {self.target_size} rows, draft {self.draft_size} rows (reads {self.draft_reads}), "
                f"drafts ids < {self.propose}")
