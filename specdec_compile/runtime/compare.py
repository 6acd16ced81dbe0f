"""Target-only against speculative decoding on the same prompts (``specdec-run --compare``).

The report has QEfficient's four performance lines per run, defined here once:

- ``ttft_s``: time to first token, the mean over prompts;
- ``decode_tokens_per_s``: the tokens after each prompt's first over their decode time (as
  :func:`~specdec_compile.runtime.metrics.decode_rate_of`, summed over prompts);
- ``total_tokens_per_s``: every new token over the run's wall time;
- ``e2e_s``: the run's wall time (end to end, all prompts).

Then the tokens per target call (``mean_tokens_per_tlm_call``: 1 for target-only, the
accepted drafts plus the target's own token per verify call for speculative decoding), the
speedup (total tokens/s, speculative over target-only; the ratio of the E2E times when both
runs made the same tokens), and whether greedy outputs were identical prompt by prompt.
"""
from __future__ import annotations

from ..errors import SpecdecError
from .metrics import GenerationResult, RunMetrics, aggregate_metrics

#: (key, label, unit) of the report lines, in print order
REPORT_LINES = (
    ("ttft_s", "TTFT", "s"),
    ("decode_tokens_per_s", "decode", "tokens/s"),
    ("total_tokens_per_s", "total", "tokens/s"),
    ("e2e_s", "E2E", "s"),
    ("mean_tokens_per_tlm_call", "tokens per target call", ""),
)


def run_report(results: list[GenerationResult], wall_s: float) -> dict:
    """One run's report lines (REPORT_LINES' keys) and its new token count."""
    m: RunMetrics = aggregate_metrics(results)
    return {"new_tokens": m.new_tokens,
            "ttft_s": m.ttft_s,
            "decode_tokens_per_s": m.decode_tokens_per_s,
            "total_tokens_per_s": m.new_tokens / wall_s if wall_s > 0 and m.new_tokens else None,
            "e2e_s": wall_s,
            "mean_tokens_per_tlm_call": m.mean_tokens_per_tlm_call}


def compare_runs(target: tuple[list[GenerationResult], float], spec: tuple[list[GenerationResult], float],
                 greedy: bool) -> dict:
    """The comparison of a target-only run and a speculative one, each (results in prompt order,
    wall s). ``identical`` is None unless ``greedy`` (sampled texts may differ and still be right)."""
    t_res, s_res = target[0], spec[0]
    if len(t_res) != len(s_res):
        raise SpecdecError("compare_runs: the two runs must cover the same prompts")
    t, s = run_report(*target), run_report(*spec)
    speedup = s["total_tokens_per_s"] / t["total_tokens_per_s"] \
        if s["total_tokens_per_s"] and t["total_tokens_per_s"] else None
    differ = [i for i, (a, b) in enumerate(zip(t_res, s_res)) if a.generated_ids != b.generated_ids]
    return {"target_only": t, "speculative": s, "speedup": speedup, "greedy": greedy,
            "identical": (not differ) if greedy else None,
            "differing_prompts": differ if greedy else None}


def _cell(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def format_report(report: dict) -> list[str]:
    """The comparison as text lines: one per report line, both runs side by side, then the
    speedup and whether the greedy outputs were identical."""
    t, s = report["target_only"], report["speculative"]
    labels = [f"{label} ({unit})" if unit else label for _, label, unit in REPORT_LINES]
    w = max(len(x) for x in labels)
    lines = [f"{'':<{w}}  {'target-only':>12}  {'speculative':>12}"]
    for (key, _, unit), label in zip(REPORT_LINES, labels):
        lines.append(f"{label:<{w}}  {_cell(t[key]):>12}  {_cell(s[key]):>12}")
    sp = report["speedup"]
    lines.append(f"speedup (total tokens/s): {'-' if sp is None else f'{sp:.2f}x'}")
    if report["identical"] is None:
        lines.append("greedy outputs identical: not compared (sampling: the texts may differ and both be right)")
    elif report["identical"]:
        lines.append("greedy outputs identical: yes")
    else:
        which = ", ".join(str(i + 1) for i in report["differing_prompts"])
        lines.append(f"greedy outputs identical: NO (prompt {which} differs)")
    return lines
