"""The decoding loops: speculative (DLM drafts, TLM verifies) and target-only.

Speculative decoding follows contract section 6 (batch 1; with a batch > 1
artifact the prompt runs in row 0 and the other rows are padding):

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
the number of drafts j (TLM width j+1) that maximizes expected tokens per unit
of time: (1 - a^(j+1)) / (1 - a) over j * t_dlm + t_tlm(j+1), from the running
acceptance estimate a and the measured call times.

A draft whose table has another size than the target's (one tokenizer, padded
differently, or cut to its first rows) drafts only the ids both have, and
reads an id it has no row for as a fill id (vocab.py); the target's side is
unchanged, so greedy output and the sampled distribution are the target's.

Target-only decoding (the baseline) runs the TLM alone: prefill, then one token
per call at the TLM's smallest compiled width, the token in slot 0 and the
rest padding (-1); the logits of the valid token are used. The TLM artifact has
no seq_len 1, and padding keeps it to the same compiled graph; the cost of the
padded width is part of what the baseline measures.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..errors import SpecdecError
from .artifact import check_pair
from .backends import Backend
from .drafts import NgramDraft, make_draft_source
from .metrics import GenerationResult, _Meter, aggregate_metrics  # noqa: F401  (re-exported)
from .sampling import SamplingParams, pick, verify
from .vocab import PairVocab

PAD_ID = 0

OnTokens = Callable[[list, list], None]


def eos_set(eos) -> frozenset:
    """EOS ids as a set: None, one id, or several (e.g. a manifest's eos_token_ids)."""
    if eos is None:
        return frozenset()
    if isinstance(eos, (int, np.integer)):
        return frozenset([int(eos)])
    return frozenset(int(e) for e in eos)


def _check_prompt(prompt_ids, backend: Backend, max_new_tokens: int) -> list[int]:
    ids = [int(x) for x in prompt_ids]
    if not ids:
        raise SpecdecError("empty prompt: at least one token is needed")
    if max_new_tokens < 0:
        raise SpecdecError(f"max new tokens must be >= 0 (got {max_new_tokens})")
    CL = backend.ctx_len
    if len(ids) >= CL:
        raise SpecdecError(f"the prompt has {len(ids)} tokens and does not fit: the context holds {CL} "
                           f"tokens and at least one must be left to generate")
    v = backend.vocab_size
    if v and (min(ids) < 0 or max(ids) >= v):
        raise SpecdecError(f"prompt token id out of range [0, {v})")
    return ids


class _Runner:
    """Calls a backend with row 0 holding the tokens and everything else padding."""

    def __init__(self, backend: Backend, role: str, ids_map: Callable | None = None):
        self.b = backend
        self.role = role                        # the label its calls are timed under
        self.ids_map = ids_map                  # how this model reads token ids (see vocab.py)
        self.last_only = backend.role == "dlm"  # logits of the last valid token only
        self.B = backend.batch_size
        self.meter: _Meter | None = None
        self.cost = None

    def call(self, tokens, start: int, width: int, prefill: bool = False) -> np.ndarray:
        """Run ``tokens`` at positions start.. in a call of ``width``; returns row-0 logits."""
        n = len(tokens)
        if n > width:
            raise AssertionError(f"{n} tokens in a call of width {width}")
        ids = np.full((self.B, width), PAD_ID, np.int64)
        pos = np.full((self.B, width), -1, np.int64)
        ids[0, :n] = tokens
        pos[0, :n] = np.arange(start, start + n)
        if self.ids_map is not None:
            ids = self.ids_map(ids)
        t = time.perf_counter()
        out = self.b.run(ids, pos)
        dt = time.perf_counter() - t
        if self.meter is not None:
            self.meter.add_call(self.role, width, dt, prefill)
        if self.cost is not None and not prefill:
            self.cost(self.role, width, dt)
        return out[0]

    def prefill(self, tokens, start: int = 0) -> np.ndarray:
        """Run ``tokens`` in PL-sized chunks; returns the logits of the last token [V]."""
        PL = self.b.prefill_len
        out = None
        for c in range(0, len(tokens), PL):
            chunk = tokens[c:c + PL]
            out = self.call(chunk, start + c, PL, prefill=True)
            last = len(chunk) - 1
        return out[0] if self.last_only else out[last]


class TargetOnlyDecoder:
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

    def generate(self, prompt_ids, *, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
                 rng: np.random.Generator | None = None, on_tokens: OnTokens | None = None) -> GenerationResult:
        sampling = sampling or SamplingParams()
        rng = rng if rng is not None else sampling.rng()
        prompt = _check_prompt(prompt_ids, self.tlm, max_new_tokens)
        meter = _Meter(0, self.record_calls)
        run = _Runner(self.tlm, "tlm")
        run.meter = meter
        self.tlm.reset()
        CL = self.tlm.ctx_len
        seq = list(prompt)
        out: list[int] = []
        stop = "max_new_tokens"
        logits = run.prefill(prompt) if max_new_tokens > 0 else None
        while True:
            remaining = min(max_new_tokens - len(out), CL - len(seq))
            if remaining <= 0:
                stop = "max_new_tokens" if len(out) >= max_new_tokens else "ctx_len"
                break
            tok, _ = pick(logits, sampling, rng)
            out.append(tok)
            seq.append(tok)
            meter.first_token()
            if on_tokens:
                meter.callback(on_tokens, [tok], ["target"])
            if tok in self.eos:
                stop = "eos"
                break
            if remaining == 1:
                stop = "max_new_tokens" if len(out) >= max_new_tokens else "ctx_len"
                break
            logits = run.call([tok], len(seq) - 1, self.width)[0]
            meter.verify_calls += 1
            meter.round_tokens += 1
        meter.t_end = time.perf_counter()
        return GenerationResult(prompt, out, ["target"] * len(out), stop,
                                meter.metrics(len(out), speculative=False))


class SpecDecoder:
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
        self._cost = {"dlm": [0, 0.0], "tlm": {}}    # running call-time means, kept across prompts

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
            score = self.expected_tokens(alpha, j) / (j * c_d + c_t)
            if score > best_score + 1e-12:
                best, best_score = j, score
        return self.k if best is None else best

    # -- generation -----------------------------------------------------
    def generate(self, prompt_ids, *, max_new_tokens: int = 64, sampling: SamplingParams | None = None,
                 rng: np.random.Generator | None = None, on_tokens: OnTokens | None = None) -> GenerationResult:
        sampling = sampling or SamplingParams()
        rng = rng if rng is not None else sampling.rng()
        prompt = _check_prompt(prompt_ids, self.tlm, max_new_tokens)
        gen = _Generation(self, prompt, max_new_tokens, sampling, rng, on_tokens)
        if max_new_tokens == 0:
            return gen.result("max_new_tokens")
        stop = gen.start()
        while stop is None:
            stop = gen.round()
        if gen.first_accepted and gen.meter.verify_calls == 0:
            gen.meter.add_round(1, 1)        # generation ended with the accepted d1
        return gen.result(stop)


def pair_vocab(tlm: Backend, dlm: Backend, tokenizer_len: int | None = None) -> PairVocab | None:
    """How the pair shares its vocabulary; None when nothing needs mapping (or the
    sizes are not known)."""
    vt, vd = tlm.vocab_size, dlm.vocab_size
    if not vt or not vd:
        return None
    reads = dlm.input_vocab if vd < vt else vd   # a smaller draft may still read more ids than it emits
    v = PairVocab.of(vt, vd, tokenizer_len=tokenizer_len, draft_reads=reads)
    return None if v.same else v


class _DlmDrafter:
    """The DLM as a draft source: its runner and how far its cache holds the sequence."""

    def __init__(self, gen: "_Generation", dlm: Backend):
        self.gen = gen
        self.vocab = gen.vocab
        self.r = _Runner(dlm, "dlm", self.vocab.draft_ids if self.vocab else None)
        self.r.meter, self.r.cost = gen.meter, gen.dec._note_cost
        dlm.reset()
        self.valid = 0

    def pick(self, logits) -> tuple[int, np.ndarray | None]:
        """A draft token and the distribution over the target's ids it was drawn from."""
        g = self.gen
        if self.vocab is None:
            return pick(logits, g.sampling, g.rng)
        d, q = pick(self.vocab.draft_logits(logits), g.sampling, g.rng)
        return d, self.vocab.draft_dist(q)

    def first(self, prompt):
        q0 = self.r.prefill(prompt)
        self.valid = len(prompt)
        return self.pick(q0)

    def draft(self, seq, q: int, n: int) -> tuple[list[int], list]:
        """``n`` drafts for positions q.. (the DLM first catches up to seq[:q])."""
        drafts, dists = [], []
        if n <= 0:
            return drafts, dists
        pending, p0 = seq[self.valid:q], self.valid
        PL = self.r.b.prefill_len
        while len(pending) > 2:          # only after rounds without drafts
            step = PL if len(pending) > PL else 2
            self.r.call(pending[:step], p0, step)
            pending, p0 = pending[step:], p0 + step
        logits = self.r.call(pending, p0, len(pending))[0]
        self.valid = q
        for i in range(n):
            d, dist = self.pick(logits)
            drafts.append(d)
            dists.append(dist)
            if i < n - 1:
                logits = self.r.call([d], q + i, 1)[0]
                self.valid = q + i + 1
        return drafts, dists

    def rollback(self, valid: int) -> None:
        self.valid = min(self.valid, valid)


class _Generation:
    """One speculative generation: the state carried from round to round."""

    def __init__(self, dec: SpecDecoder, prompt: list[int], max_new_tokens: int, sampling: SamplingParams,
                 rng, on_tokens: OnTokens | None):
        self.dec = dec
        self.prompt = prompt
        self.max_new = max_new_tokens
        self.sampling, self.rng, self.on_tokens = sampling, rng, on_tokens
        self.meter = _Meter(max(dec.compiled_choices + [1]), dec.record_calls)
        self.vocab = dec.vocab
        self.tlm = _Runner(dec.tlm, "tlm")
        self.tlm.meter, self.tlm.cost = self.meter, dec._note_cost
        dec.tlm.reset()
        if dec.dlm is not None:
            self.drafter = _DlmDrafter(self, dec.dlm)
        else:
            self.drafter = dec.source.drafter(dec.tlm.vocab_size, sampling.greedy)
        self.CL = dec.tlm.ctx_len
        self.seq = list(prompt)
        self.out: list[int] = []
        self.sources: list[str] = []
        self.tlm_valid = len(prompt)   # the TLM cache holds seq[:tlm_valid]
        self.first_round = True
        self.first_accepted = False
        self.alpha_acc, self.alpha_chk = 0.0, 0.0     # decayed counts: accepted / checked drafts
        self.zero_rounds, self.probe_every = 0, dec.PROBE_FIRST

    def alpha(self) -> float:
        return (self.alpha_acc + 0.5) / (self.alpha_chk + 1.0)

    def note_acceptance(self, accepted: int, drafted: int) -> None:
        lam = self.dec.DECAY
        self.alpha_acc = lam * self.alpha_acc + accepted
        self.alpha_chk = lam * self.alpha_chk + accepted + (1 if accepted < drafted else 0)

    def result(self, stop: str) -> GenerationResult:
        self.meter.t_end = time.perf_counter()
        return GenerationResult(self.prompt, self.out, self.sources, stop,
                                self.meter.metrics(len(self.out), speculative=True))

    def emit(self, tokens, srcs) -> str | None:
        """Append tokens (cut at EOS and at the budget); returns a stop reason or None."""
        budget = min(self.max_new - len(self.out), self.CL - len(self.seq))
        tokens, srcs = list(tokens[:budget]), list(srcs[:budget])
        reason = None
        hits = [i for i, t in enumerate(tokens) if t in self.dec.eos]
        if hits:
            cut = hits[0] + 1
            tokens, srcs = tokens[:cut], srcs[:cut]
            reason = "eos"
        self.out.extend(tokens)
        self.sources.extend(srcs)
        self.seq.extend(tokens)
        if tokens:
            self.meter.first_token()
            if self.on_tokens:
                self.meter.callback(self.on_tokens, tokens, srcs)
        if reason is None and len(self.out) >= self.max_new:
            reason = "max_new_tokens"
        if reason is None and len(self.seq) >= self.CL:
            reason = "ctx_len"
        return reason

    def start(self) -> str | None:
        """Prefill the TLM (and the DLM), then the first token from L0 and d1."""
        L0 = self.tlm.prefill(self.prompt)
        first = self.drafter.first(self.prompt) if self.dec.fixed_k != 0 else None
        if first is None:                 # no first draft (n-gram: nothing matched; --k 0)
            tok, _ = pick(L0, self.sampling, self.rng)
            return self.emit([tok], ["target"])
        d1, q1 = first
        a, tok = verify([d1], [q1], L0[None], self.sampling, self.rng, bonus=False)
        self.first_accepted = a == 1
        self.note_acceptance(a, 1)
        if not self.first_accepted:
            self.meter.add_round(1, 0)    # a round that the prefill logits alone decided
            return self.emit([tok], ["target"])
        return self.emit([d1], ["draft"])

    def pick_width(self) -> int:
        """This round's draft count: the adaptive choice, with a probe now and then
        when it has settled on drafting nothing."""
        dec = self.dec
        j = dec.choose_drafts(self.alpha())
        if j != 0 or not dec.adaptive:
            self.zero_rounds, self.probe_every = 0, dec.PROBE_FIRST
            return j
        self.zero_rounds += 1
        if self.zero_rounds < self.probe_every:
            return 0
        self.zero_rounds = 0
        self.probe_every = min(2 * self.probe_every, dec.PROBE_MAX)
        return dec.choose_drafts(self.alpha(), drafting=True)

    def round(self) -> str | None:
        """One round: draft, verify [t, d1..dn] at q-1.. padded to a compiled width, accept."""
        dec, meter = self.dec, self.meter
        q = len(self.seq)                     # position of the next token
        remaining = min(self.max_new - len(self.out), self.CL - q)
        round1 = self.first_round and self.first_accepted
        if round1:                            # contract round 1: TLM width k, [d1..dk]
            j = (dec.fixed_k if dec.fixed_k is not None else dec.k0) - 1
        else:
            j = self.pick_width()
        kv = max(min(j, remaining - 1), 0)   # drafts worth making
        drafts, dists = self.drafter.draft(self.seq, q, kv) if kv else ([], [])
        kv = len(drafts)
        pending_t = self.seq[self.tlm_valid:q]
        if len(pending_t) != 1:
            raise AssertionError(f"TLM is {len(pending_t)} tokens behind")
        rows = self.tlm.call(pending_t + drafts, self.tlm_valid, dec.width_for(kv + 1))
        meter.verify_calls += 1
        meter.widths[kv] = meter.widths.get(kv, 0) + 1
        a, tok = verify(drafts, dists, rows[: kv + 1], self.sampling, self.rng)
        if round1:
            meter.add_round(kv + 1, a + 1)   # d1 belongs to round 1
        elif kv:
            meter.add_round(kv, a)           # (a round without drafts is no round of drafting)
        if kv:
            self.note_acceptance(a, kv)
        self.tlm_valid = q + a
        self.drafter.rollback(q + a)
        n_before = len(self.out)
        stop = self.emit(drafts[:a] + [tok], ["draft"] * a + ["target"])
        # tokens this TLM call produced (round 1 also confirmed d1)
        meter.round_tokens += len(self.out) - n_before + (1 if round1 else 0)
        self.first_round = False
        return stop


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
