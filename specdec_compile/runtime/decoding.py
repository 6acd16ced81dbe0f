"""The decoding loops: speculative (DLM drafts, TLM verifies) and target-only.

Speculative decoding follows contract section 6. ``generate`` runs one prompt
in row 0 (other rows padding); ``generate_many`` / ``stream`` run one prompt per
row with continuous batching (batch.py). The loop itself is in generation.py.
Drafts come from a draft source (drafts/: a DLM, a feature draft reading the
TLM's hidden states (drafts/feature.py, chosen from the DLM's manifest), n-gram
lookup, or any object with that interface); with n-gram drafts there is no DLM call and a round with
no match verifies nothing (width 1 when compiled). How many drafts a round
makes is the width policy's choice (policy.py).

prefill    DLM and TLM each run the prompt in PL-sized chunks, the last one
           right-padded with position -1. n = prompt length. The DLM gives the
           first draft d1, the TLM the logits L0 for position n.
first      d1 is checked against L0 at once (greedy: d1 == argmax L0; sampled:
token      the acceptance rule), so the first token streams right after
           prefill. If d1 is rejected, the target's token replaces it and the
           seq_len-k round below is skipped (it could only verify drafts that
           follow a rejected one).
round 1    (d1 accepted) DLM: k-1 calls of seq_len 1 (d1 -> d2, ...). TLM: one
           call of seq_len k with [d1..dk] at n..n+k-1: d2..dk are checked, the
           last row gives the bonus token.
round r    t = the last token, at position m. DLM: seq_len 1 with [t] at m, or
           seq_len 2 with [dk, t] at [m-1, m] when every draft of the previous
           round was accepted; then k-1 calls of seq_len 1. TLM: seq_len k+1
           with [t, d1..dk] at m..m+k.
accept     the longest prefix of drafts equal to the TLM's own tokens, then
           the TLM's token (correction or bonus); sampled tokens are drawn
           with position-keyed noise (sampling.py), so the text is the
           target's whatever the drafts. Rejected positions are reused.
stop       EOS (included in the output), max new tokens, or a full context:
           prompt + output never exceed ctx_len tokens; near the end fewer
           drafts are made and the rest of the fixed-width call is padding (-1).

With several compiled widths (``k_list`` in the TLM manifest) each round picks
the number of drafts j (policy.py: expected tokens per second from measured
call times and a pooled acceptance estimate; j = 0, the fallback, when 0 is
compiled). A fixed ``k`` sets every round, round 1 included.

A draft whose table has another size than the target's (one tokenizer, padded
differently, or cut to its first rows) drafts only the ids both have, and
reads an id it has no row for as a fill id (vocab.py); the target's side is
unchanged, so greedy output and the sampled distribution are the target's.

Target-only decoding (the baseline) runs the TLM alone: prefill, then one token
per call at the TLM's smallest compiled width (1 when 0 is in k_list), the
token in slot 0 and the rest padding (-1); the logits of the valid token are
used. Without seq_len 1, padding keeps it to the same compiled graph; the cost
of the padded width is part of what the baseline measures.
"""
from __future__ import annotations

import numpy as np

from ..errors import SpecdecError
from .backends import Backend
from .calls import check_backend, exclusive, run_one, steps
from .costs import CostModel
from .drafts import make_draft_source
from .drafts.dlm import DlmDraft
from .generation import OnTokens, check_prompt, SpecGeneration, TargetGeneration
from .hf_args import parse, resolve_tokenizer
from .metrics import GenerationResult
from .policy import WidthPolicy
from .sampling import SamplingParams
from .streaming import TokenSink


