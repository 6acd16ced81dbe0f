"""The decoding loops: speculative (DLM drafts, TLM verifies) and target-only.

Speculative decoding follows contract section 6. ``generate`` runs one prompt
in row 0 (other rows padding); ``generate_many`` / ``stream`` run one prompt per
row with continuous batching (batch.py). The loop itself is in generation.py.
Drafts come from a DLM or from n-gram lookup (drafts.py); with n-gram drafts
there is no DLM call and a round with no match verifies nothing (width 1 when
compiled).

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
accept     the longest prefix of drafts the TLM agrees with, then the TLM's
           token (correction or bonus). Rejected positions are reused.
stop       EOS (included in the output), max new tokens, or a full context:
           prompt + output never exceed ctx_len tokens; near the end fewer
           drafts are made and the rest of the fixed-width call is padding (-1).

With several compiled widths (``k_list`` in the TLM manifest) each round picks
the number of drafts j (a TLM width >= j+1) that maximizes expected tokens per
unit of time: (1 - a^(j+1)) / (1 - a) over j * t_dlm + t_tlm(j+1) + the loop's
host work per round, from a decayed acceptance estimate a and measured times.
With 0 compiled (``--k-list 0,...``) j = 0 is a choice (the fallback), with a
probe back to drafting after 4, 8, ... 64 rounds. A fixed ``k`` sets every
round, round 1 included.

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
from .artifact import check_pair
from .backends import Backend
from .drafts import NgramDraft, make_draft_source
from .generation import PAD_ID, OnTokens, _check_prompt, _Generation, _TargetGeneration, run_one  # noqa: F401
from .metrics import GenerationResult, aggregate_metrics  # noqa: F401  (re-exported)
from .sampling import SamplingParams
from .vocab import PairVocab


def eos_set(eos) -> frozenset:
    """EOS ids as a set: None, one id, or several (e.g. a manifest's eos_token_ids)."""
    if eos is None:
        return frozenset()
    if isinstance(eos, (int, np.integer)):
        return frozenset([int(eos)])
    return frozenset(int(e) for e in eos)


class _Decoder:
    """What both decoders share: one prompt, or many through the rows of a batch.
    A subclass gives ``backends()`` and ``coroutine(...)``."""

    def generate(self, prompt_ids, *, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
                 rng: np.random.Generator | None = None, on_tokens: OnTokens | None = None) -> GenerationResult:
        """One generation (row 0 of each call; a batch > 1 artifact's other rows are padding)."""
        sampling = sampling or SamplingParams()
        rng = rng if rng is not None else sampling.rng()
        prompt = _check_prompt(prompt_ids, self.tlm, max_new_tokens)
        for b in self.backends():
            b.reset()
        return run_one(self.coroutine(prompt, max_new_tokens, sampling, rng, on_tokens))

    def stream(self, prompts, *, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
               rng: np.random.Generator | None = None, on_tokens=None):
        """Several prompts through every row of the batch (continuous batching, batch.py):
        yields (index, GenerationResult) as each finishes. Every prompt is checked first."""
        from .batch import BatchEngine
        return BatchEngine(self).stream(prompts, max_new_tokens=max_new_tokens, sampling=sampling, rng=rng,
                                        on_tokens=on_tokens)

    def generate_many(self, prompts, **kw) -> list[GenerationResult]:
        """Several prompts through every row of the batch; the results in input order."""
        out = [None] * len(prompts)
        for i, r in self.stream(prompts, **kw):
            out[i] = r
        return out


class TargetOnlyDecoder(_Decoder):
    """The TLM alone: the baseline, through the same backend and artifact.

    With a TLM artifact each step is a call of its smallest compiled width (one
    valid token, the rest padding). The target export compiled with
    ``--role dlm`` (specializations PL/2/1, last-token logits) gives the plain
    seq_len-1 baseline instead.
    """

    def __init__(self, tlm: Backend, *, eos_token_id=None, record_calls: bool = False):
        self.tlm = tlm
        self.eos_token_id = eos_token_id
        self.eos = eos_set(eos_token_id)
        self.record_calls = record_calls
        self.width = min(tlm.seq_lens)

    def backends(self) -> list[Backend]:
        return [self.tlm]

    def coroutine(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams, rng,
                  on_tokens: OnTokens | None = None):
        """One generation as a coroutine of calls (generation.py); ``prompt`` already checked."""
        return _TargetGeneration(self, prompt, max_new_tokens, sampling, rng, on_tokens).run()


class SpecDecoder(_Decoder):
    """Speculative decoding: a TLM backend verifies drafts from a draft source (see the module doc).

    The draft source: ``dlm`` (a DLM backend), or no DLM and ``draft="ngram"``
    (prompt lookup, :class:`~.drafts.NgramDraft`, ``ngram_max`` its longest
    n-gram), or an ``NgramDraft`` passed in place of ``dlm``.
    ``k``: drafts per round. Default: the TLM's compiled k; with several
    compiled widths (k_list) the default is adaptive. Giving ``k`` (one of
    k_list, or the compiled k - 1) fixes every round, round 1 included.
    ``adaptive``: force adaptive width choice on or off. ``fallback``: the
    adaptive choice may draft nothing (TLM width 1, plain decoding) when that
    pays; it needs 0 in the TLM's k_list. ``tokenizer`` (and
    ``dlm_tokenizer`` when the DLM came with its own): the pair must agree on
    them (else on the manifests' special token ids), and the draft proposes
    only ids the tokenizers have. TLM and DLM tables may differ in size (see
    vocab.py).
    """

    PROBE_FIRST, PROBE_MAX, DECAY = 4, 64, 0.8

    def __init__(self, tlm: Backend, dlm=None, *, draft=None, ngram_max: int | None = None,
                 eos_token_id=None, k: int | None = None, adaptive: bool | None = None, fallback: bool = True,
                 record_calls: bool = False, tokenizer=None, dlm_tokenizer=None):
        self.source = dlm if isinstance(dlm, NgramDraft) else make_draft_source(draft, ngram_max)
        self.dlm = None if isinstance(dlm, NgramDraft) else dlm
        if self.source is not None and self.dlm is not None:
            raise SpecdecError("give either a DLM or draft='ngram', not both")
        if self.source is None and self.dlm is None:
            raise SpecdecError("speculative decoding needs a DLM backend or draft='ngram'")
        self.vocab = None
        if self.dlm is not None:
            check_pair(tlm.artifact, self.dlm.artifact, tokenizers=(tokenizer, dlm_tokenizer))
            toks = [len(t) for t in (tokenizer, dlm_tokenizer) if t is not None]
            self.vocab = pair_vocab(tlm, self.dlm, min(toks) if toks else None)
        self.tlm = tlm
        self.eos_token_id = eos_token_id
        self.eos = eos_set(eos_token_id)
        self.record_calls = record_calls
        art = tlm.artifact
        self.k0 = art.k                              # the compiled k: round 1 is width k
        self.k_list = tuple(art.k_list) or (art.k,)
        self.widths = sorted(tlm.seq_lens)
        # draft counts a round may use: j drafts need a TLM width >= j+1
        all_j = set(self.k_list) | ({self.k0 - 1} if self.k0 >= 1 else set())
        self.compiled_choices = sorted(j for j in all_j if j >= 0 and j + 1 in self.widths)
        if k is not None and k not in self.compiled_choices:
            raise SpecdecError(f"k={k} is not compiled into the TLM (k_list {list(self.k_list)}; "
                               f"the drafts a round can verify: {self.compiled_choices})")
        self.fixed_k = k
        self.k = k if k is not None else self.k0
        self.fallback = bool(fallback)
        self.choices = [j for j in self.compiled_choices if j > 0 or self.fallback]
        self.adaptive = (len(self.k_list) > 1 and k is None) if adaptive is None else bool(adaptive)
        # running means, kept across prompts: call times, and the loop's own host work per round
        self._cost = {"dlm": [0, 0.0], "tlm": {}, "host": {}}
        self.live: set = set()      # generations decoding now (several in a batch): their acceptance is pooled

    def width_for(self, n_tokens: int) -> int:
        """The smallest compiled TLM width that holds ``n_tokens``."""
        for w in self.widths:
            if w >= n_tokens:
                return w
        raise AssertionError(f"no TLM width holds {n_tokens} tokens (widths {self.widths})")

    # -- width choice ---------------------------------------------------
    def _note_cost(self, role, width, dt):
        if role == "dlm":
            if width <= 2:
                self._cost["dlm"][0] += 1
                self._cost["dlm"][1] += dt
        else:
            c = self._cost["tlm"].setdefault(width, [0, 0.0])
            c[0] += 1
            c[1] += dt

    def _note_host(self, drafting: bool, dt: float) -> None:
        c = self._cost.setdefault("host", {}).setdefault(bool(drafting), [0, 0.0])
        c[0] += 1
        c[1] += dt

    def _host_per_round(self) -> tuple[float, float]:
        """Mean host seconds of a round without drafts and of one with drafts (an
        unmeasured kind costs what the other does)."""
        h = {k: t / n for k, (n, t) in self._cost.get("host", {}).items() if n}
        h0, h1 = h.get(False), h.get(True)
        h0 = h1 if h0 is None else h0
        h1 = h0 if h1 is None else h1
        return h0 or 0.0, h1 or 0.0

    def expected_tokens(self, alpha: float, j: int) -> float:
        if alpha >= 1.0:
            return j + 1.0
        return (1.0 - alpha ** (j + 1)) / (1.0 - alpha)

    def choose_drafts(self, alpha: float, drafting: bool = False) -> int:
        """The number of drafts j (from the compiled widths) with the most expected
        tokens per second; ``drafting``: the best j > 0 (a probe)."""
        if not self.adaptive:
            return self.k
        dn, dt = self._cost["dlm"]
        c_d = dt / dn if dn else 0.0
        seen = {w: t / n for w, (n, t) in self._cost["tlm"].items() if n}
        mean_t = (sum(seen.values()) / len(seen)) if seen else 1.0
        if not drafting and 0 in self.choices and self.width_for(1) not in seen:
            return 0  # time plain decoding once: priced like the nearest wider call it would never be chosen
        h0, h1 = self._host_per_round()
        best, best_score = None, -1.0
        for j in self.choices:
            if drafting and j == 0:
                continue
            w = self.width_for(j + 1)
            if w in seen:
                c_t = seen[w]
            elif seen:  # an untried width costs what the nearest tried width costs
                c_t = seen[min(seen, key=lambda s: (abs(s - w), s))]
            else:
                c_t = mean_t
            score = self.expected_tokens(alpha, j) / (j * c_d + c_t + (h1 if j else h0))
            if score > best_score + 1e-12:
                best, best_score = j, score
        return self.k if best is None else best

    # -- generation -----------------------------------------------------
    def backends(self) -> list[Backend]:
        return [self.tlm] + ([self.dlm] if self.dlm is not None else [])

    def coroutine(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams, rng,
                  on_tokens: OnTokens | None = None):
        """One generation as a coroutine of calls (generation.py); ``prompt`` already checked."""
        return _Generation(self, prompt, max_new_tokens, sampling, rng, on_tokens).run()


def pair_vocab(tlm: Backend, dlm: Backend, tokenizer_len: int | None = None) -> PairVocab | None:
    """How the pair shares its vocabulary; None when nothing needs mapping (or the
    sizes are not known)."""
    vt, vd = tlm.vocab_size, dlm.vocab_size
    if not vt or not vd:
        return None
    reads = dlm.input_vocab if vd < vt else vd   # a smaller draft may still read more ids than it emits
    v = PairVocab.of(vt, vd, tokenizer_len=tokenizer_len, draft_reads=reads)
    return None if v.same else v


def generate(tlm: Backend, dlm: Backend | None, prompt_ids, *, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
             eos_token_id=None, k: int | None = None, tokenizer=None, draft=None,
             on_tokens: OnTokens | None = None) -> GenerationResult:
    """One generation: speculative when ``dlm`` (or ``draft="ngram"``) is given, target-only otherwise."""
    sp = SamplingParams(temperature, top_k, top_p, seed)
    if dlm is None and draft is None:
        dec = TargetOnlyDecoder(tlm, eos_token_id=eos_token_id)
    else:
        dec = SpecDecoder(tlm, dlm, draft=draft, eos_token_id=eos_token_id, k=k, tokenizer=tokenizer)
    return dec.generate(prompt_ids, max_new_tokens=max_new_tokens, sampling=sp, on_tokens=on_tokens)
