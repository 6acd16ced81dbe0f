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

Target-only decoding (the baseline) runs the TLM alone: prefill, then one token
per call at the TLM's smallest compiled width, the token in slot 0 and the
rest padding (-1); the logits of the valid token are used. The TLM artifact has
no seq_len 1, and padding keeps it to the same compiled graph; the cost of the
padded width is part of what the baseline measures.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import SpecdecError
from .artifact import check_pair
from .backends import Backend
from .sampling import SamplingParams, pick, verify

PAD_ID = 0

OnTokens = Callable[[list, list], None]


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int]          # includes the EOS that ended the text
    sources: list[str]                # per generated token: "draft" (accepted draft) or "target"
    stop_reason: str                  # "eos" | "max_new_tokens" | "ctx_len"
    metrics: dict = field(default_factory=dict)
    text: str | None = None

    def to_json(self) -> dict:
        d = {"prompt_ids": list(self.prompt_ids), "generated_ids": list(self.generated_ids),
             "text": self.text, "metrics": self.metrics}
        return d


class _Meter:
    """Per-generation counters and timings."""

    def __init__(self, max_drafts: int, record_calls: bool):
        self.t0 = time.perf_counter()
        self.t_first = None
        self.t_end = None
        self.time = {"dlm": 0.0, "tlm": 0.0}
        self.prefill_time = {"dlm": 0.0, "tlm": 0.0}
        self.by_width = {"dlm": {}, "tlm": {}}
        self.calls = {"dlm": 0, "tlm": 0}
        self.verify_calls = 0
        self.round_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.hist = [0] * (max_drafts + 1)
        self.widths = {}
        self.callback_time = 0.0
        self.log = [] if record_calls else None

    def add_call(self, role: str, width: int, dt: float, prefill: bool):
        self.time[role] += dt
        self.calls[role] += 1
        if prefill:
            self.prefill_time[role] += dt
        c = self.by_width[role].setdefault(width, [0, 0.0])
        c[0] += 1
        c[1] += dt
        if self.log is not None:
            self.log.append([role, width, round(dt, 9)])

    def add_round(self, drafted: int, accepted: int):
        self.drafted += drafted
        self.accepted += accepted
        while accepted >= len(self.hist):
            self.hist.append(0)
        self.hist[accepted] += 1

    def callback(self, fn, tokens, sources):
        t = time.perf_counter()
        fn(tokens, sources)
        self.callback_time += time.perf_counter() - t

    def first_token(self):
        if self.t_first is None:
            self.t_first = time.perf_counter()

    def metrics(self, new_tokens: int, speculative: bool) -> dict:
        end = self.t_end or time.perf_counter()
        total = end - self.t0
        first = self.t_first or end
        ttft = first - self.t0
        dec_time = end - first
        dec_tokens = max(new_tokens - 1, 0)
        m = {
            "new_tokens": new_tokens,
            "ttft_s": ttft,
            "decode_tokens_per_s": (dec_tokens / dec_time) if dec_tokens and dec_time > 0 else None,
            "acceptance_rate": (self.accepted / self.drafted) if self.drafted else None,
            "mean_tokens_per_tlm_call": (self.round_tokens / self.verify_calls) if self.verify_calls else None,
            "acceptance_histogram": list(self.hist) if speculative else [],
            "dlm_time_s": self.time["dlm"],
            "tlm_time_s": self.time["tlm"],
            # host: the loop itself (sampling, bookkeeping, input building); the
            # caller's on_tokens callback (printing) is counted apart
            "host_time_s": max(total - self.time["dlm"] - self.time["tlm"] - self.callback_time, 0.0),
            "callback_time_s": self.callback_time,
            "total_time_s": total,
            "prefill_time_s": {"dlm": self.prefill_time["dlm"], "tlm": self.prefill_time["tlm"]},
            "dlm_calls": self.calls["dlm"],
            "tlm_calls": self.calls["tlm"],
            "tlm_verify_calls": self.verify_calls,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            # per role and seq_len: [calls, seconds]; enough for a cost model
            "call_time_by_width": {r: {str(w): [c, t] for w, (c, t) in sorted(d.items())}
                                   for r, d in self.by_width.items()},
            "verify_drafts_histogram": {str(j): c for j, c in sorted(self.widths.items())},
        }
        if self.log is not None:
            m["calls"] = self.log
        return m