def eos_set(eos, vocab_size: int | None = None) -> frozenset:
    """EOS ids as a set: None, one id, or several (e.g. a manifest's eos_token_ids). Anything else
    (a string such as "12", None or a float in a list, a negative id, an id >= ``vocab_size``, the
    target's vocabulary when known: it could never be generated) is refused in one line."""
    if eos is None:
        return frozenset()
    if isinstance(eos, np.ndarray) and eos.ndim == 0:     # np.array(2): one id
        eos = eos.item()
    items = [eos] if isinstance(eos, (int, np.integer)) else eos
    if isinstance(eos, (str, bytes, dict)) or not isinstance(items, (list, tuple, set, frozenset, np.ndarray)):
        raise SpecdecError(f"eos_token_id must be an id or a list of ids (got {eos!r})")
    out = set()
    for e in items:
        if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, np.integer)) or e < 0:
            raise SpecdecError(f"eos_token_id {eos!r}: {e!r} is not a token id (an integer >= 0)")
        if vocab_size and e >= vocab_size:
            raise SpecdecError(f"eos_token_id {eos!r}: {int(e)} is outside the target's vocabulary "
                               f"[0, {vocab_size}), so it could never be generated")
        out.add(int(e))
    return frozenset(out)


class _Decoder:
    """What both decoders share: one prompt, or many through the rows of a batch.
    A subclass gives ``backends()``, ``coroutine(...)`` and ``tokenizer`` (or None).

    Every entry takes a prompt in the forms HF users hold and HF's generation
    keywords (hf_args.py): a string or strings (with a tokenizer), token ids, a
    ``[n]`` / ``[batch, n]`` array (NumPy or torch), a tokenizer's output, chat
    ``messages=``; ``max_new_tokens``, ``max_length``, ``do_sample``, ``temperature``,
    ``top_k``, ``top_p``, ``seed``, ``stop_strings`` / ``stop``, ``streamer``,
    ``tokenizer``; or the runtime's ``sampling=SamplingParams(...)``. Another keyword is
    a one-line SpecdecError naming it."""

    tokenizer = None

    def check_call_tokenizer(self, tok) -> None:
        """A ``tokenizer=`` given to one call in place of the decoder's: checked as the decoder's own
        was (SpecDecoder: against its draft model); nothing to check for the target alone."""

    def generate(self, inputs=None, /, **kwargs):
        """One prompt: its GenerationResult (row 0 of each call; a batch > 1 artifact's other
        rows are padding); several (a list of strings, a ``[batch, n]`` array): the list of
        results, through every row (``generate_many``). ``streamer=`` (one prompt): an HF
        streamer fed as tokens are accepted. Sampled text depends on (prompt, seed,
        ``prompt_index``) only; without a seed, one is drawn from ``rng`` (or fresh).
        With a tokenizer, each result's ``text`` is its decoded output."""
        req = parse(inputs, kwargs, self.tokenizer, "generate", self.check_call_tokenizer, self.eos)
        if not req.single:
            return self._many(req)
        sink = (TokenSink(req.tokenizer, req.prompts[0], streamer=req.streamer, user=req.on_tokens, chunks=False)
                if req.streamer is not None else None)
        try:
            with exclusive(self.backends()):
                return _texted(run_one(self._coroutine(req, sink or req.on_tokens)), req.tokenizer)
        finally:
            if sink is not None:
                sink.end()

    def _coroutine(self, req, on_tokens):
        prompt = check_prompt(req.prompts[0], self.tlm, req.max_new_tokens)
        for b in self.backends():
            b.reset()
        noise = req.sampling.noise(req.prompt_index, req.rng)
        return self.coroutine(prompt, req.max_new_tokens, req.sampling, noise, on_tokens, stop=req.stop)

    def stream(self, inputs=None, /, **kwargs):
        """One prompt (a string, an id list, a ``[1, n]`` array, one chat): yields its text as it
        is accepted, in chunks of whole characters, as ``TextIteratorStreamer`` does (token-id
        lists without a tokenizer); the generator's return value is the GenerationResult.
        Several prompts: every row of the batch (continuous batching, batch.py), yielding
        (index, GenerationResult) as each finishes; every prompt is checked first. Prompt i
        samples as ``generate(prompts[i], prompt_index=i)`` with the same seed."""
        req = parse(inputs, kwargs, self.tokenizer, "stream", self.check_call_tokenizer, self.eos)
        if req.single:
            return self._stream_one(req)
        return self._stream_many(req)

    def _stream_one(self, req):
        sink = TokenSink(req.tokenizer, req.prompts[0], streamer=req.streamer, user=req.on_tokens)
        try:
            with exclusive(self.backends()):
                steps_ = steps(self._coroutine(req, sink))
                while True:
                    try:
                        next(steps_)
                    except StopIteration as e:
                        yield from sink.take()
                        yield from sink.flush()
                        return _texted(e.value, req.tokenizer)
                    yield from sink.take()
        finally:
            sink.end()

    def _stream_many(self, req):
        from .batch import BatchEngine
        on_tokens = req.on_tokens
        if on_tokens is not None and req.single:   # generate_many(one prompt): on_tokens takes (ids, sources)
            on_tokens = lambda _i, ids, sources: req.on_tokens(ids, sources)  # noqa: E731
        for i, r in BatchEngine(self).stream(req.prompts, max_new_tokens=req.max_new_tokens, sampling=req.sampling,
                                             rng=req.rng, on_tokens=on_tokens, stop=req.stop):
            yield i, _texted(r, req.tokenizer)

    def generate_many(self, inputs=None, /, **kwargs) -> list[GenerationResult]:
        """Several prompts (any form ``generate`` takes; one prompt is a batch of one) through
        every row of the batch; the results in input order."""
        req = parse(inputs, kwargs, self.tokenizer, "generate_many", self.check_call_tokenizer, self.eos)
        return self._many(req)

    def _many(self, req) -> list[GenerationResult]:
        out = [None] * len(req.prompts)
        for i, r in self._stream_many(req):
            out[i] = r
        return out


