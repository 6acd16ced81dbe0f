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
from ..calls import check_backend
from ..sampling import probs
from ..vocab import PairVocab


class DlmDraft:
    """A DLM backend as a draft source. ``tokenizer`` / ``dlm_tokenizer``: the
    pair must agree on them (else on the manifests' special token ids).
    ``min_prob``: a round's drafts stop where the draft model's probability of
    its chain (the product of each draft's probability: its softmax when greedy,
    its sampling distribution otherwise; EAGLE-2's score) falls below it, the
    draft that brought it below included; 0 (default): every draft asked for."""

    kind = "dlm"

    def __init__(self, backend: Backend, *, tokenizer=None, dlm_tokenizer=None, min_prob: float = 0.0):
        self.min_prob = check_min_prob(min_prob)
        check_backend(backend, "draft model")
        self.backend = backend
        self.tokenizers = (tokenizer, dlm_tokenizer)
        self.vocab: PairVocab | None = None
        self.target: Backend | None = None     # the TLM backend it is bound to (one: its vocab map is that pair's)
        self.checked: list = []                 # per-call tokenizers that passed check_tokenizer

    def bind(self, tlm: Backend) -> None:
        self.check_target(tlm)
        if self.backend.artifact.feature_draft is not None:
            raise SpecdecError(f"{self.backend.artifact.path}: a feature draft reads the target's hidden states; "
                               f"run it as FeatureDraft (SpecDecoder picks it from the manifest)")
        self._bind_pair(tlm)

    def _bind_pair(self, tlm: Backend) -> None:
        """The pair's shapes and tokenizers (artifact.check_pair), and how they share the vocabulary."""
        check_pair(tlm.artifact, self.backend.artifact, tokenizers=self.tokenizers)
        toks = [len(t) for t in self.tokenizers if t is not None and hasattr(t, "__len__")]
        self.vocab = pair_vocab(tlm, self.backend, min(toks) if toks else None)
        self.target = tlm

    def check_target(self, tlm: Backend) -> None:
        """One source, one target: the vocabulary map (and a feature draft's reading of the target's
        outputs) is the pair's, so binding a source already bound to another TLM backend (a second
        decoder) would change the first decoder's drafts; refused in one line. The same TLM again
        (another decoder over it) is fine."""
        if self.target is not None and self.target is not tlm:
            raise SpecdecError(f"{self!r} is already bound to another target ({self.target.artifact.path}): a draft "
                               f"source keeps its target's vocabulary map; give the decoder for "
                               f"{tlm.artifact.path} a {type(self).__name__} of its own")

    def check_tokenizer(self, tok) -> None:
        """A tokenizer given to one call (``generate(..., tokenizer=)``) in place of the decoder's:
        the check the constructor's ``tokenizer`` got (``check_pair`` with the draft model's
        ``dlm_tokenizer``; without one, the manifests' special ids), before it encodes anything."""
        if self.target is None or any(t is tok for t in self.checked):
            return
        check_pair(self.target.artifact, self.backend.artifact, tokenizers=(tok, self.tokenizers[1]))
        self.checked = [*self.checked[-3:], tok]

    def backends(self) -> list[Backend]:
        return [self.backend]

    def drafter(self, ctx) -> "DlmDrafter":
        return DlmDrafter(self, ctx)

    def __repr__(self):
        return f"DlmDraft({self.backend.artifact.path})"


def check_min_prob(p) -> float:
    """A draft chain's probability floor (``min_prob``): a number in [0, 1) (a NumPy number too, as
    SamplingParams takes them; not a bool or a string)."""
    number = isinstance(p, (int, float, np.integer, np.floating)) and not isinstance(p, (bool, np.bool_))
    if not number or not 0.0 <= p < 1.0:
        raise SpecdecError(f"draft min_prob must be a number in [0, 1) (got {p!r})")
    return float(p)


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
        self.min_prob = source.min_prob

    def pick(self, logits, pos: int) -> int:
        """The draft for position ``pos`` (an id the target has too)."""
        ctx, v = self.ctx, self.vocab
        if v is None:
            return ctx.choose(logits, pos)
        lg = v.draft_logits(logits)
        if ctx.sampling.greedy or ctx.noise is None:
            return int(np.argmax(lg))
        return ctx.choose_from(v.draft_dist(probs(lg, ctx.sampling)), pos)

    def prob(self, logits, tok: int) -> float:
        """The draft model's probability of ``tok`` (a :meth:`pick`): its softmax when greedy, its
        sampling distribution otherwise."""
        ctx, v = self.ctx, self.vocab
        lg = np.asarray(logits if v is None else v.draft_logits(logits), dtype=np.float64)
        if ctx.sampling.greedy or ctx.noise is None:
            with np.errstate(invalid="ignore", over="ignore"):
                return float(np.exp(lg[tok] - lg.max()) / np.nansum(np.exp(lg - lg.max())))
        return float(probs(lg, ctx.sampling)[tok])

    def chain(self, first_logits, q: int, n: int, step):
        """(generator) Up to ``n`` drafts for positions q..: each from the last one's logits,
        ``step(draft, pos)`` (a generator) the call that gives the next logits; cut by
        ``min_prob`` (the source's doc)."""
        drafts, logits, score = [], first_logits, 1.0
        for i in range(n):
            tok = self.pick(logits, q + i)
            if self.min_prob:
                score *= self.prob(logits, tok)
                if score < self.min_prob:
                    break
            drafts.append(tok)
            if i < n - 1:
                logits = yield from step(tok, q + i)
        return drafts

    def first(self, prompt):
        """(generator) Prefill; the first draft."""
        q0 = yield from self.r.prefill(prompt)
        self.valid = len(prompt)
        return self.pick(q0, len(prompt))

    def draft(self, seq, q: int, n: int):
        """(generator) Up to ``n`` drafts for positions q.. (the DLM first catches up to seq[:q])."""
        if n <= 0:
            return []
        pending, p0 = seq[self.valid:q], self.valid
        PL = self.r.b.prefill_len
        two = 2 in self.r.b.seq_lens     # an --interface qeff DLM decodes one token a call (section 7)
        while len(pending) > (2 if two else 1):          # only after rounds without drafts, or a full accept
            step = (PL if len(pending) > PL else 2) if two else 1
            yield from self.r.call(pending[:step], p0, step)
            pending, p0 = pending[step:], p0 + step
        logits = (yield from self.r.call(pending, p0, len(pending)))[0]
        self.valid = q

        def step(tok, pos):
            out = (yield from self.r.call([tok], pos, 1))[0]
            self.valid = pos + 1
            return out
        return (yield from self.chain(logits, q, n, step))

    def verified(self, step) -> None:
        pass   # a DLM reads only the tokens

    def rollback(self, valid: int) -> None:
        self.valid = min(self.valid, valid)

    def finish(self, seq) -> None:
        pass   # nothing outlives the generation
