"""bench/results/results.json across runs: a partial run (``--only``) updates the sections it
measured and keeps the others, so the file says which run wrote each section (``section_runs``:
its command and when it finished), which sections this run did not measure
(``kept_from_earlier_runs``) and which sections it was asked for and skipped
(``skipped_sections``); results.md says the last two in words. ``command``, ``machine``,
``finished`` and ``wall_s`` are this run's alone. ``verdict``: whether a ratio meets its goal, said
from the unrounded ratio, for the reports that print one beside its goal."""
from __future__ import annotations

#: the keys about the run itself, not a section's
RUN_KEYS = ("machine", "command", "wall_s", "finished", "section_runs", "kept_from_earlier_runs", "skipped_sections")
#: the sections that skip themselves in one line (without make demo's build or an optional package),
#: and the key each writes when it measures
SKIPPABLE = {"suffix-real": "suffix_drafts_real", "step_floor": "step_floor", "fallback_feature": "fallback_feature",
             "backends": "backends", "mtbench": "mtbench"}
#: what section_runs says of a section an earlier run wrote without saying which
UNKNOWN_RUN = {"command": "an earlier run (not recorded)", "finished": None}


def skipped(only: set, res: dict) -> list[str]:
    """The sections in ``only`` that measured nothing in this run (``res``: this run's keys only; the
    backends section records why it skipped as a string)."""
    return [s for s, key in SKIPPABLE.items() if s in only and (key not in res or isinstance(res[key], str))]


def merged(prev: dict, res: dict, skips: list[str]) -> dict:
    """This run's ``res`` over the previous results ``prev``, with the provenance of every section; a
    section skipped in this run (``skips``; backends records why as a string) keeps the earlier record."""
    res = {k: v for k, v in res.items() if k not in {SKIPPABLE[s] for s in skips}}
    runs = {k: (prev.get("section_runs") or {}).get(k, UNKNOWN_RUN) for k in prev if k not in RUN_KEYS}
    mine = [k for k in res if k not in RUN_KEYS]
    runs.update({k: {"command": res["command"], "finished": res["finished"]} for k in mine})
    return {**prev, **res, "section_runs": runs, "skipped_sections": skips,
            "kept_from_earlier_runs": sorted(k for k in runs if k not in mine)}


def lines(res: dict) -> list[str]:
    """results.md's words on what this run did not measure."""
    out = []
    if res.get("kept_from_earlier_runs"):
        out.append(f"Kept from earlier runs, not measured by this run ({res.get('command')}): "
                   f"{', '.join(res['kept_from_earlier_runs'])} (results.json's section_runs says which run "
                   f"wrote each).")
    if res.get("skipped_sections"):
        out.append(f"Skipped in this run: {', '.join(res['skipped_sections'])} (nothing measured; the log says why).")
    return ["", *out] if out else []


def verdict(ratio: float, goal: float, exact: bool = True) -> str:
    """Whether ``ratio`` meets ``goal``, from the unrounded ratio: the two decimals shown alone read
    0.946 as "0.95 (goal >= 0.95)", a goal met that was not (then the ratio is shown to 4 places).
    ``exact`` False (a draft whose greedy output is not target-only's): not met, whatever the ratio."""
    if ratio >= goal and exact:
        return "met"
    why = ([f"{ratio:.4f}"] if round(ratio, 2) >= goal > ratio else []) + ([] if exact else
                                                                          ["the output is not target-only's"])
    return "not met" + (f" ({', '.join(why)})" if why else "")


def beside_results(a, default):
    """Where a section's side file goes: beside ``--results`` (``a.results``), as results.json does, so
    that a run given ``--results /tmp/x/results.json`` does not overwrite the committed bench/results/
    files; ``default`` (its name kept) when the run has no --results."""
    from pathlib import Path
    results = getattr(a, "results", None)
    return Path(results).parent / Path(default).name if results else Path(default)