def _texted(res: GenerationResult, tok) -> GenerationResult:
    """``res`` with its ``text`` decoded when there is a tokenizer."""
    if res is not None and callable(getattr(tok, "decode", None)):
        res.text = tok.decode(res.generated_ids, skip_special_tokens=True)
    return res


class TargetOnlyDecoder(_Decoder):
    """The TLM alone: the baseline, through the same backend and artifact.

    With a TLM artifact each step is a call of its smallest compiled width (one
    valid token, the rest padding). The target export compiled with
    ``--role dlm`` (specializations PL/2/1, last-token logits) gives the plain
    seq_len-1 baseline instead.
    """

    def __init__(self, tlm: Backend, *, eos_token_id=None, record_calls: bool = False, tokenizer=None):
        check_backend(tlm)
        art = getattr(tlm, "artifact", None)
        if getattr(art, "feature_draft", None) is not None:
            # it would run on zero features: tokens with no meaning, and no error
            raise SpecdecError(f"{art.path} is a feature draft: it reads a target's hidden states and cannot "
                               f"decode alone; pass it as the draft (--dlm) of a target compiled with "
                               f"--hidden-states")
        self.tlm = tlm
        self.tokenizer = resolve_tokenizer(tokenizer)
        self.eos_token_id = eos_token_id
        self.eos = eos_set(eos_token_id, tlm.vocab_size)
        self.record_calls = record_calls
        self.width = min(tlm.seq_lens)
        self.costs = CostModel()

    def backends(self) -> list[Backend]:
        return [self.tlm]

    def coroutine(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams, noise,
                  on_tokens: OnTokens | None = None, stop=None):
        """One generation as a coroutine of calls (generation.py); ``prompt`` already checked."""
        return TargetGeneration(self, prompt, max_new_tokens, sampling, noise, on_tokens, stop).run()


