"""Backend calls as values: what a generation asks a model to run, and who runs it.

A generation (generation.py) and a model-backed draft source (drafts/) are
generators that *yield* a :class:`Call` (which model, which tokens at which
positions, which width) and are sent back their own row of the outputs. The
driver decides how calls are made: :func:`run_one` puts one generation's
tokens in row 0 (the other rows padding); batch.py puts the calls of several
generations, one per row, into one call. Each call is timed once, into the
model's :class:`~.costs.CallCosts` (read by the width policy and the batch
scheduler), and into the metrics of every generation that took part.

Extra tensors (a feature draft's ``hidden_states`` input, a TLM's
``hidden_states`` output, contract section 2) ride along: a Call may carry
``inputs`` ({name: [len(tokens), width]}, the rest of its row zeros), and the
driver sends each generation back ``(logits rows, {name: its rows of every
extra output})``; :meth:`Runner.call` returns the logits and keeps the extras
in ``runner.outputs``.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, NamedTuple

import numpy as np

from ..contract import LOGITS
from ..errors import SpecdecError
from .backends import Backend
from .costs import CallCosts

PAD_ID = 0
#: the attribute that marks a backend as serving a live generation (``exclusive``)
LIVE = "_specdec_live_generation"
_CLAIM = threading.Lock()


class Call(NamedTuple):
    """One row of a backend call: ``tokens`` at positions start.., padded to ``width``."""
    runner: "Runner"
    tokens: list
    start: int
    width: int
    prefill: bool
    inputs: dict | None = None      # extra inputs: name -> [len(tokens), width] rows


class Runner:
    """One generation's access to one model: makes Calls and books their time.

    ``meter``: the generation's metrics (metrics.Meter); ``costs``: the model's
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
        self.outputs: dict = {}                 # this row of the last call's extra outputs (name -> [width, ...])

    def book(self, width: int, dt: float, prefill: bool) -> None:
        """This generation took part in a call of ``width`` that took ``dt`` s."""
        self.meter.add_call(self.role, width, dt, prefill)

    def call(self, tokens, start: int, width: int, prefill: bool = False, inputs: dict | None = None):
        """(generator) Run ``tokens`` at positions start.. in a call of ``width``; returns this row's
        logits (its extra outputs: ``self.outputs``). ``inputs``: extra inputs, one row per token."""
        if len(tokens) > width:
            raise AssertionError(f"{len(tokens)} tokens in a call of width {width}")
        m = self.meter
        m.host_seg += time.perf_counter() - m.resumed      # this generation's own work so far
        out, self.outputs = yield Call(self, list(tokens), start, width, prefill, inputs)
        m.resumed = time.perf_counter()
        return out

    def prefill(self, tokens, start: int = 0, on_chunk: Callable | None = None, inputs: dict | None = None):
        """(generator) Run ``tokens`` in chunks of up to PL; returns the logits of the last token [V]
        (``self.outputs``: the last chunk's extra outputs, its last token in row ``self.taken - 1``).

        The driver may run fewer tokens of a chunk than offered (a batch puts a
        prompt in the slots a narrower call has free, schedule.py): it sets
        ``taken`` to the number it ran, and the rest comes in the next chunk.
        ``on_chunk(start, tokens, rows, outputs)`` sees each chunk's output rows.
        ``inputs``: extra inputs, one row per token (cut into the chunks alike)."""
        PL = self.b.prefill_len
        out, done, last = None, 0, 0
        while done < len(tokens):
            chunk = tokens[done:done + PL]
            self.taken = len(chunk)
            part = None if inputs is None else {n: a[done:done + PL] for n, a in inputs.items()}
            out = yield from self.call(chunk, start + done, PL, prefill=True, inputs=part)
            last = self.taken - 1
            if on_chunk is not None:
                on_chunk(start + done, chunk[:self.taken], out, self.outputs)
            done += self.taken
        return out[0] if self.last_only else out[last]


