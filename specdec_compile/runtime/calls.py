"""Backend calls as values: what a generation asks a model to run, and who runs it.

A generation (generation.py) and a model-backed draft source (drafts/) are
generators that *yield* a :class:`Call` (which model, which tokens at which
positions, which width) and are sent back their own row of the outputs. The
driver decides how calls are made: :func:`run_one` puts one generation's
tokens in row 0 (the other rows padding); batch.py puts the calls of several
generations, one per row, into one call. Each call is timed once, into the
model's :class:`~.costs.CallCosts` (read by the width policy and the batch
scheduler), and into the metrics of every generation that took part.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import numpy as np

from .backends import Backend
from .costs import CallCosts

PAD_ID = 0


class Call(NamedTuple):
    """One row of a backend call: ``tokens`` at positions start.., padded to ``width``."""
    runner: "Runner"
    tokens: list
    start: int
    width: int
    prefill: bool


class Runner:
    """One generation's access to one model: makes Calls and books their time.

    ``meter``: the generation's metrics (metrics._Meter); ``costs``: the model's
    shared call-cost tracker; ``ids_map``: how this model reads token ids
    (vocab.py), None when it reads them as they are."""

    def __init__(self, backend: Backend, role: str, meter, costs: CallCosts, ids_map: Callable | None = None):
        self.b = backend
        self.role = role                        # the label its calls are timed under
        self.ids_map = ids_map
        self.last_only = backend.role == "dlm"  # logits of the last valid token only
        self.meter = meter
        self.costs = costs
        self.taken = 0                          # tokens of the current prefill chunk the driver ran

    def book(self, width: int, dt: float, prefill: bool) -> None:
        """This generation took part in a call of ``width`` that took ``dt`` s."""
        self.meter.add_call(self.role, width, dt, prefill)

    def call(self, tokens, start: int, width: int, prefill: bool = False):
        """(generator) Run ``tokens`` at positions start.. in a call of ``width``; returns this row's logits."""
        if len(tokens) > width:
            raise AssertionError(f"{len(tokens)} tokens in a call of width {width}")
        m = self.meter
        m.host_seg += time.perf_counter() - m.resumed      # this generation's own work so far
        out = yield Call(self, list(tokens), start, width, prefill)
        m.resumed = time.perf_counter()
        return out

    def prefill(self, tokens, start: int = 0, on_chunk: Callable | None = None):
        """(generator) Run ``tokens`` in chunks of up to PL; returns the logits of the last token [V].

        The driver may run fewer tokens of a chunk than offered (a batch puts a
        prompt in the slots a narrower call has free, schedule.py): it sets
        ``taken`` to the number it ran, and the rest comes in the next chunk.
        ``on_chunk(start, tokens, rows)`` sees each chunk's output rows."""
        PL = self.b.prefill_len
        out, done, last = None, 0, 0
        while done < len(tokens):
            chunk = tokens[done:done + PL]
            self.taken = len(chunk)
            out = yield from self.call(chunk, start + done, PL, prefill=True)
            last = self.taken - 1
            if on_chunk is not None:
                on_chunk(start + done, chunk[:self.taken], out)
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
            dt = time.perf_counter() - t
            r.costs.add(req.width, dt)
            r.book(req.width, dt, req.prefill)
            req = co.send(out[0])
    except StopIteration as e:
        return e.value
