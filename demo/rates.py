"""The decode rate the demo and the benchmarks compare runs by."""
from __future__ import annotations


def decode_rate(m: dict) -> float | None:
    """Decode tokens/s after the first token, not counting the time spent printing."""
    dec = m["new_tokens"] - 1
    t = m["total_time_s"] - m["ttft_s"] - m.get("callback_time_s", 0.0)
    return dec / t if dec > 0 and t > 0 else None
