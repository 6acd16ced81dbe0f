"""Drafts from a draft model (DLM) with its own retained-state cache.

Its calls follow contract section 6: prefill in PL chunks; each round first
catches the DLM up to the text (seq_len 1 with the last token, or 2 with the
last draft and the last token after a full accept; PL or 2-wide calls only
after rounds without drafts), then one seq_len-1 call per further draft. An
--interface qeff DLM (QEfficient's: prefill and seq_len 1 only) catches up in
seq_len-1 calls, as QEfficient's own speculative loop does.

A DLM and a TLM may have tables of different sizes over one tokenizer
(vocab.py): the DLM proposes only ids both have and reads an id it has no row
for as a fill id.
"""
from __future__ import annotations

import numpy as np

from ...errors import SpecdecError
from ..pairing import check_pair
from ..backends import Backend
from ..sampling import probs
from ..vocab import PairVocab


class DlmDraft:
    """A DLM backend as a draft source. ``tokenizer`` / ``dlm_tokenizer``: the
    pair must agree on them (else on the manifests' special token ids)."""

    kind = "dlm"

    def __init__(self, backend: Backend, *, tokenizer=None, dlm_tokenizer=None):
        self.backend = backend
        self.tokenizers = (tokenizer, dlm_tokenizer)
        self.vocab: PairVocab | None = None

    def bind(self, tlm: Backend) -> None:
        if self.backend.artifact.feature_draft is not None:
            raise SpecdecError(f"{self.backend.artifact.path}: a feature draft reads the target's hidden states; "
                               f"run it as FeatureDraft (SpecDecoder picks it from the manifest)")
        self._bind_pair(tlm)

    def _bind_pair(self, tlm: Backend) -> None:
        """The pair's shapes and tokenizers (artifact.check_pair), and how they share the vocabulary."""
        check_pair(tlm.artifact, self.backend.artifact, tokenizers=self.tokenizers)
        toks = [len(t) for t in self.tokenizers if t is not None]
        self.vocab = pair_vocab(tlm, self.backend, min(toks) if toks else None)

    def backends(self) -> list[Backend]:
        return [self.backend]

    def drafter(self, ctx) -> "DlmDrafter":
        return DlmDrafter(self, ctx)

    def __repr__(self):
        return f"DlmDraft({self.backend.artifact.path})"


def pair_vocab(tlm: Backend, dlm: Backend, tokenizer_len: int | None = None) -> PairVocab | None:
    """How the pair shares its vocabulary; None when nothing needs mapping (or the
    sizes are not known)."""
    vt, vd = tlm.vocab_size, dlm.vocab_size
    if not vt or not vd:
        return None
    reads = dlm.input_vocab if vd < vt else vd   # a smaller draft may still read more ids than it emits
    v = PairVocab.of(vt, vd, tokenizer_len=tokenizer_len, draft_reads=reads)
    return None if v.same else v


class DlmDrafter:
    """One sequence in the DLM: its runner and how far its cache holds the text."""

    def __init__(self, source: DlmDraft, ctx):
        self.ctx = ctx
        self.vocab = source.vocab
        self.r = ctx.runner(source.backend, "dlm", self.vocab.draft_ids if self.vocab else None)
        self.valid = 0

    def pick(self, logits, pos: int) -> int:
        """The draft for position ``pos`` (an id the target has too)."""
        ctx, v = self.ctx, self.vocab
        if v is None:
            return ctx.choose(logits, pos)
        lg = v.draft_logits(logits)
        if ctx.sampling.greedy or ctx.noise is None:
            return int(np.argmax(lg))
        return ctx.choose_from(v.draft_dist(probs(lg, ctx.sampling)), pos)

    def first(self, prompt):
        """(generator) Prefill; the first draft."""
        q0 = yield from self.r.prefill(prompt)
        self.valid = len(prompt)
        return self.pick(q0, len(prompt))

    def draft(self, seq, q: int, n: int):
        """(generator) ``n`` drafts for positions q.. (the DLM first catches up to seq[:q])."""
        drafts: list[int] = []
        if n <= 0:
            return drafts
        pending, p0 = seq[self.valid:q], self.valid
        PL = self.r.b.prefill_len
        two = 2 in self.r.b.seq_lens     # an --interface qeff DLM decodes one token a call (section 7)
        while len(pending) > (2 if two else 1):          # only after rounds without drafts, or a full accept
            step = (PL if len(pending) > PL else 2) if two else 1
            yield from self.r.call(pending[:step], p0, step)
            pending, p0 = pending[step:], p0 + step
        logits = (yield from self.r.call(pending, p0, len(pending)))[0]
        self.valid = q
        for i in range(n):
            drafts.append(self.pick(logits, q + i))
            if i < n - 1:
                logits = (yield from self.r.call([drafts[-1]], q + i, 1))[0]
                self.valid = q + i + 1
        return drafts

    def verified(self, step) -> None:
        pass   # a DLM reads only the tokens

    def rollback(self, valid: int) -> None:
        self.valid = min(self.valid, valid)

    def finish(self, seq) -> None:
        pass   # nothing outlives the generation
