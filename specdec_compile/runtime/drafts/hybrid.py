"""Lookup first, a draft model otherwise: one source from two.

Prompt lookup costs nothing and is right where the answer repeats text (code
that reuses names, lists that repeat a pattern); a draft model (a distilled
DLM, or a feature draft reading the target's hidden states) costs a call per
draft and is right more often on new text. :class:`HybridDraft` asks the
lookup source first each round and keeps its drafts when it proposes at least
``min_drafts`` of the ones asked for; otherwise the model drafts. Both see
every verification (``verified``), rollback and finish, so the model's cache
catches up on the rounds the lookup drafted (as after rounds without drafts:
contract section 6), and a feature draft still reads the target's features of
every kept token.

The model is asked only while it pays: the drafter keeps a decayed estimate
of the model's own acceptance (from the verifications that follow its rounds)
and, below ``min_alpha``, asks the ``weak`` lookup instead (a looser one: the
runtime's hybrid uses single-token n-gram matches there, which the first
lookup leaves to the model), or drafts nothing, asking the model again every
``PROBE_EVERY``-th such round. On text the lookup covers and the model does
not (a chat that repeats its own names), the hybrid then does what prompt
lookup alone does. The width policy sees one source (its pooled
acceptance), and prices a draft at the model's call cost times the share of
recent drafting rounds the model drafted (``model_share``).

Drafts are tokens, whichever source made them, so greedy output is the
target's and sampling stays exact (sampling.py: position-keyed noise).
"""
from __future__ import annotations

from ...errors import SpecdecError
from . import answer, real_number, whole_number


class HybridDraft:
    """``lookup``: a source without models (:class:`~.ngram.NgramDraft`,
    :class:`~.suffix.SuffixDraft`); ``model``: a draft-model source
    (:class:`~.dlm.DlmDraft`, :class:`~.feature.FeatureDraft`). ``min_drafts``:
    the lookup's drafts are used when it proposes at least min(asked, min_drafts).
    ``min_alpha``: below this acceptance the model is only probed; ``weak``: a
    model-free source asked in its place then (None: no drafts)."""

    kind = "hybrid"

    def __init__(self, lookup, model, min_drafts: int = 1, min_alpha: float = 0.15, weak=None):
        for name, s in (("lookup", lookup), ("model", model)) + ((("weak lookup", weak),) if weak is not None else ()):
            if isinstance(s, type):      # its methods would be called unbound: a TypeError later
                raise SpecdecError(f"hybrid draft: {name} {s.__name__} is a class: give a source object "
                                   f"({s.__name__}(...))")
            if not all(hasattr(s, a) for a in ("drafter", "bind", "backends")):
                raise SpecdecError(f"hybrid draft: {name} {type(s).__name__} is not a draft source")
        for src in (lookup, weak):
            if src is not None and list(src.backends()):
                raise SpecdecError(f"hybrid draft: the lookup source {src!r} calls models; give a source "
                                   f"without models (ngram, suffix) first")
        if not list(model.backends()):
            raise SpecdecError(f"hybrid draft: the model source {model!r} has no model; give a DLM or "
                               f"feature draft second")
        min_drafts = whole_number(min_drafts, "hybrid draft: min_drafts")
        min_alpha = real_number(min_alpha, "hybrid draft: min_alpha")
        if min_drafts < 1:
            raise SpecdecError(f"hybrid draft: min_drafts must be a positive integer (got {min_drafts})")
        if not 0.0 <= min_alpha < 1.0:
            raise SpecdecError(f"hybrid draft: min_alpha must be in [0, 1) (got {min_alpha})")
        self.lookup, self.model, self.min_drafts = lookup, model, int(min_drafts)
        self.min_alpha, self.weak = float(min_alpha), weak

    @property
    def backend(self):
        return self.model.backend

    def bind(self, tlm) -> None:
        for src in (self.lookup, self.model, self.weak):
            if src is not None:
                src.bind(tlm)

    def backends(self) -> list:
        return list(self.model.backends())

    def check_tokenizer(self, tok) -> None:
        """A per-call tokenizer: the model source's check (``DlmDraft.check_tokenizer``), where it has one."""
        check = getattr(self.model, "check_tokenizer", None)
        if callable(check):
            check(tok)

    def drafter(self, ctx) -> "HybridDrafter":
        return HybridDrafter(self.lookup.drafter(ctx), self.model.drafter(ctx), self.min_drafts, self.min_alpha,
                             self.weak.drafter(ctx) if self.weak is not None else None)

    def __repr__(self):
        return (f"HybridDraft({self.lookup!r}, {self.model!r}, min_drafts={self.min_drafts}, "
                f"min_alpha={self.min_alpha}, weak={self.weak!r})")


