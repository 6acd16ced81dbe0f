"""The compiler, ``verify`` and ``diff`` on a set of mutated models (issue 35's "done when").

tests/mutation_driver.py mutates the llama_gqa fixture export (tests/mutations.py: dims,
dtypes, raw_data, names, ops, external data, cycles, control flow, opsets, JSON configs,
plus seeded random edits and flipped bytes) and runs each command in a child process
with a time limit. None may give exit 3 or a traceback, hang past the limit, print more
than one line with exit 2, or leave files outside its -o and the temporary directory.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LIMIT_S = 120     # per command; the tiny fixture takes a few seconds even on a contended machine


def test_mutated_models_never_crash_hang_or_leave_files(fixture_path, tmp_path):
    src = fixture_path("llama_gqa")
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    driver = Path(__file__).with_name("mutation_driver.py")
    res = subprocess.run([sys.executable, str(driver), str(src), str(work), str(LIMIT_S), "35"],
                         capture_output=True, text=True, timeout=1800, env=dict(os.environ, TMPDIR=str(tmp)))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    results = report["results"]
    bad = []
    for r in results:
        where = f"{r['mutant']} {r['command']}: rc={r['rc']} {r['stderr'][-400:]!r}"
        lines = [x for x in r["stderr"].splitlines() if x.strip()]
        if r["rc"] is None:
            bad.append(f"hang past {LIMIT_S} s: {where}")
        elif r["rc"] not in (0, 1, 2) or "Traceback" in r["stderr"] or "internal error" in r["stderr"]:
            bad.append(where)
        elif r["rc"] == 2 and len(lines) != 1:
            bad.append(f"not one line: {where}")
    assert not bad, "\n".join(bad)
    assert report["stray"] == []
    by = {(r["mutant"], r["command"]): r["rc"] for r in results}
    # the mutator really breaks models: most are refused at compile, the valid ones compile and verify
    compiled = {m for (m, c), rc in by.items() if c.startswith("compile") and rc == 0}
    assert sum(1 for (m, c), rc in by.items() if c.startswith("compile") and rc == 2) >= 35
    assert "if-node" in compiled and by[("if-node", "verify-artifact")] == 0
    assert {m for m, c in by if c == "verify-artifact"} == compiled
