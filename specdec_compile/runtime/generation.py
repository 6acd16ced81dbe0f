"""One generation as a coroutine of backend calls, and the driver for one row.

Each generation (speculative: :class:`_Generation`; target-only:
:class:`_TargetGeneration`) is written as a generator that *yields* a
:class:`Call` (which model, which tokens at which positions, which width) and is
sent back its own row of the logits. Who makes the call is up to the driver:
:func:`run_one` puts the tokens in row 0 of the batch (the other rows padding);
batch.py puts the calls of several generations, one per row, into one call.
The decoding logic is the same either way.
"""
from __future__ import annotations

import inspect
import time
from typing import Callable, NamedTuple

import numpy as np

from ..errors import SpecdecError
from .backends import Backend
from .metrics import GenerationResult, _Meter
from .sampling import SamplingParams, pick, verify

PAD_ID = 0

OnTokens = Callable[[list, list], None]


class Call(NamedTuple):
    """One row of a backend call: ``tokens`` at positions start.., padded to ``width``."""
    runner: "_Runner"
    tokens: list
    start: int
    width: int
    prefill: bool


class _Runner:
    """One generation's access to one backend: makes Calls and books their time."""

    def __init__(self, backend: Backend, role: str, meter: _Meter, cost=None, ids_map: Callable | None = None):
        self.b = backend
        self.role = role                        # the label its calls are timed under
        self.ids_map = ids_map                  # how this model reads token ids (see vocab.py)
        self.last_only = backend.role == "dlm"  # logits of the last valid token only
        self.meter = meter
        self.cost = cost
        self.taken = 0                          # tokens of the current prefill chunk the driver ran

    def book(self, width: int, dt: float, prefill: bool) -> None:
        self.meter.add_call(self.role, width, dt, prefill)
        if self.cost is not None and not prefill:
            self.cost(self.role, width, dt)

    def call(self, tokens, start: int, width: int, prefill: bool = False):
        """(generator) Run ``tokens`` at positions start.. in a call of ``width``; returns this row's logits."""
        if len(tokens) > width:
            raise AssertionError(f"{len(tokens)} tokens in a call of width {width}")
        m = self.meter
        m.host_seg += time.perf_counter() - m.resumed      # this generation's own work so far
        out = yield Call(self, list(tokens), start, width, prefill)
        m.resumed = time.perf_counter()
        return out

    def prefill(self, tokens, start: int = 0):
        """(generator) Run ``tokens`` in chunks of up to PL; returns the logits of the last token [V].

        The driver may run fewer tokens of a chunk than offered (a batch puts a
        prompt in the slots a narrower call has free, schedule.py): it sets
        ``taken`` to the number it ran, and the rest comes in the next chunk."""
        PL = self.b.prefill_len
        out, done, last = None, 0, 0
        while done < len(tokens):
            chunk = tokens[done:done + PL]
            self.taken = len(chunk)
            out = yield from self.call(chunk, start + done, PL, prefill=True)
            last = self.taken - 1
            done += self.taken
        return out[0] if self.last_only else out[last]


