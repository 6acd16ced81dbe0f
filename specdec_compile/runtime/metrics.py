"""Generation results and their metrics: counters and timings per generation
(:class:`GenerationMetrics`), and over several (:class:`RunMetrics`). Both are
typed records whose JSON keeps the keys documented in docs/runtime.md; each can
still be read like a dict (``m["new_tokens"]``, ``m.get(...)``). The decode rate
is computed in one place, :func:`decode_rate`."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from .costs import CallCosts


def decode_rate(tokens: float, seconds: float) -> float | None:
    """Tokens per second; None when either is empty."""
    return tokens / seconds if tokens and seconds > 0 else None


def busy_time_s(m) -> float:
    """A generation's time without the caller's on_tokens callbacks (printing)."""
    return m["total_time_s"] - (m.get("callback_time_s") or 0.0)


def decode_time_s(m) -> float:
    """A generation's decode time: after the first token, callbacks excluded (0 without a token)."""
    return 0.0 if m["ttft_s"] is None else busy_time_s(m) - m["ttft_s"]


def decode_rate_of(m) -> float | None:
    """Decode tokens/s of one generation's metrics (a GenerationMetrics or its JSON):
    the tokens after the first over :func:`decode_time_s`. The one definition the
    runtime, the demo and the benchmarks report."""
    return decode_rate(max(m["new_tokens"] - 1, 0), decode_time_s(m))


class _Record:
    """Dict-style reading of a metrics record: ``m[key]``, ``m.get(key)``, ``key in m``."""

    def to_json(self) -> dict:
        d = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.metadata.get("optional"):
                continue
            d[f.name] = v
        for name in self._derived:
            d[name] = getattr(self, name)
        return _order(d, self._order)

    def __getitem__(self, key):
        if key in self._derived or key in {f.name for f in dataclasses.fields(self)}:
            v = getattr(self, key)
            if v is None and key not in self._derived and self._optional(key):
                raise KeyError(key)
            return v
        raise KeyError(key)

    def get(self, key, default=None):
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def keys(self):
        return self.to_json().keys()

    def _optional(self, key) -> bool:
        return any(f.name == key and f.metadata.get("optional") for f in dataclasses.fields(self))

    @classmethod
    def from_json(cls, d: dict):
        """The record of a JSON object written by ``to_json`` (derived keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


_MISSING = object()


def _order(d: dict, order: tuple) -> dict:
    return {k: d[k] for k in order if k in d} | {k: v for k, v in d.items() if k not in order}


def _opt():
    return field(default=None, metadata={"optional": True})


@dataclass
class GenerationMetrics(_Record):
    """Counters and timings of one generation."""
    new_tokens: int
    ttft_s: float | None               # None when no token was generated (max_new_tokens=0)
    acceptance_rate: float | None
    mean_tokens_per_tlm_call: float | None
    acceptance_histogram: list
    dlm_time_s: float
    tlm_time_s: float
    host_time_s: float                 # the loop itself (sampling, bookkeeping, inputs); callbacks apart
    callback_time_s: float
    total_time_s: float
    prefill_time_s: dict
    dlm_calls: int
    tlm_calls: int
    tlm_verify_calls: int
    drafted_tokens: int
    accepted_tokens: int
    call_time_by_width: dict           # per role and seq_len: [calls, seconds]; enough for a cost model
    verify_drafts_histogram: dict
    calls: list | None = _opt()        # every call, when recorded
    stop_reason: str | None = _opt()   # set by specdec-run

    _derived = ("decode_tokens_per_s",)
    _order = ("new_tokens", "ttft_s", "decode_tokens_per_s")

    @property
    def decode_tokens_per_s(self) -> float | None:
        return decode_rate_of(self)


@dataclass
class RunMetrics(_Record):
    """Metrics over several generations: sums, and rates recomputed from the sums."""
    prompts: int
    new_tokens: int
    ttft_s: float | None               # the mean over the prompts that generated a token (None: none did)
    decode_tokens: int
    decode_time_s: float
    acceptance_rate: float | None
    mean_tokens_per_tlm_call: float | None
    acceptance_histogram: list
    dlm_time_s: float
    tlm_time_s: float
    host_time_s: float
    total_time_s: float
    dlm_calls: int
    tlm_calls: int
    tlm_verify_calls: int
    drafted_tokens: int
    accepted_tokens: int
    batch_size: int | None = _opt()    # set by specdec-run
    tokens_per_s: float | None = _opt()   # all prompts over wall time, set by specdec-run

    _derived = ("decode_tokens_per_s",)
    _order = ("prompts", "new_tokens", "ttft_s", "decode_tokens_per_s")

    @property
    def decode_tokens_per_s(self) -> float | None:
        return decode_rate(self.decode_tokens, self.decode_time_s)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int]          # includes the EOS that ended the text
    sources: list[str]                # per generated token: "draft" (accepted draft) or "target"
    stop_reason: str                  # "eos" | "max_new_tokens" | "ctx_len" | "stop_string"
    metrics: GenerationMetrics | None = None
    text: str | None = None

    def to_json(self) -> dict:
        return {"prompt_ids": list(self.prompt_ids), "generated_ids": list(self.generated_ids),
                "text": self.text, "metrics": self.metrics.to_json() if self.metrics is not None else {}}


class Meter:
    """Per-generation counters and timings."""

    ROLES = ("dlm", "tlm")

    def __init__(self, max_drafts: int, record_calls: bool):
        self.t0 = time.perf_counter()
        self.t_first = None
        self.t_end = None
        self.by_width: dict[str, CallCosts] = {r: CallCosts() for r in self.ROLES}   # every call, prefill too
        self.prefill = {r: CallCosts() for r in self.ROLES}
        self.verify_calls = 0
        self.round_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.hist = [0] * (max_drafts + 1)
        self.widths = {}
        self.callback_time = 0.0
        self.log = [] if record_calls else None
        self.host_seg, self.resumed = 0.0, self.t0      # host work between calls (generation.py)
        self.round_callback = 0.0

    def add_call(self, role: str, width: int, dt: float, prefill: bool):
        self.by_width.setdefault(role, CallCosts()).add(width, dt)
        if prefill:
            self.prefill.setdefault(role, CallCosts()).add(width, dt)
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
        dt = time.perf_counter() - t
        self.callback_time += dt
        self.round_callback += dt

    def first_token(self):
        if self.t_first is None:
            self.t_first = time.perf_counter()

    def _time(self, role: str) -> float:
        return self.by_width[role].total() if role in self.by_width else 0.0

    def _calls(self, role: str) -> int:
        return sum(n for n, _ in self.by_width[role].table().values()) if role in self.by_width else 0

    def metrics(self, new_tokens: int, speculative: bool) -> GenerationMetrics:
        end = self.t_end or time.perf_counter()
        total = end - self.t0
        first = self.t_first or (end if new_tokens else None)
        model_time = sum(c.total() for c in self.by_width.values())
        return GenerationMetrics(
            new_tokens=new_tokens,
            ttft_s=None if first is None else first - self.t0,
            acceptance_rate=(self.accepted / self.drafted) if self.drafted else None,
            mean_tokens_per_tlm_call=(self.round_tokens / self.verify_calls) if self.verify_calls else None,
            acceptance_histogram=list(self.hist) if speculative else [],
            dlm_time_s=self._time("dlm"),
            tlm_time_s=self._time("tlm"),
            host_time_s=max(total - model_time - self.callback_time, 0.0),
            callback_time_s=self.callback_time,
            total_time_s=total,
            prefill_time_s={r: c.total() for r, c in self.prefill.items()},
            dlm_calls=self._calls("dlm"),
            tlm_calls=self._calls("tlm"),
            tlm_verify_calls=self.verify_calls,
            drafted_tokens=self.drafted,
            accepted_tokens=self.accepted,
            call_time_by_width={r: {str(w): v for w, v in c.table().items()} for r, c in self.by_width.items()},
            verify_drafts_histogram={str(j): c for j, c in sorted(self.widths.items())},
            calls=self.log,
        )


def backend_counts(**backends) -> dict:
    """{role: (calls, seconds)} as each backend counted its own calls (``Backend.calls``,
    ``time_s``); a role whose backend is None is left out."""
    return {role: (b.calls, b.time_s) for role, b in backends.items() if b is not None}


def use_backend_counts(m: RunMetrics, before: dict, after: dict, wall_s: float) -> None:
    """A batch run's model calls and times in ``m`` as the backends ran them, between the
    ``backend_counts`` ``before`` and ``after`` the run: a call of B rows once, not once per row
    (each row's own metrics count every call it took part in, so their sums count a shared call
    B times). ``total_time_s`` becomes the run's wall time, ``host_time_s`` the rest of it."""
    for role in ("tlm", "dlm"):
        calls, secs = (after[role][0] - before[role][0], after[role][1] - before[role][1]) \
            if role in after else (0, 0.0)
        setattr(m, f"{role}_calls", calls)
        setattr(m, f"{role}_time_s", secs)
    m.total_time_s = wall_s
    m.host_time_s = max(wall_s - m.tlm_time_s - m.dlm_time_s, 0.0)


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None