class HybridDrafter:
    """One sequence: both drafters, how many rounds each drafted and how many went without
    (``rounds``), and the model's decayed acceptance (accepted / checked drafts)."""

    DECAY, PROBE_EVERY = 0.8, 8

    def __init__(self, lookup, model, min_drafts: int, min_alpha: float, weak=None):
        self.lookup, self.model, self.min_drafts, self.min_alpha = lookup, model, min_drafts, min_alpha
        self.weak = weak
        self.rounds = {"lookup": 0, "model": 0, "weak": 0, "none": 0}
        self.acc, self.chk = 0.0, 0.0
        self.pending = None        # (q, n drafts) of the model's last round, until its verification
        self.skipped = 0
        self.m_rounds, self.d_rounds = 0.0, 0.0

    def model_alpha(self) -> float:
        return (self.acc + 0.5) / (self.chk + 1.0)

    def model_share(self) -> float:
        """The decayed share of drafting rounds the model drafted (1 before any): what the
        width policy scales the draft model's call cost by (lookup drafts cost no call)."""
        return (self.m_rounds + 0.5) / (self.d_rounds + 0.5)

    def _drafted(self, by_model: bool) -> None:
        lam = self.DECAY
        self.m_rounds = lam * self.m_rounds + (1.0 if by_model else 0.0)
        self.d_rounds = lam * self.d_rounds + 1.0

    def first(self, prompt):
        """(generator) The model's first draft (a DLM prefills here), else the lookup's."""
        d = yield from answer(self.model.first(prompt))
        if d is None:
            d = yield from answer(self.lookup.first(prompt))
        return d

    def draft(self, seq, q: int, n: int):
        """(generator) The lookup's drafts when it has enough, else the model's while it pays,
        else the weak lookup's (or none)."""
        if n <= 0:
            return []
        d = yield from answer(self.lookup.draft(seq, q, n))
        if len(d) >= min(n, self.min_drafts):
            self.rounds["lookup"] += 1
            self._drafted(False)
            return d
        if self.model_alpha() < self.min_alpha:
            self.skipped += 1
            if self.skipped % self.PROBE_EVERY:
                d = (yield from answer(self.weak.draft(seq, q, n))) if self.weak is not None else []
                self.rounds["weak" if d else "none"] += 1
                self._drafted(False)
                return d
        self.rounds["model"] += 1
        self._drafted(True)
        d = yield from answer(self.model.draft(seq, q, n))
        self.pending = (q, len(d)) if d else None
        return d

    def verified(self, step) -> None:
        if self.pending is not None and step.start == self.pending[0] - 1:
            # the verification of the model's round: [x_{q-1}, accepted drafts] kept
            drafted = self.pending[1]
            accepted = max(0, min(len(step.tokens) - 1, drafted))
            self.acc = self.DECAY * self.acc + accepted
            self.chk = self.DECAY * self.chk + accepted + (1 if accepted < drafted else 0)
        self.pending = None
        for d in self._all():
            d.verified(step)

    def rollback(self, valid: int) -> None:
        for d in self._all():
            d.rollback(valid)

    def finish(self, seq) -> None:
        for d in self._all():
            d.finish(seq)

    def _all(self) -> list:
        return [self.lookup, self.model] + ([self.weak] if self.weak is not None else [])
