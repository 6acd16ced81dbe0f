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

Drafts are tokens, whichever source made them, so greedy output is the
target's and sampling stays exact (sampling.py: position-keyed noise).
"""
from __future__ import annotations

import inspect

from ...errors import SpecdecError


def _value(x):
    """(generator) The value of a drafter call that may be a value or a generator of calls."""
    if inspect.isgenerator(x):
        return (yield from x)
    return x


class HybridDraft:
    """``lookup``: a source without models (:class:`~.ngram.NgramDraft`,
    :class:`~.suffix.SuffixDraft`); ``model``: a draft-model source
    (:class:`~.dlm.DlmDraft`, :class:`~.feature.FeatureDraft`). ``min_drafts``:
    the lookup's drafts are used when it proposes at least min(asked, min_drafts)."""

    kind = "hybrid"

    def __init__(self, lookup, model, min_drafts: int = 1):
        for name, s in (("lookup", lookup), ("model", model)):
            if not all(hasattr(s, a) for a in ("drafter", "bind", "backends")):
                raise SpecdecError(f"hybrid draft: {name} {type(s).__name__} is not a draft source")
        if list(lookup.backends()):
            raise SpecdecError(f"hybrid draft: the lookup source {lookup!r} calls models; give a source "
                               f"without models (ngram, suffix) first")
        if not list(model.backends()):
            raise SpecdecError(f"hybrid draft: the model source {model!r} has no model; give a DLM or "
                               f"feature draft second")
        if int(min_drafts) != min_drafts or min_drafts < 1:
            raise SpecdecError(f"hybrid draft: min_drafts must be a positive integer (got {min_drafts})")
        self.lookup, self.model, self.min_drafts = lookup, model, int(min_drafts)

    @property
    def backend(self):
        return self.model.backend

    def bind(self, tlm) -> None:
        self.lookup.bind(tlm)
        self.model.bind(tlm)

    def backends(self) -> list:
        return list(self.model.backends())

    def drafter(self, ctx) -> "HybridDrafter":
        return HybridDrafter(self.lookup.drafter(ctx), self.model.drafter(ctx), self.min_drafts)

    def __repr__(self):
        return f"HybridDraft({self.lookup!r}, {self.model!r}, min_drafts={self.min_drafts})"


class HybridDrafter:
    """One sequence: both drafters, and how many rounds each drafted (``rounds``)."""

    def __init__(self, lookup, model, min_drafts: int):
        self.lookup, self.model, self.min_drafts = lookup, model, min_drafts
        self.rounds = {"lookup": 0, "model": 0}

    def first(self, prompt):
        """(generator) The model's first draft (a DLM prefills here), else the lookup's."""
        d = yield from _value(self.model.first(prompt))
        if d is None:
            d = yield from _value(self.lookup.first(prompt))
        return d

    def draft(self, seq, q: int, n: int):
        """(generator) The lookup's drafts when it has enough, else the model's."""
        if n <= 0:
            return []
        d = yield from _value(self.lookup.draft(seq, q, n))
        if len(d) >= min(n, self.min_drafts):
            self.rounds["lookup"] += 1
            return d
        self.rounds["model"] += 1
        return (yield from _value(self.model.draft(seq, q, n)))

    def verified(self, step) -> None:
        self.lookup.verified(step)
        self.model.verified(step)

    def rollback(self, valid: int) -> None:
        self.lookup.rollback(valid)
        self.model.rollback(valid)

    def finish(self, seq) -> None:
        self.lookup.finish(seq)
        self.model.finish(seq)
