"""Generation results and their metrics: counters and timings per generation,
and sums over several."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

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
