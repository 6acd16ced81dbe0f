"""One generation as a coroutine of backend calls (calls.py): the decoding loop.

Each generation (speculative: :class:`SpecGeneration`; target-only:
:class:`TargetGeneration`) is a generator that *yields* a Call and is sent
back its own row of the logits; calls.run_one drives one in row 0, batch.py
several, one per row. The decoding logic is the same either way. The drafts
come from a draft source (drafts/), the number of drafts per round from the
width policy (policy.py), each token from sampling.py's position-keyed rule.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from ..errors import SpecdecError
from .backends import Backend
from .calls import Runner
from .drafts import DraftContext, TargetStep, answer
from .hf_args import check_max_new_tokens
from .metrics import GenerationResult, Meter
from .sampling import Noise, SamplingParams, choose, verify

OnTokens = Callable[[list, list], None]


def draft_ids(drafts, vocab: int | None) -> list[int]:
    """A draft source's proposal as Python ints: one that is no token id of the target (a float, a
    bool, a string, an id outside its vocabulary) is refused in one line, never sent to the target
    (a traceback there, or an id the target cannot hold)."""
    out = []
    for d in drafts:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise SpecdecError(f"a draft source proposed {str(d)[:40]!r} ({type(d).__name__}): drafts are "
                               f"token ids (integers)")
        if d < 0 or (vocab and d >= vocab):
            shown = d if abs(d) < 2 ** 63 else f"of {int(d).bit_length()} bits"
            raise SpecdecError(f"a draft source proposed the token id {shown}, outside the target's vocabulary "
                               f"[0, {vocab})" if vocab else f"a draft source proposed the token id {shown}")
        out.append(int(d))
    return out


def check_prompt(prompt_ids, backend: Backend, max_new_tokens: int) -> list[int]:
    """The prompt as a list of ids: refused in one line when empty, out of the vocabulary or too long
    for the context (with max_new_tokens >= 0)."""
    ids = [int(x) for x in prompt_ids]
    if not ids:
        raise SpecdecError("empty prompt: at least one token is needed")
    check_max_new_tokens(max_new_tokens)
    CL = backend.ctx_len
    if len(ids) >= CL:
        raise SpecdecError(f"the prompt has {len(ids)} tokens and does not fit: the context holds {CL} "
                           f"tokens and at least one must be left to generate")
    v = backend.vocab_size
    if min(ids) < 0 or (v and max(ids) >= v):      # a negative id is no id, whether the size is known or not
        raise SpecdecError(f"prompt token id out of range [0, {v})" if v else
                           f"prompt token id {min(ids)} is negative")
    return ids


class SpecGeneration:
    """One speculative generation: the state carried from round to round."""

    def __init__(self, dec, prompt: list[int], max_new_tokens: int, sampling: SamplingParams,
                 noise: Noise | None, on_tokens: OnTokens | None, stop=None):
        self.dec = dec
        self.stop = stop   # stop strings (streaming.StopStrings): .cut(ids, n_new) -> tokens kept or None
        self.policy = policy = dec.policy
        self.prompt = prompt
        self.max_new = max_new_tokens
        self.sampling, self.noise, self.on_tokens = sampling, noise, on_tokens
        self.meter = Meter(max(policy.compiled_choices + [1]), dec.record_calls)
        self.tlm = Runner(dec.tlm, "tlm", self.meter, policy.costs.calls("tlm"))
        ctx = DraftContext(sampling, noise, dec.tlm.vocab_size, runner=self._runner)
        self.drafter = dec.source.drafter(ctx)
        self.row = policy.row()
        self.CL = dec.tlm.ctx_len
        self.seq = list(prompt)
        self.out: list[int] = []
        self.sources: list[str] = []
        self.tlm_valid = len(prompt)   # the TLM cache holds seq[:tlm_valid]
        self.first_round = True
        self.first_accepted = False

    def _runner(self, backend: Backend, role: str, ids_map=None) -> Runner:
        """A runner for a draft model's calls, booked in this generation's metrics."""
        return Runner(backend, role, self.meter, self.policy.costs.calls(role), ids_map)

    def _verified(self, start: int, tokens, rows, outputs) -> None:
        n = len(tokens)
        self.drafter.verified(TargetStep(start, list(tokens), rows[:n], {k: v[:n] for k, v in outputs.items()}))

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
        keep = self.stop.cut(self.seq + tokens, len(tokens)) if self.stop is not None and tokens else None
        if keep is not None and not (reason == "eos" and keep == len(tokens)):   # an EOS token: "eos", always
            tokens, srcs, reason = tokens[:keep], srcs[:keep], "stop_string"
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
        self.policy.live.add(self.row)
        try:
            stop = yield from self.start()
            while stop is None:
                stop = yield from self.round()
        finally:
            self.policy.live.discard(self.row)
        self.drafter.finish(self.seq)
        if self.first_accepted and self.meter.verify_calls == 0:
            self.meter.add_round(1, 1)        # generation ended with the accepted d1
        return self.result(stop)

    def start(self):
        """(generator) Prefill the TLM (and the draft source), then the first token from L0 and d1."""
        n = len(self.prompt)
        L0 = yield from self.tlm.prefill(self.prompt, on_chunk=self._verified)
        d1 = (yield from answer(self.drafter.first(self.prompt))) if self.policy.fixed_k != 0 else None
        if d1 is None:                    # no first draft (n-gram: nothing matched; --k 0)
            return self.emit([choose(L0, self.sampling, self.noise, n)], ["target"])
        d1, = draft_ids([d1], self.dec.tlm.vocab_size)
        a, tok = verify([d1], L0[None], n, self.sampling, self.noise, bonus=False)
        self.first_accepted = a == 1
        self.policy.note_acceptance(self.row, a, 1)
        if not self.first_accepted:
            self.meter.add_round(1, 0)    # a round that the prefill logits alone decided
            return self.emit([tok], ["target"])
        return self.emit([d1], ["draft"])

    def round(self):
        """(generator) One round: draft, verify [t, d1..dn] at q-1.. padded to a compiled width, accept."""
        policy, meter = self.policy, self.meter
        meter.host_seg, meter.resumed, meter.round_callback = 0.0, time.perf_counter(), 0.0
        q = len(self.seq)                     # position of the next token
        remaining = min(self.max_new - len(self.out), self.CL - q)
        round1 = self.first_round and self.first_accepted
        share = getattr(self.drafter, "model_share", None)            # a hybrid: lookup drafts cost no call
        if share is not None:
            self.row.draft_cost_share = share()
        j = policy.round1_drafts() if round1 else policy.choose(self.row)   # round 1: TLM width k, [d1..dk]
        kv = max(min(j, remaining - 1), 0)   # drafts worth making
        drafts = list((yield from answer(self.drafter.draft(self.seq, q, kv))) if kv else [])[:kv]
        drafts = draft_ids(drafts, self.dec.tlm.vocab_size)
        kv = len(drafts)
        start = self.tlm_valid
        pending_t = self.seq[start:q]
        if len(pending_t) != 1:
            raise AssertionError(f"TLM is {len(pending_t)} tokens behind")
        rows = yield from self.tlm.call(pending_t + drafts, start, policy.width_for(kv + 1))
        meter.verify_calls += 1
        meter.widths[kv] = meter.widths.get(kv, 0) + 1
        a, tok = verify(drafts, rows[: kv + 1], q, self.sampling, self.noise)
        if round1:
            meter.add_round(kv + 1, a + 1)   # d1 belongs to round 1
        elif kv:
            meter.add_round(kv, a)           # (a round without drafts is no round of drafting)
        if kv:
            policy.note_acceptance(self.row, a, kv)
        self._verified(start, pending_t + drafts[:a], rows, self.tlm.outputs)
        self.tlm_valid = q + a
        self.drafter.rollback(q + a)
        n_before = len(self.out)
        stop = self.emit(drafts[:a] + [tok], ["draft"] * a + ["target"])
        # tokens this TLM call produced (round 1 also confirmed d1)
        meter.round_tokens += len(self.out) - n_before + (1 if round1 else 0)
        self.first_round = False
        if not round1:   # the loop's own work this round (calls and callbacks excluded): part of the cost
            policy.costs.note_host(kv > 0, meter.host_seg + time.perf_counter() - meter.resumed
                                   - meter.round_callback)
        return stop


class TargetGeneration:
    """One target-only generation (the baseline): prefill, then one token per call."""

    def __init__(self, dec, prompt: list[int], max_new_tokens: int, sampling: SamplingParams,
                 noise: Noise | None, on_tokens: OnTokens | None, stop=None):
        self.dec, self.prompt, self.max_new, self.stop = dec, prompt, max_new_tokens, stop
        self.sampling, self.noise, self.on_tokens = sampling, noise, on_tokens
        self.meter = Meter(0, dec.record_calls)
        self.tlm = Runner(dec.tlm, "tlm", self.meter, dec.costs.calls("tlm"))

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
            tok = choose(logits, self.sampling, self.noise, len(seq))
            out.append(tok)
            seq.append(tok)
            meter.first_token()
            if self.on_tokens:
                meter.callback(self.on_tokens, [tok], ["target"])
            if tok in self.dec.eos:
                stop = "eos"
                break
            if self.stop is not None and self.stop.cut(seq, 1) is not None:
                stop = "stop_string"
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
