"""Measured call costs: one tracker per model (seconds per call, by width) and the
loop's own host work per round. The batch scheduler (schedule.py), the width
policy (policy.py) and the reports (metrics.py) all read these."""
from __future__ import annotations


class CallCosts:
    """Running mean call time per width of one model (seconds)."""

    def __init__(self):
        self._t: dict[int, list] = {}

    def add(self, width: int, dt: float, n: int = 1) -> None:
        """``n`` calls of ``width`` that took ``dt`` seconds each."""
        c = self._t.setdefault(int(width), [0, 0.0])
        c[0] += n
        c[1] += dt * n

    def known(self) -> dict[int, float]:
        """Mean seconds per call of every measured width."""
        return {w: t / n for w, (n, t) in sorted(self._t.items()) if n}

    def table(self) -> dict[int, list]:
        """{width: [calls, total seconds]} (what the metrics report)."""
        return {w: [n, t] for w, (n, t) in sorted(self._t.items())}

    def total(self) -> float:
        return sum(t for _, t in self._t.values())

    def estimate(self, width: int) -> float | None:
        """The mean time of ``width``, never above a wider measured width's: a narrower
        call does less work, so a slower mean there is noise (one call of a new shape,
        a busy core), and believing it would lock the loop out of that width for good,
        since a width never chosen is never timed again. Unmeasured: a call's time is
        taken as affine in its width (a fixed part, reading the weights, and a part per
        token), so linear between the measured widths around it, the narrowest measured
        one's below them, and above them the line through the two widest (never
        falling), or the one measured width's time. None when nothing is measured."""
        k = self.known()
        if not k:
            return None
        raw = self._raw(k, width)
        wider = [t for w, t in k.items() if w > width]
        return min(raw, min(wider)) if wider else raw

    @staticmethod
    def _raw(k: dict[int, float], width: int) -> float:
        if width in k:
            return k[width]
        lo = [w for w in k if w < width]
        hi = [w for w in k if w > width]
        if lo and hi:
            a, b = max(lo), min(hi)
            return k[a] + (k[b] - k[a]) * (width - a) / (b - a)
        if hi:
            return k[min(hi)]
        if len(lo) == 1:
            return k[lo[0]]
        a, b = sorted(lo)[-2:]
        return k[b] + max((k[b] - k[a]) / (b - a), 0.0) * (width - b)


class CostModel:
    """What a decoder has measured, kept across prompts: each model's calls by
    width, and the loop's host work per round (with and without drafts)."""

    def __init__(self):
        self._calls: dict[str, CallCosts] = {}
        self._host: dict[bool, list] = {}

    def calls(self, role: str) -> CallCosts:
        """The tracker of one model ("tlm", "dlm", or a draft source's own name)."""
        return self._calls.setdefault(role, CallCosts())

    def note_host(self, drafting: bool, dt: float, n: int = 1) -> None:
        c = self._host.setdefault(bool(drafting), [0, 0.0])
        c[0] += n
        c[1] += dt * n

    def host_per_round(self) -> tuple[float, float]:
        """Mean host seconds of a round without drafts and of one with drafts (an
        unmeasured kind costs what the other does)."""
        h = {k: t / n for k, (n, t) in self._host.items() if n}
        h0, h1 = h.get(False), h.get(True)
        h0 = h1 if h0 is None else h0
        h1 = h0 if h1 is None else h1
        if h0 is not None and h1 is not None:
            h0 = min(h0, h1)          # a round without drafts never does more host work
        return h0 or 0.0, h1 or 0.0
