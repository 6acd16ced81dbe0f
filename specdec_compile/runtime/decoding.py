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
    """Speculative decoding with a DLM and a TLM backend (see the module doc).

    ``k``: drafts per round. Default: the TLM's compiled k; with several
    compiled widths (k_list) the default is adaptive. Giving ``k`` (one of
    k_list) fixes it. ``adaptive``: force adaptive width choice on or off.
    ``tokenizer`` (and ``dlm_tokenizer`` when the DLM came with its own): the
    pair must agree on them (else on the manifests' special token ids), and
    the draft proposes only ids the tokenizers have. TLM and DLM tables may
    differ in size (see vocab.py).
    """

    def __init__(self, tlm: Backend, dlm: Backend, *, eos_token_id=None, k: int | None = None,
                 adaptive: bool | None = None, record_calls: bool = False, tokenizer=None,
                 dlm_tokenizer=None):
        check_pair(tlm.artifact, dlm.artifact, tokenizers=(tokenizer, dlm_tokenizer))
        toks = [len(t) for t in (tokenizer, dlm_tokenizer) if t is not None]
        self.vocab = pair_vocab(tlm, dlm, min(toks) if toks else None)
        self.tlm, self.dlm = tlm, dlm
        self.eos_token_id = eos_token_id
        self.eos = eos_set(eos_token_id)
        self.record_calls = record_calls
        art = tlm.artifact
        self.k0 = art.k                              # the compiled k: round 1 is width k
        self.k_list = tuple(art.k_list) or (art.k,)
        if k is not None:
            if k not in self.k_list:
                raise SpecdecError(f"k={k} is not compiled into the TLM (k_list {list(self.k_list)})")
        self.k = k if k is not None else self.k0
        self.adaptive = (len(self.k_list) > 1 and k is None) if adaptive is None else bool(adaptive)
        # draft counts a round may use: j drafts need TLM width j+1
        self.choices = sorted(set(self.k_list) | ({self.k0 - 1} if self.k0 >= 1 else set()))
        self._cost = {"dlm": [0, 0.0], "tlm": {}}    # running call-time means, kept across prompts

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

    def choose_drafts(self, alpha: float) -> int:
        """The number of drafts j (from the compiled widths) with the most expected tokens per second."""
        if not self.adaptive:
            return self.k
        dn, dt = self._cost["dlm"]
        c_d = dt / dn if dn else 0.0
        seen = {w: t / n for w, (n, t) in self._cost["tlm"].items() if n}
        mean_t = (sum(seen.values()) / len(seen)) if seen else 1.0
        best, best_score = self.k, -1.0
        for j in self.choices:
            if j < 0:
                continue
            w = j + 1
            if w in seen:
                c_t = seen[w]
            elif seen:  # an untried width costs what the nearest tried width costs
                c_t = seen[min(seen, key=lambda s: (abs(s - w), s))]
            else:
                c_t = mean_t
            score = self.expected_tokens(alpha, j) / (j * c_d + c_t)
            if score > best_score + 1e-12:
                best, best_score = j, score
        return best

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


