"""Draft sources: where a speculative round's drafts come from.

The loop (generation.py) sees two small protocols. A **draft source** is made
once per decoder and shared by its generations:

    kind                       a short name ("dlm", "ngram", ...)
    bind(tlm)                  check it fits the target (raise SpecdecError); called once
    backends()                 the models it calls (reset and warmed up with the TLM)
    drafter(ctx)               a Drafter for one generation (ctx: DraftContext)
    check_tokenizer(tok)       (optional) refuse a per-call ``tokenizer=`` that does not fit (DlmDraft)

A **drafter** holds one sequence's drafting state:

    first(prompt)   -> d1 or None         the first draft, right after the TLM's prefill
    draft(seq, q, n) -> [d, ...]          up to n drafts for positions q.. (seq[:q] is the text)
    verified(step)                        what the target returned for tokens it keeps
    rollback(valid)                       the sequence is only seq[:valid] now
    finish(seq)                           the generation ended with text seq (prompt + output)

``first`` and ``draft`` may return a value or be generators that yield
:class:`~..calls.Call`\\ s (a draft model's calls, made through
``ctx.runner(...)``) and return the value. A drafter may return fewer drafts
than asked (an n-gram source with no match returns none): the round then
verifies what it has. ``verified`` gets a :class:`TargetStep` after each TLM
prefill chunk and after each verification (the tokens the target keeps: the
round's input token and its accepted drafts), so a source can read the
target's own outputs for them.

Drafts are tokens, not distributions: with sampling, a drafter draws the token
for position i with ``ctx.choose(logits, i)`` (or ``choose_from``), the same
position-keyed noise the target's token is drawn with (sampling.py), which is
what makes the output exactly the target's.

Sources here: :class:`~.dlm.DlmDraft` (a draft model with its own retained
state), :class:`~.feature.FeatureDraft` (an EAGLE-style head that reads the
target's hidden states from ``TargetStep.outputs``), :class:`~.ngram.NgramDraft`
(prompt lookup: no model), :class:`~.suffix.SuffixDraft` (suffix tries over
the request and earlier requests' outputs, drafts sized by confidence: no
model) and :class:`~.hybrid.HybridDraft` (a model-free source first, a draft
model otherwise, round by round). A new source
is one module in this package with its tests; ``SpecDecoder(tlm, draft=...)``
takes any object with this interface.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import SpecdecError
from ..sampling import Noise, SamplingParams, choose, choose_from


def answer(res):
    """(generator) A drafter's answer: a coroutine of calls (a draft model) or a plain value."""
    if inspect.isgenerator(res):
        return (yield from res)
    return res


@dataclass(frozen=True)
class TargetStep:
    """Tokens the target ran at positions start.. and keeps, with its output rows
    for them (``logits`` [len(tokens), V]; ``outputs``: other named outputs)."""
    start: int
    tokens: list
    logits: np.ndarray
    outputs: dict = field(default_factory=dict)


@dataclass
class DraftContext:
    """What a drafter of one generation may use."""
    sampling: SamplingParams
    noise: Noise | None
    target_vocab: int | None
    runner: Callable          # runner(backend, role, ids_map=None) -> calls.Runner for a draft model's calls

    def choose(self, logits, pos: int) -> int:
        """The draft for position ``pos`` from a draft model's logits over the target's ids."""
        return choose(logits, self.sampling, self.noise, pos)

    def choose_from(self, p: np.ndarray, pos: int) -> int:
        """The draft for position ``pos`` from a distribution over the target's ids."""
        if self.sampling.greedy or self.noise is None:
            return int(np.argmax(p))
        return choose_from(p, self.noise, pos)


NAMES = ("dlm", "ngram", "suffix", "hybrid")


def whole_number(v, what: str) -> int:
    """A source's size argument as an int: an integer (3.0 too) of magnitude below 2**63, not a bool,
    None, NaN, inf or a string."""
    if isinstance(v, (bool, np.bool_)):
        raise SpecdecError(f"{what} must be a whole number (got {v!r})")
    if isinstance(v, (int, np.integer)):        # (np.isfinite refuses ints past 2**64)
        n = int(v)
    elif isinstance(v, (float, np.floating)) and np.isfinite(v) and int(v) == v:
        n = int(v)
    else:
        raise SpecdecError(f"{what} must be a whole number (got {v!r})")
    if abs(n) >= 2 ** 63:              # no size is that large; and printing one may fail (4300 digits)
        raise SpecdecError(f"{what} must be a whole number of magnitude below 2**63 (got one of "
                           f"{n.bit_length()} bits)")
    return n