def aggregate_metrics(results: list[GenerationResult]) -> dict:
    """Metrics over several generations (sums, and rates recomputed from the sums)."""
    ms = [r.metrics for r in results]
    if not ms:
        return {}
    tot = lambda k: sum((m.get(k) or 0) for m in ms)  # noqa: E731
    new = tot("new_tokens")
    dec_tokens = sum(max(m["new_tokens"] - 1, 0) for m in ms)
    dec_time = sum(m["total_time_s"] - m["ttft_s"] for m in ms)
    hl = max(len(m["acceptance_histogram"]) for m in ms)
    hist = [sum(m["acceptance_histogram"][i] if i < len(m["acceptance_histogram"]) else 0 for m in ms)
            for i in range(hl)]
    drafted, accepted, vcalls = tot("drafted_tokens"), tot("accepted_tokens"), tot("tlm_verify_calls")
    round_tokens = sum((m["mean_tokens_per_tlm_call"] or 0) * m["tlm_verify_calls"] for m in ms)
    return {
        "prompts": len(ms),
        "new_tokens": new,
        "ttft_s": tot("ttft_s") / len(ms),
        "decode_tokens_per_s": dec_tokens / dec_time if dec_tokens and dec_time > 0 else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_tokens_per_tlm_call": round_tokens / vcalls if vcalls else None,
        "acceptance_histogram": hist,
        "dlm_time_s": tot("dlm_time_s"),
        "tlm_time_s": tot("tlm_time_s"),
        "host_time_s": tot("host_time_s"),
        "total_time_s": tot("total_time_s"),
        "dlm_calls": tot("dlm_calls"),
        "tlm_calls": tot("tlm_calls"),
        "tlm_verify_calls": vcalls,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
    }


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

    def __init__(self, backend: Backend, role: str):
        self.b = backend
        self.role = role                        # the label its calls are timed under
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
    """

    def __init__(self, tlm: Backend, dlm: Backend, *, eos_token_id=None, k: int | None = None,
                 adaptive: bool | None = None, record_calls: bool = False):
        check_pair(tlm.artifact, dlm.artifact)
        if tlm.vocab_size and dlm.vocab_size and tlm.vocab_size != dlm.vocab_size:
            raise SpecdecError(f"TLM and DLM have different vocabularies: {tlm.vocab_size} vs "
                               f"{dlm.vocab_size} tokens; speculative decoding needs one shared tokenizer")
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
        meter = _Meter(max(self.choices), self.record_calls)
        tlm, dlm = _Runner(self.tlm, "tlm"), _Runner(self.dlm, "dlm")
        tlm.meter = dlm.meter = meter
        tlm.cost = dlm.cost = self._note_cost

        self.tlm.reset()
        self.dlm.reset()
        CL = self.tlm.ctx_len
        eos = self.eos
        n = len(prompt)
        seq = list(prompt)
        out: list[int] = []
        sources: list[str] = []
        if max_new_tokens == 0:
            meter.t_end = time.perf_counter()
            return GenerationResult(prompt, [], [], "max_new_tokens", meter.metrics(0, True))

        def emit(tokens, srcs) -> str | None:
            """Append tokens (cut at EOS and at the budget); returns a stop reason or None."""
            budget = min(max_new_tokens - len(out), CL - len(seq))
            tokens, srcs = list(tokens[:budget]), list(srcs[:budget])
            reason = None
            hits = [i for i, t in enumerate(tokens) if t in eos]
            if hits:
                cut = hits[0] + 1
                tokens, srcs = tokens[:cut], srcs[:cut]
                reason = "eos"
            out.extend(tokens)
            sources.extend(srcs)
            seq.extend(tokens)
            if tokens:
                meter.first_token()
                if on_tokens:
                    meter.callback(on_tokens, tokens, srcs)
            if reason is None and len(out) >= max_new_tokens:
                reason = "max_new_tokens"
            if reason is None and len(seq) >= CL:
                reason = "ctx_len"
            return reason

        # prefill (both models), then the first token from L0 and d1
        L0 = tlm.prefill(prompt)
        q0 = dlm.prefill(prompt)
        d1, q1 = pick(q0, sampling, rng)
        a, tok = verify([d1], [q1], L0[None], sampling, rng, bonus=False)
        first_accepted = a == 1
        if not first_accepted:
            meter.add_round(1, 0)    # a round that the prefill logits alone decided
        stop = emit([d1], ["draft"]) if first_accepted else emit([tok], ["target"])
        tlm_valid = n            # the TLM cache holds seq[:tlm_valid]
        dlm_valid = n            # the DLM cache holds seq[:dlm_valid]
        first_round = True
        alpha_acc, alpha_chk = a, 1

        while stop is None:
            q = len(seq)                     # position of the next token
            remaining = min(max_new_tokens - len(out), CL - q)
            if first_round and first_accepted:
                j = self.k0 - 1                  # contract round 1: TLM width k, [d1..dk]
            else:
                j = self.choose_drafts((alpha_acc + 1.0) / (alpha_chk + 2.0))
            kv = max(min(j, remaining - 1), 0)   # drafts worth making

            # draft
            drafts, dists = [], []
            if kv > 0:
                pending = seq[dlm_valid:q]
                p0 = dlm_valid
                while len(pending) > 2:          # only after a round without drafts
                    dlm.call(pending[:2], p0, 2)
                    pending, p0 = pending[2:], p0 + 2
                logits = dlm.call(pending, p0, len(pending))[0]
                dlm_valid = q
                for i in range(kv):
                    d, dist = pick(logits, sampling, rng)
                    drafts.append(d)
                    dists.append(dist)
                    if i < kv - 1:
                        logits = dlm.call([d], q + i, 1)[0]
                        dlm_valid = q + i + 1

            # verify: [t, d1..dkv] at q-1.., padded to width j+1
            pending_t = seq[tlm_valid:q]
            if len(pending_t) != 1:
                raise AssertionError(f"TLM is {len(pending_t)} tokens behind")
            rows = tlm.call(pending_t + drafts, tlm_valid, j + 1)
            meter.verify_calls += 1
            meter.widths[j] = meter.widths.get(j, 0) + 1
            a, tok = verify(drafts, dists, rows[: kv + 1], sampling, rng)
            if first_round and first_accepted:
                meter.add_round(kv + 1, a + 1)   # d1 belongs to round 1
            elif kv:
                meter.add_round(kv, a)           # (a last round without drafts is no round of drafting)
            alpha_acc += a
            alpha_chk += a + (1 if a < kv else 0)
            tlm_valid = q + a
            dlm_valid = min(dlm_valid, q + a)
            n_before = len(out)
            stop = emit(drafts[:a] + [tok], ["draft"] * a + ["target"])
            # tokens this TLM call produced (round 1 also confirmed d1)
            meter.round_tokens += len(out) - n_before + (1 if first_round and first_accepted else 0)
            first_round = False

        if first_accepted and meter.verify_calls == 0:
            meter.add_round(1, 1)        # generation ended with the accepted d1
        meter.t_end = time.perf_counter()
        return GenerationResult(prompt, out, sources, stop, meter.metrics(len(out), speculative=True))


def generate(tlm: Backend, dlm: Backend | None, prompt_ids, *, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
             eos_token_id=None, k: int | None = None,
             on_tokens: OnTokens | None = None) -> GenerationResult:
    """One generation: speculative when ``dlm`` is given, target-only otherwise."""
    sp = SamplingParams(temperature, top_k, top_p, seed)
    if dlm is None:
        dec = TargetOnlyDecoder(tlm, eos_token_id=eos_token_id)
    else:
        dec = SpecDecoder(tlm, dlm, eos_token_id=eos_token_id, k=k)
    return dec.generate(prompt_ids, max_new_tokens=max_new_tokens, sampling=sp, on_tokens=on_tokens)