class _Generation:
    """One speculative generation: the state carried from round to round."""

    def __init__(self, dec: SpecDecoder, prompt: list[int], max_new_tokens: int, sampling: SamplingParams,
                 rng, on_tokens: OnTokens | None):
        self.dec = dec
        self.prompt = prompt
        self.max_new = max_new_tokens
        self.sampling, self.rng, self.on_tokens = sampling, rng, on_tokens
        self.meter = _Meter(max(dec.choices), dec.record_calls)
        self.vocab = dec.vocab
        self.tlm = _Runner(dec.tlm, "tlm")
        self.dlm = _Runner(dec.dlm, "dlm", self.vocab.draft_ids if self.vocab else None)
        for r in (self.tlm, self.dlm):
            r.meter, r.cost = self.meter, dec._note_cost
        dec.tlm.reset()
        dec.dlm.reset()
        self.CL = dec.tlm.ctx_len
        self.seq = list(prompt)
        self.out: list[int] = []
        self.sources: list[str] = []
        self.tlm_valid = self.dlm_valid = len(prompt)   # each cache holds seq[:valid]
        self.first_round = True
        self.first_accepted = False
        self.alpha_acc, self.alpha_chk = 0, 1

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
        """Prefill both models, then the first token from L0 and d1."""
        L0 = self.tlm.prefill(self.prompt)
        q0 = self.dlm.prefill(self.prompt)
        d1, q1 = self.pick_draft(q0)
        a, tok = verify([d1], [q1], L0[None], self.sampling, self.rng, bonus=False)
        self.first_accepted = a == 1
        self.alpha_acc = a
        if not self.first_accepted:
            self.meter.add_round(1, 0)    # a round that the prefill logits alone decided
            return self.emit([tok], ["target"])
        return self.emit([d1], ["draft"])

    def pick_draft(self, logits) -> tuple[int, np.ndarray | None]:
        """A draft token and the distribution over the target's ids it was drawn from."""
        if self.vocab is None:
            return pick(logits, self.sampling, self.rng)
        d, q = pick(self.vocab.draft_logits(logits), self.sampling, self.rng)
        return d, self.vocab.draft_dist(q)

    def draft(self, q: int, n: int) -> tuple[list[int], list]:
        """``n`` drafts for positions q.. (the DLM first catches up to seq[:q])."""
        drafts, dists = [], []
        if n <= 0:
            return drafts, dists
        pending, p0 = self.seq[self.dlm_valid:q], self.dlm_valid
        while len(pending) > 2:          # only after a round without drafts
            self.dlm.call(pending[:2], p0, 2)
            pending, p0 = pending[2:], p0 + 2
        logits = self.dlm.call(pending, p0, len(pending))[0]
        self.dlm_valid = q
        for i in range(n):
            d, dist = self.pick_draft(logits)
            drafts.append(d)
            dists.append(dist)
            if i < n - 1:
                logits = self.dlm.call([d], q + i, 1)[0]
                self.dlm_valid = q + i + 1
        return drafts, dists

    def round(self) -> str | None:
        """One round: draft, verify [t, d1..dn] at q-1.. padded to width j+1, accept."""
        dec, meter = self.dec, self.meter
        q = len(self.seq)                     # position of the next token
        remaining = min(self.max_new - len(self.out), self.CL - q)
        round1 = self.first_round and self.first_accepted
        if round1:
            j = dec.k0 - 1                    # contract round 1: TLM width k, [d1..dk]
        else:
            j = dec.choose_drafts((self.alpha_acc + 1.0) / (self.alpha_chk + 2.0))
        kv = max(min(j, remaining - 1), 0)   # drafts worth making
        drafts, dists = self.draft(q, kv)
        pending_t = self.seq[self.tlm_valid:q]
        if len(pending_t) != 1:
            raise AssertionError(f"TLM is {len(pending_t)} tokens behind")
        rows = self.tlm.call(pending_t + drafts, self.tlm_valid, j + 1)
        meter.verify_calls += 1
        meter.widths[j] = meter.widths.get(j, 0) + 1
        a, tok = verify(drafts, dists, rows[: kv + 1], self.sampling, self.rng)
        if round1:
            meter.add_round(kv + 1, a + 1)   # d1 belongs to round 1
        elif kv:
            meter.add_round(kv, a)           # (a last round without drafts is no round of drafting)
        self.alpha_acc += a
        self.alpha_chk += a + (1 if a < kv else 0)
        self.tlm_valid = q + a
        self.dlm_valid = min(self.dlm_valid, q + a)
        n_before = len(self.out)
        stop = self.emit(drafts[:a] + [tok], ["draft"] * a + ["target"])
        # tokens this TLM call produced (round 1 also confirmed d1)
        meter.round_tokens += len(self.out) - n_before + (1 if round1 else 0)
        self.first_round = False
        return stop


def generate(tlm: Backend, dlm: Backend | None, prompt_ids, *, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
             eos_token_id=None, k: int | None = None, tokenizer=None,
             on_tokens: OnTokens | None = None) -> GenerationResult:
    """One generation: speculative when ``dlm`` is given, target-only otherwise."""
    sp = SamplingParams(temperature, top_k, top_p, seed)
    if dlm is None:
        dec = TargetOnlyDecoder(tlm, eos_token_id=eos_token_id)
    else:
        dec = SpecDecoder(tlm, dlm, eos_token_id=eos_token_id, k=k, tokenizer=tokenizer)
    return dec.generate(prompt_ids, max_new_tokens=max_new_tokens, sampling=sp, on_tokens=on_tokens)