class SpecDecoder(_Decoder):
    """Speculative decoding: a TLM backend verifies drafts from a draft source (see the module doc).

    The draft source, ``draft=``: a source object (drafts/: :class:`~.drafts.ngram.NgramDraft`,
    :class:`~.drafts.suffix.SuffixDraft`, :class:`~.drafts.dlm.DlmDraft`,
    :class:`~.drafts.hybrid.HybridDraft`, or your own), or "ngram" (``ngram_max`` its longest
    n-gram) or "suffix" (its defaults), or "hybrid" with ``dlm``: prompt lookup (n-grams of 2 to
    ``ngram_max`` tokens) when it matches, the DLM or feature draft otherwise; drafts/__init__.py's
    ``make_draft_source`` chooses it. ``dlm``, the second argument (positional only): a DLM or
    feature draft backend, or a source object.
    ``tokenizer`` (and ``dlm_tokenizer`` when the DLM came with its own; a
    tokenizer object or a local directory): text prompts, stop strings and results'
    ``text`` use it; the pair must agree on them (else on the manifests' special token ids), and the
    draft proposes only ids the tokenizers have. TLM and DLM tables may differ
    in size (see vocab.py).
    ``policy``: the width policy (policy.py); or build one from ``k`` (drafts per
    round, fixed: one of k_list or the compiled k - 1; default the TLM's k,
    adaptive when several widths are compiled), ``adaptive`` and ``fallback``
    (drafting nothing may be chosen; needs 0 in the TLM's k_list).
    ``draft_min_prob``: with a draft model (``dlm``, alone or in "hybrid"), a round's drafts stop
    where the model's probability of its chain falls below it (:class:`~.drafts.dlm.DlmDraft`);
    0 (default): the drafts the width policy asks for.
    """

    def __init__(self, tlm: Backend, dlm=None, /, *, draft=None, ngram_max: int | None = None,
                 eos_token_id=None, k: int | None = None, adaptive: bool | None = None, fallback: bool = True,
                 policy: WidthPolicy | None = None, record_calls: bool = False, tokenizer=None,
                 dlm_tokenizer=None, draft_min_prob: float = 0.0):
        check_backend(tlm)
        if getattr(tlm.artifact, "role", "tlm") != "tlm":   # it has no verification widths to check drafts with
            raise SpecdecError(f"{tlm.artifact.path}: the target is a {str(tlm.artifact.role).upper()} artifact; a "
                               f"SpecDecoder's target must be a TLM artifact (--role tlm): were the two swapped?")
        if policy is not None and not isinstance(policy, WidthPolicy):
            raise SpecdecError(f"policy must be a WidthPolicy instance (got {policy!r})")
        self.tokenizer = tokenizer = resolve_tokenizer(tokenizer)
        self.source = make_draft_source(draft, dlm, ngram_max=ngram_max, tokenizer=tokenizer,
                                        dlm_tokenizer=resolve_tokenizer(dlm_tokenizer), min_prob=draft_min_prob)
        self.source.bind(tlm)
        self.dlm = self.source.backend if isinstance(self.source, DlmDraft) else None
        self.vocab = getattr(self.source, "vocab", None) if self.dlm is not None else None
        self.tlm = tlm
        self.eos_token_id = eos_token_id
        self.eos = eos_set(eos_token_id, tlm.vocab_size)
        self.record_calls = record_calls
        if policy is not None and (k is not None or adaptive is not None or not fallback):
            raise SpecdecError("give either a policy or k/adaptive/fallback, not both")
        art = tlm.artifact
        self.policy = (policy or WidthPolicy(k, adaptive, fallback)).bind(art.k, art.k_list, tlm.seq_lens)
        self.costs = self.policy.costs

    def backends(self) -> list[Backend]:
        return [self.tlm] + list(self.source.backends())

    def check_call_tokenizer(self, tok) -> None:
        """A per-call ``tokenizer=``: the check ``tokenizer=`` gets here (a draft model's source
        compares it with the draft's tokenizer, ``DlmDraft.check_tokenizer``), before it encodes."""
        check = getattr(self.source, "check_tokenizer", None)
        if callable(check):
            check(tok)

    def coroutine(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams, noise,
                  on_tokens: OnTokens | None = None, stop=None):
        """One generation as a coroutine of calls (generation.py); ``prompt`` already checked."""
        return SpecGeneration(self, prompt, max_new_tokens, sampling, noise, on_tokens, stop).run()


def generate(tlm: Backend, dlm: Backend | None, prompt_ids, *, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
             eos_token_id=None, k: int | None = None, tokenizer=None, draft=None,
             on_tokens: OnTokens | None = None) -> GenerationResult:
    """One generation: speculative when ``dlm`` (or ``draft``) is given, target-only otherwise."""
    sp = SamplingParams(temperature, top_k, top_p, seed)
    if dlm is None and draft is None:
        dec = TargetOnlyDecoder(tlm, eos_token_id=eos_token_id, tokenizer=tokenizer)
    else:
        dec = SpecDecoder(tlm, dlm, draft=draft, eos_token_id=eos_token_id, k=k, tokenizer=tokenizer)
    return dec.generate(prompt_ids, max_new_tokens=max_new_tokens, sampling=sp, on_tokens=on_tokens)
