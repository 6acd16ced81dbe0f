"""Batches: one generation per row of a batch-B artifact, and continuous batching.

Every call carries all B rows. Each row is its own generation (generation.py),
with its own positions, its own drafts and accepted count per round, its own
stop. A call serves every row waiting on that model: the DLM first when any row
is drafting, else the TLM; the call's width is the widest any row asked for,
and a row with fewer tokens (fewer drafts, or a shorter catch-up) pads the rest
of its row with position -1. Rows waiting on the other model, and empty rows,
are all padding in that call: the contract makes such a row a no-op.

More prompts than rows: when a row's generation ends, the next waiting prompt
is prefilled into that row and decoding goes on. Its prompt rides in the calls
the other rows make on that model: the call's width is chosen (schedule.py) to
lose the least row-time per prompt token, from the call times measured so far,
so it is usually the decoding width (the prompt fills slots that would be
padding) and a PL-wide call only when few rows decode. While every row is still
prefilling (the start), the TLM's prefill calls go first, so all rows reach
decoding together. Nothing is reset between prompts:
a new prompt's prefill rewrites positions 0..n-1 of its row and every later
position is written before it is attended to. No batch_index input is needed.

An --interface qeff model with continuous batching (contract section 7) has no
full-width prefill: a new prompt's chunk runs alone at batch 1 into its cache
row (``batch_index``), and the decoding rows wait for the next call, which runs
every row. At prefill length 1 its prefill is the seq_len-1 call of every row
(calls.prefill_alone), which runs as above. A plain --interface qeff TLM runs as above, but a call holding a
verifying row never runs at the prefill width (that specialization keeps one
logits column).
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from .calls import exclusive, prefill_alone, row_of, run_rows
from .generation import check_prompt
from .hf_args import check_max_new_tokens
from .sampling import Noise, SamplingParams
from .schedule import choose_width


class BatchEngine:
    """Runs a decoder (SpecDecoder or TargetOnlyDecoder) over many prompts, B at a time."""

    def __init__(self, decoder):
        self.dec = decoder
        self.B = decoder.tlm.batch_size
        self.wall_s = 0.0           # wall time of the last stream(), prefill included
        self.calls = 0

    def check_prompts(self, prompts, max_new_tokens: int) -> list[list[int]]:
        """Every prompt, checked before anything runs; a bad one is named by its number
        (``max_new_tokens`` first, as generate checks it: hf_args.check_max_new_tokens)."""
        from ..errors import SpecdecError
        max_new_tokens = check_max_new_tokens(max_new_tokens)
        out = []
        for i, p in enumerate(prompts):
            try:
                out.append(check_prompt(p, self.dec.tlm, max_new_tokens))
            except SpecdecError as e:
                raise SpecdecError(f"prompt {i + 1}: {e}" if len(prompts) > 1 else str(e)) from None
        return out

    def stream(self, prompts, *, max_new_tokens: int = 64, sampling: SamplingParams | None = None, rng=None,
               on_tokens=None, stop=None):
        """Yields (index, GenerationResult) as generations end. ``on_tokens(index, ids,
        sources)`` streams each row's tokens as they are accepted; ``stop``: stop strings
        (streaming.StopStrings), every row's own. ``max_new_tokens`` is checked at the call, as
        generate checks it (an integer >= 0, else one line), before the generator starts."""
        return self._locked(prompts, check_max_new_tokens(max_new_tokens), sampling, rng, on_tokens, stop)

    def _locked(self, prompts, max_new_tokens, sampling, rng, on_tokens, stop):
        with exclusive(self.dec.backends()):
            yield from self._stream(prompts, max_new_tokens, sampling, rng, on_tokens, stop)

    def _stream(self, prompts, max_new_tokens, sampling, rng, on_tokens, stop):
        sampling = sampling or SamplingParams()
        waiting = deque(enumerate(self.check_prompts(prompts, max_new_tokens)))
        # prompt i draws from the noise keyed by (seed, i, position): the same text
        # whatever row it runs in, whenever, and beside whichever others
        seed = None if sampling.greedy else sampling.run_seed(rng)
        for b in self.dec.backends():
            b.reset()
        t0 = time.perf_counter()
        slots: list[list | None] = [None] * self.B     # [index, coroutine, pending call]
        done = []

        def start(row):
            while slots[row] is None and waiting:
                i, p = waiting.popleft()
                cb = (lambda ids, src, i=i: on_tokens(i, ids, src)) if on_tokens else None
                co = self.dec.coroutine(p, max_new_tokens, sampling, None if seed is None else Noise(seed, i), cb,
                                       stop=stop)
                try:
                    slots[row] = [i, co, next(co)]
                except StopIteration as e:         # nothing to run (max_new_tokens 0)
                    done.append((i, e.value))

        for r in range(self.B):
            start(r)
        yield from self._flush(done)
        while any(slots):
            for row in self._step(slots, done):
                start(row)
            self.wall_s = time.perf_counter() - t0
            yield from self._flush(done)
        self.wall_s = time.perf_counter() - t0

    @staticmethod
    def _flush(done):
        while done:
            yield done.pop(0)

    def _group(self, slots) -> list:
        """The rows of the next call: while every active row is still prefilling, the
        TLM's prefill rows (so a batch's prompts go through both models in step);
        else every row waiting on the DLM when any row drafts, else the TLM's rows."""
        pending = [(r, s[2]) for r, s in enumerate(slots) if s is not None]
        if all(c.prefill for _, c in pending):
            return [(r, c) for r, c in pending if c.runner.role == "tlm"] or pending
        return [(r, c) for r, c in pending if c.runner.role == "dlm"] or pending

    def _shape(self, group) -> tuple[int, list]:
        """The call's width (schedule.py) and each row's call, prefill chunks cut to it."""
        backend = group[0][1].runner.b
        dec = [c.width for _, c in group if not c.prefill]
        pre = [len(c.tokens) for _, c in group if c.prefill]
        widths = backend.seq_lens
        if dec and backend.artifact.qeff and backend.role == "tlm":
            # an --interface qeff TLM's prefill specialization keeps one logits column (Cloud AI 100):
            # a call that verifies runs at a decode width (contract section 7)
            widths = [w for w in widths if w != backend.prefill_len] or widths
        width = choose_width(widths, dec, pre, group[0][1].runner.costs)
        rows = []
        for r, c in group:
            if c.prefill:
                c = c._replace(tokens=c.tokens[:width])
                c.runner.taken = len(c.tokens)
            rows.append((r, c))
        return width, rows

    def _step(self, slots, done) -> list[int]:
        """One call for the rows waiting on one model; returns the rows that finished."""
        group = self._group(slots)
        backend = group[0][1].runner.b
        prefill = [(r, c) for r, c in group if c.prefill]
        if prefill and prefill_alone(backend):
            # --interface qeff: one prompt chunk at batch 1 into its cache row (batch_index); the
            # decoding rows wait for the next call, which runs every row (contract section 7)
            (r, c), width = prefill[0], backend.prefill_len
            c = c._replace(tokens=c.tokens[:width])
            c.runner.taken = len(c.tokens)
            out, dt = run_rows(backend, [(0, c)], 1, width, cache_rows=[r])
            out = {n: _at_row(a, r, self.B) for n, a in out.items()}
            group = [(r, c)]
        else:
            width, group = self._shape(group)
            out, dt = run_rows(backend, group, self.B, width)
            group[0][1].runner.costs.add(width, dt)
        self.calls += 1
        freed = []
        for r, c in group:
            c.runner.book(width, dt, c.prefill)
            s = slots[r]
            try:
                s[2] = s[1].send(row_of(out, r))
            except StopIteration as e:
                done.append((s[0], e.value))
                slots[r] = None
                freed.append(r)
        return freed


def _at_row(a: np.ndarray, row: int, B: int) -> np.ndarray:
    """A batch-1 output placed in row ``row`` of B (what ``row_of`` reads)."""
    out = np.zeros((B, *a.shape[1:]), a.dtype)
    out[row] = a[0]
    return out