def rows_of(calls: list[tuple[int, Call]], B: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids / position_ids [B, width] with each (row, call) in its row, the rest padding (-1)."""
    ids = np.full((B, width), PAD_ID, np.int64)
    pos = np.full((B, width), -1, np.int64)
    for row, c in calls:
        n = len(c.tokens)
        ids[row, :n] = c.tokens
        pos[row, :n] = np.arange(c.start, c.start + n)
    m = calls[0][1].runner.ids_map
    return (m(ids) if m is not None else ids), pos


def run_one(co):
    """Drive one generation coroutine, its tokens in row 0 of each call; returns its result."""
    try:
        req = next(co)
        while True:
            r = req.runner
            ids, pos = rows_of([(0, req)], r.b.batch_size, req.width)
            t = time.perf_counter()
            out = r.b.run(ids, pos, check=False)
            r.book(req.width, time.perf_counter() - t, req.prefill)
            req = co.send(out[0])
    except StopIteration as e:
        return e.value


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


def _maybe(res):
    """(generator) A draft source's answer: a coroutine (a DLM makes calls) or a plain value."""
    if inspect.isgenerator(res):
        return (yield from res)
    return res


class _DlmDrafter:
    """The DLM as a draft source: its runner and how far its cache holds the sequence."""

    def __init__(self, gen: "_Generation", dlm: Backend):
        self.gen = gen
        self.vocab = gen.vocab
        self.r = _Runner(dlm, "dlm", gen.meter, gen.dec._note_cost, self.vocab.draft_ids if self.vocab else None)
        self.valid = 0

    def pick(self, logits) -> tuple[int, np.ndarray | None]:
        """A draft token and the distribution over the target's ids it was drawn from."""
        g = self.gen
        if self.vocab is None:
            return pick(logits, g.sampling, g.rng)
        d, q = pick(self.vocab.draft_logits(logits), g.sampling, g.rng)
        return d, self.vocab.draft_dist(q)

    def first(self, prompt):
        """(generator) Prefill; the first draft and its distribution."""
        q0 = yield from self.r.prefill(prompt)
        self.valid = len(prompt)
        return self.pick(q0)

    def draft(self, seq, q: int, n: int) -> tuple[list[int], list]:
        """(generator) ``n`` drafts for positions q.. (the DLM first catches up to seq[:q])."""
        drafts, dists = [], []
        if n <= 0:
            return drafts, dists
        pending, p0 = seq[self.valid:q], self.valid
        PL = self.r.b.prefill_len
        while len(pending) > 2:          # only after rounds without drafts
            step = PL if len(pending) > PL else 2
            yield from self.r.call(pending[:step], p0, step)
            pending, p0 = pending[step:], p0 + step
        logits = (yield from self.r.call(pending, p0, len(pending)))[0]
        self.valid = q
        for i in range(n):
            d, dist = self.pick(logits)
            drafts.append(d)
            dists.append(dist)
            if i < n - 1:
                logits = (yield from self.r.call([d], q + i, 1))[0]
                self.valid = q + i + 1
        return drafts, dists

    def rollback(self, valid: int) -> None:
        self.valid = min(self.valid, valid)


class _Generation:
    """One speculative generation: the state carried from round to round."""

    def __init__(self, dec, prompt: list[int], max_new_tokens: int, sampling: SamplingParams,
                 rng, on_tokens: OnTokens | None):
        self.dec = dec
        self.prompt = prompt
        self.max_new = max_new_tokens
        self.sampling, self.rng, self.on_tokens = sampling, rng, on_tokens
        self.meter = _Meter(max(dec.compiled_choices + [1]), dec.record_calls)
        self.vocab = dec.vocab
        self.tlm = _Runner(dec.tlm, "tlm", self.meter, dec._note_cost)
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

    def batch_alpha(self) -> float:
        """The acceptance estimate the width choice uses: this generation's own, or
        with other rows decoding beside it (batch.py), all rows' counts pooled. In a
        batch the rows share the DLM calls and the TLM call's width, so a row
        drafting less than the others saves nothing: they all draft alike."""
        live = self.dec.live
        if len(live) <= 1:
            return self.alpha()
        acc = sum(g.alpha_acc for g in live)
        chk = sum(g.alpha_chk for g in live)
        return (acc + 0.5) / (chk + 1.0)

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

    def run(self):
        """(generator) The whole generation; returns its GenerationResult."""
        if self.max_new == 0:
            return self.result("max_new_tokens")
        self.dec.live.add(self)
        try:
            stop = yield from self.start()
            while stop is None:
                stop = yield from self.round()
        finally:
            self.dec.live.discard(self)
        if self.first_accepted and self.meter.verify_calls == 0:
            self.meter.add_round(1, 1)        # generation ended with the accepted d1
        return self.result(stop)

    def start(self):
        """(generator) Prefill the TLM (and the DLM), then the first token from L0 and d1."""
        L0 = yield from self.tlm.prefill(self.prompt)
        first = (yield from _maybe(self.drafter.first(self.prompt))) if self.dec.fixed_k != 0 else None
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
        j = dec.choose_drafts(self.batch_alpha())
        if j != 0 or not dec.adaptive:
            self.zero_rounds, self.probe_every = 0, dec.PROBE_FIRST
            return j
        self.zero_rounds += 1
        if self.zero_rounds < self.probe_every:
            return 0
        self.zero_rounds = 0
        self.probe_every = min(2 * self.probe_every, dec.PROBE_MAX)
        return dec.choose_drafts(self.batch_alpha(), drafting=True)

    def round(self):
        """(generator) One round: draft, verify [t, d1..dn] at q-1.. padded to a compiled width, accept."""
        dec, meter = self.dec, self.meter
        meter.host_seg, meter.resumed, meter.round_callback = 0.0, time.perf_counter(), 0.0
        q = len(self.seq)                     # position of the next token
        remaining = min(self.max_new - len(self.out), self.CL - q)
        round1 = self.first_round and self.first_accepted
        if round1:                            # contract round 1: TLM width k, [d1..dk]
            j = (dec.fixed_k if dec.fixed_k is not None else dec.k0) - 1
        else:
            j = self.pick_width()
        kv = max(min(j, remaining - 1), 0)   # drafts worth making
        drafts, dists = (yield from _maybe(self.drafter.draft(self.seq, q, kv))) if kv else ([], [])
        kv = len(drafts)
        pending_t = self.seq[self.tlm_valid:q]
        if len(pending_t) != 1:
            raise AssertionError(f"TLM is {len(pending_t)} tokens behind")
        rows = yield from self.tlm.call(pending_t + drafts, self.tlm_valid, dec.width_for(kv + 1))
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
        if not round1:   # the loop's own work this round (calls and callbacks excluded): part of the cost
            dec._note_host(kv > 0, meter.host_seg + time.perf_counter() - meter.resumed - meter.round_callback)
        return stop


class _TargetGeneration:
    """One target-only generation (the baseline): prefill, then one token per call."""

    def __init__(self, dec, prompt: list[int], max_new_tokens: int, sampling: SamplingParams, rng,
                 on_tokens: OnTokens | None):
        self.dec, self.prompt, self.max_new = dec, prompt, max_new_tokens
        self.sampling, self.rng, self.on_tokens = sampling, rng, on_tokens
        self.meter = _Meter(0, dec.record_calls)
        self.tlm = _Runner(dec.tlm, "tlm", self.meter)

    def run(self):
        """(generator) The whole generation; returns its GenerationResult."""
        meter, CL = self.meter, self.dec.tlm.ctx_len
        seq, out = list(self.prompt), []
        stop = "max_new_tokens"
        logits = (yield from self.tlm.prefill(self.prompt)) if self.max_new > 0 else None
        while True:
            remaining = min(self.max_new - len(out), CL - len(seq))
            if remaining <= 0:
                stop = "max_new_tokens" if len(out) >= self.max_new else "ctx_len"
                break
            tok, _ = pick(logits, self.sampling, self.rng)
            out.append(tok)
            seq.append(tok)
            meter.first_token()
            if self.on_tokens:
                meter.callback(self.on_tokens, [tok], ["target"])
            if tok in self.dec.eos:
                stop = "eos"
                break
            if remaining == 1:
                stop = "max_new_tokens" if len(out) >= self.max_new else "ctx_len"
                break
            logits = (yield from self.tlm.call([tok], len(seq) - 1, self.dec.width))[0]
            meter.verify_calls += 1
            meter.round_tokens += 1
        meter.t_end = time.perf_counter()
        return GenerationResult(self.prompt, out, ["target"] * len(out), stop,
                                meter.metrics(len(out), speculative=False))