def aggregate_metrics(results: list[GenerationResult]) -> RunMetrics | None:
    """Metrics over several generations (sums, and rates recomputed from the sums).

    The rows of one batch share their calls and each row counts all it took part in, so over a
    batch the calls and model times count a shared call once per row: ``use_backend_counts``
    replaces them with the backends' own counts."""
    ms = [r.metrics for r in results]
    if not ms:
        return None
    tot = lambda k: sum((m.get(k) or 0) for m in ms)  # noqa: E731
    hl = max(len(m["acceptance_histogram"]) for m in ms)
    hist = [sum(m["acceptance_histogram"][i] if i < len(m["acceptance_histogram"]) else 0 for m in ms)
            for i in range(hl)]
    drafted, accepted, vcalls = tot("drafted_tokens"), tot("accepted_tokens"), tot("tlm_verify_calls")
    round_tokens = sum((m["mean_tokens_per_tlm_call"] or 0) * m["tlm_verify_calls"] for m in ms)
    return RunMetrics(
        prompts=len(ms),
        new_tokens=tot("new_tokens"),
        ttft_s=_mean([m["ttft_s"] for m in ms if m["ttft_s"] is not None]),
        decode_tokens=sum(max(m["new_tokens"] - 1, 0) for m in ms),
        decode_time_s=sum(decode_time_s(m) for m in ms),
        acceptance_rate=accepted / drafted if drafted else None,
        mean_tokens_per_tlm_call=round_tokens / vcalls if vcalls else None,
        acceptance_histogram=hist,
        dlm_time_s=tot("dlm_time_s"),
        tlm_time_s=tot("tlm_time_s"),
        host_time_s=tot("host_time_s"),
        total_time_s=tot("total_time_s"),
        dlm_calls=tot("dlm_calls"),
        tlm_calls=tot("tlm_calls"),
        tlm_verify_calls=vcalls,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
    )