def check_backend(b, what: str = "tlm") -> None:
    """``b`` is a backend (backends/base.py: an artifact, ``run_outputs``, ``reset``), not a path or None."""
    if not all(hasattr(b, a) for a in ("artifact", "run_outputs", "reset", "seq_lens")):
        raise SpecdecError(f"the {what} must be a backend (OrtBackend(DIR), open_backend(DIR, ...)), "
                           f"got {type(b).__name__}")


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


def extra_rows(calls: list[tuple[int, Call]], backend: Backend, B: int, width: int) -> dict:
    """The backend's extra inputs [B, width, w] with each (row, call)'s rows in place, the rest zeros."""
    out = {}
    for name, w in backend.extra_inputs.items():
        a = np.zeros((B, width, w), np.float32)
        for row, c in calls:
            if c.inputs is not None and name in c.inputs:
                n = len(c.tokens)
                a[row, :n] = c.inputs[name][:n]
        out[name] = a
    return out


def run_rows(backend: Backend, calls: list[tuple[int, Call]], B: int, width: int, cache_rows=None):
    """Run one call holding ``calls`` (row, Call); returns (its outputs by name, seconds).
    ``cache_rows``: the batch_index of the call's B rows (continuous batching, --full-batch-size)."""
    ids, pos = rows_of(calls, B, width)
    extra = extra_rows(calls, backend, B, width)
    t = time.perf_counter()
    out = backend.run_outputs(ids, pos, check=False, inputs=extra, rows=cache_rows)
    return out, time.perf_counter() - t


def prefill_alone(backend: Backend) -> bool:
    """Whether a prompt chunk runs alone at batch 1 into its cache row (``batch_index``): an
    --interface qeff model with continuous batching, unless its prefill length is 1, where the
    prefill specialization is the decode call of every row (contract section 7)."""
    return bool(backend.artifact.cache_rows) and backend.artifact.prefill_batch == 1


def row_of(out: dict, row: int):
    """What a generation is sent back: (its logits rows, {name: its rows of each extra output})."""
    return out[LOGITS][row], {n: a[row] for n, a in out.items() if n != LOGITS}


def steps(co):
    """(generator) Drive one generation coroutine, its tokens in row 0 of each call,
    yielding (None) after each call; returns its result (what ``run_one`` returns).
    A caller streaming text reads what ``on_tokens`` gathered at each step."""
    try:
        req = next(co)
        while True:
            r = req.runner
            if req.prefill and prefill_alone(r.b):   # contract section 7: a prompt at batch 1 into its row
                out, dt = run_rows(r.b, [(0, req)], 1, req.width, cache_rows=[0])
            else:
                out, dt = run_rows(r.b, [(0, req)], r.b.batch_size, req.width)
            r.costs.add(req.width, dt)
            r.book(req.width, dt, req.prefill)
            req = co.send(row_of(out, 0))
            yield
    except StopIteration as e:
        return e.value


def run_one(co):
    """Drive one generation coroutine, its tokens in row 0 of each call; returns its result."""
    g = steps(co)
    while True:
        try:
            next(g)
        except StopIteration as e:
            return e.value


@contextmanager
def exclusive(backends):
    """One live generation per model at a time. A backend keeps one sequence's cache (a batch
    artifact one per row, all driven by one engine), so a second generation started while a first
    is live (two ``stream()`` generators consumed alternately, or a ``generate`` from inside an
    ``on_tokens`` callback) would reset and overwrite the cache the first one reads. It is refused
    in one line instead; several prompts go through ``generate_many`` / ``stream([...])``."""
    backends = list(backends)
    with _CLAIM:    # check and mark at once: two threads cannot both pass
        busy = next((b for b in backends if getattr(b, LIVE, False)), None)
        if busy is not None:
            art = getattr(busy, "artifact", None)
            raise SpecdecError(f"{getattr(art, 'path', 'this model')}: another generation on this model is still "
                               f"live (an unfinished stream()?): finish or close() it first; several prompts go "
                               f"through one generate_many() or stream([...]) call")
        for b in backends:
            setattr(b, LIVE, True)
    try:
        yield
    finally:
        for b in backends:
            setattr(b, LIVE, False)