def real_number(v, what: str) -> float:
    """A source's real argument as a float: a finite number, not a bool, None or a string (an int
    past float's range too: np.isfinite cannot take it)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise SpecdecError(f"{what} must be a finite number (got {v!r})")
    if isinstance(v, (int, np.integer)) and abs(v) >= 2 ** 1023:
        raise SpecdecError(f"{what} must be a float-sized number (got an integer of {int(v).bit_length()} bits)")
    if np.isfinite(v):
        return float(v)
    raise SpecdecError(f"{what} must be a finite number (got {v!r})")


def make_draft_source(draft=None, dlm=None, *, ngram_max: int | None = None, suffix: dict | None = None,
                      tokenizer=None, dlm_tokenizer=None, min_prob: float = 0.0):
    """The one place a draft source is chosen (SpecDecoder and specdec-run both come here).

    ``draft``: a name in NAMES, a source object, or None (= "dlm"); ``dlm``: a draft model's
    backend (a DlmDraft, or a FeatureDraft when its manifest has ``feature_draft``), or a source
    object. "ngram" (``ngram_max`` its longest n-gram, default 3) and "suffix" (``suffix``: the
    SuffixDraft keywords given, None entries left to its defaults) take no model; "hybrid" needs
    ``dlm``: prompt lookup (n-grams of 2 to ``ngram_max`` tokens) when it matches, the model
    otherwise. ``tokenizer`` / ``dlm_tokenizer`` go to a model-backed source, and ``min_prob``
    (:class:`~.dlm.DlmDraft`: where a round's chain of model drafts stops; 0: never early) to the
    one this function makes from ``dlm``."""
    if ngram_max is not None and not (isinstance(draft, str) and draft in ("ngram", "hybrid")):
        raise SpecdecError(f"ngram_max is for draft='ngram' or draft='hybrid' (got draft={draft!r}); it would "
                           f"be ignored")
    if min_prob and not (dlm is not None and hasattr(dlm, "run")):
        raise SpecdecError("draft min_prob is for a draft model (a DLM or feature draft backend, alone or in "
                           "the hybrid); set it on a source object yourself")
    if draft == "hybrid":
        if dlm is None:
            raise SpecdecError("draft='hybrid' needs a DLM backend: prompt lookup first, the DLM otherwise")
        from .hybrid import HybridDraft
        from .ngram import NgramDraft
        model = make_draft_source(None, dlm, tokenizer=tokenizer, dlm_tokenizer=dlm_tokenizer, min_prob=min_prob)
        n = 3 if ngram_max is None else whole_number(ngram_max, "n-gram size")
        return HybridDraft(NgramDraft(n, min_n=min(2, n)), model, weak=NgramDraft(n))
    if dlm is not None and draft is not None and draft != "dlm":
        raise SpecdecError("give either a DLM or another draft source, not both")
    if dlm is None and (draft is None or draft == "dlm"):
        raise SpecdecError("speculative decoding needs a DLM backend or draft='ngram' (or another "
                           "draft source object)")
    if dlm is not None:
        if hasattr(dlm, "run"):    # a backend; a feature draft (its manifest's feature_draft) reads the target's hidden states
            from .dlm import DlmDraft
            from .feature import FeatureDraft
            cls = FeatureDraft if getattr(dlm.artifact, "feature_draft", None) else DlmDraft
            return cls(dlm, tokenizer=tokenizer, dlm_tokenizer=dlm_tokenizer, min_prob=min_prob)
        return _source_object(dlm)
    if isinstance(draft, str):
        return _named(draft, ngram_max, suffix)
    return _source_object(draft)


def _named(name: str, ngram_max, suffix):
    """A model-free source by name."""
    if name == "ngram":
        from .ngram import NgramDraft
        return NgramDraft(3 if ngram_max is None else ngram_max)
    if name == "suffix":
        from .suffix import SuffixDraft
        return SuffixDraft(**{k: v for k, v in (suffix or {}).items() if v is not None})
    raise SpecdecError(f"unknown draft source {name!r} (expected one of {', '.join(map(repr, NAMES))})")


def _source_object(draft):
    if isinstance(draft, type):
        raise SpecdecError(f"draft={draft.__name__} is a class: give a source object ({draft.__name__}(...))")
    if not all(hasattr(draft, a) for a in ("drafter", "bind", "backends")):
        raise SpecdecError(f"{type(draft).__name__} is not a draft source (needs drafter, bind and backends)")
    return draft
