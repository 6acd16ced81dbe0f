"""The decode rate the demo and the benchmarks compare runs by: the runtime's own
(specdec_compile.runtime.metrics), re-exported under the name they use."""
from __future__ import annotations

from specdec_compile.runtime.metrics import busy_time_s, decode_rate_of as decode_rate, decode_time_s

__all__ = ["busy_time_s", "decode_rate", "decode_time_s"]
