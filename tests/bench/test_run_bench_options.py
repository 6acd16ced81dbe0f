"""``python -m bench.run_bench``'s options and its results across runs: a bad option is refused in
one line (exit 2) before any work, where it used to start the run and end minutes later in a
traceback; a section named by --only that measures nothing exits 1 and is named as skipped; an
earlier run's section kept in results.json is marked as such (``section_runs``,
``kept_from_earlier_runs``, a line in results.md), not passed off as this run's; and make demo's
build is made before the sections that read it. Every section's work is stubbed: seconds."""
from __future__ import annotations

import json

import pytest

from bench import run_bench


@pytest.fixture
def no_work(monkeypatch):
    """Any section's work (the toy pair's training, make demo's build, a section) fails the test."""
    from bench import backends, fallback_feature, mtbench, real_model, serving, step_floor, suffix

    def work(*a, **k):
        raise AssertionError("work started before the options were checked")
    for mod, name in ((run_bench.train_pair, "run"), (run_bench, "bench_spec"), (run_bench, "bench_kv"),
                      (run_bench, "bench_rewrite"), (real_model, "build"), (real_model, "run"),
                      (real_model, "ensure_feature_pair"), (backends, "run_section"), (serving, "run"),
                      (suffix, "run"), (suffix, "run_real"), (step_floor, "run"), (fallback_feature, "run"),
                      (mtbench, "run")):
        monkeypatch.setattr(mod, name, work)


@pytest.mark.parametrize("argv, words", [
    (["--only", "spec", "--repeats", "0"], "--repeats must be at least 1 (got 0)"),
    (["--only", "spec", "--max-new-tokens", "1"], "--max-new-tokens must be at least 2 (got 1)"),
    (["--only", "real", "--real-repeats", "0"], "--real-repeats must be at least 1"),
    (["--only", "rewrite", "--rewrite-repeats", "-1"], "--rewrite-repeats must be at least 1"),
    (["--only", "fallback_feature", "--fallback-feature-rounds", "0"], "--fallback-feature-rounds must be at least 1"),
    (["--only", "kv", "--kv-ctx", "256,16"], "--kv-ctx: every value must be at least 64 (got 16)"),
    (["--only", "backends", "--backends-threads", "0"], "--backends-threads: every value must be at least 1"),
    (["--only", "step_floor", "--step-floor-ctx", ","], "--step-floor-ctx must name at least one value"),
    (["--only", "spec", "--ctx-len", "100", "--max-new-tokens", "128"], "--ctx-len 100 leaves no room"),
    (["--only", "spec", "--pair", "no-such/pair.json"], "--pair no-such/pair.json: no such file"),
])
def test_bad_options_are_refused_in_one_line_before_any_work(tmp_path, capsys, no_work, argv, words):
    res, out = tmp_path / "res" / "results.json", tmp_path / "out"
    assert run_bench.main([*argv, "--results", str(res), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("run_bench: ") and words in err and err.count("\n") == 1, err
    assert not res.parent.exists() and not out.exists()


def test_a_section_asked_for_and_skipped_fails_and_earlier_sections_are_marked(tmp_path, capsys):
    """``--only step_floor`` without make demo's build measures nothing: exit 1 in one line, and
    the results say so; an earlier run's section kept in results.json is not passed off as this
    run's (results.md names it, results.json's section_runs says which run wrote what)."""
    res = tmp_path / "results.json"
    row = {"workload": "repeated", "draft": "suffix", "tokens_per_tlm_call": 2.5, "speedup": 1.4}
    res.write_text(json.dumps({"command": "python -m bench.run_bench --only suffix", "finished": "earlier",
                               "suffix_drafts": [row]}))
    argv = ["--only", "step_floor", "--real-build", str(tmp_path / "no-build"), "--results", str(res),
            "--out", str(tmp_path / "out")]
    assert run_bench.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("run_bench: step_floor: skipped") and err.count("\n") == 1, err
    got = json.loads(res.read_text())
    assert got["skipped_sections"] == ["step_floor"] and "step_floor" not in got
    assert got["suffix_drafts"] == [row] and got["kept_from_earlier_runs"] == ["suffix_drafts"]
    assert got["section_runs"]["suffix_drafts"]["command"] != got["command"]
    md = res.with_suffix(".md").read_text()
    assert "| repeated | suffix | 2.50 | 1.40x |" in md
    assert "not measured by this run" in md and "suffix_drafts" in md and "Skipped in this run: step_floor" in md
    # the next run that measures nothing new keeps what it knew of that section's run
    assert run_bench.main(argv) == 1
    assert json.loads(res.read_text())["section_runs"] == got["section_runs"]


def test_make_demos_build_comes_before_the_sections_that_read_it(tmp_path, monkeypatch):
    """With ``real`` asked for, make demo's build is made first, so that step_floor, fallback_feature
    and suffix-real find it (a fresh `make bench` used to skip them: the build came later, in real)."""
    from bench import fallback_feature, real_model, step_floor, suffix
    build = tmp_path / "build"
    export = build / "export" / "tlm" / "model.onnx"
    seen = []

    def make(out, a, log=print):
        export.parent.mkdir(parents=True)
        export.write_bytes(b"onnx")
    monkeypatch.setattr(real_model, "build", make)
    monkeypatch.setattr(real_model, "ensure_feature_pair", lambda out, a, log=print: None)
    monkeypatch.setattr(real_model, "run", lambda out, a, log=print: ([], {}))
    monkeypatch.setattr(real_model, "picture", lambda rows, path: path)
    for mod, key in ((step_floor, "step_floor"), (fallback_feature, "fallback_feature"), (suffix, "suffix-real")):
        monkeypatch.setattr(mod, "run" if mod is not suffix else "run_real",
                            lambda a, only, key=key: seen.append((key, export.is_file())) or {})
    run_bench.main(["--only", "real,step_floor,fallback_feature,suffix-real", "--real-build", str(build),
                    "--results", str(tmp_path / "r.json"), "--out", str(tmp_path / "out")])
    assert sorted(seen) == [("fallback_feature", True), ("step_floor", True), ("suffix-real", True)]


def test_a_skipped_backends_section_keeps_the_earlier_record(tmp_path, monkeypatch):
    """backends without openvino says why as a string; that string no longer replaces an earlier
    run's measured record in results.json (it is named as skipped instead)."""
    from bench import backends
    monkeypatch.setattr(backends, "run_section", lambda *a, **k: "skipped: openvino is not installed")
    res = tmp_path / "results.json"
    earlier = {"runs": []}
    res.write_text(json.dumps({"backends": earlier}))
    assert run_bench.main(["--only", "backends", "--results", str(res), "--out", str(tmp_path / "out")]) == 1
    got = json.loads(res.read_text())
    assert got["backends"] == earlier and got["skipped_sections"] == ["backends"]
    assert got["kept_from_earlier_runs"] == ["backends"]
