"""What the bench's and the demo's reports claim, held to what they measured: a goal is said met from
the unrounded ratio (and, for the speculative goal, only with target-only's output); the host share
that results.md calls "of decode time" is of the decode phase; the demo refuses a run with no
decode phase to time instead of ending it with an untrue line."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import backends, record, run_bench, spec


def _metrics(total, ttft, tlm, dlm, pre_tlm, pre_dlm=0.0, new=11):
    return {"new_tokens": new, "total_time_s": total, "ttft_s": ttft, "callback_time_s": 0.0,
            "tlm_time_s": tlm, "dlm_time_s": dlm, "prefill_time_s": {"tlm": pre_tlm, "dlm": pre_dlm},
            "host_time_s": max(total - tlm - dlm, 0.0)}


def _goals_res(ours_f32: float, ours_spec: float, spec_equal: bool) -> dict:
    row = {"backend": "openvino", "precision": "f32", "cache": "fused", "target_only_tok_s": ours_f32,
           "ngram_tok_s": ours_spec, "ngram_speedup": ours_spec / ours_f32, "ngram_greedy_equal": [spec_equal],
           "suffix_tok_s": 1.0, "suffix_speedup": 0.01, "suffix_greedy_equal": [spec_equal]}
    genai = {"python": "p", "ir": "i", "openvino_genai": "v", "cpu_default_precision": "f32",
             "num_assistant_tokens": 4, "max_ngram_size": 3, "rows": [
                 {"precision": "f32", "mode": "target", "runs_at": "f32", "tok_s": 100.0,
                  "greedy_equal_ours_f32": [True]},
                 {"precision": "f32", "mode": "prompt_lookup", "runs_at": "f32", "tok_s": 100.0,
                  "greedy_equal_ours_f32": [True]}]}
    res = {"model": "m", "prompts": 1, "max_new_tokens": 8, "threads": 1, "k": 4, "ctx_len": 256, "genai": genai,
           "rows": [row]}
    res["goals"] = backends.goals(res)
    return res


def _goal_line(md: str, start: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(start))


def test_a_goal_missed_by_less_than_the_rounding_is_not_shown_as_met():
    """94.6 / 100 printed to two places reads "0.95 (goal >= 0.95)": the line must say it is not met."""
    md = backends.markdown(_goals_res(94.6, 119.6, True))
    f32 = _goal_line(md, "goal: OpenVINO f32 target-only")
    assert "= 0.95 (goal >= 0.95)" in f32 and f32.endswith(": not met (0.9460)"), f32
    best = _goal_line(md, "goal: our best speculative")
    assert "= 1.20 (goal >= 1.2)" in best and best.endswith(": not met (1.1960)"), best
    md = backends.markdown(_goals_res(95.0, 130.0, True))
    assert _goal_line(md, "goal: OpenVINO f32 target-only").endswith("(goal >= 0.95): met")
    assert _goal_line(md, "goal: our best speculative").endswith("(goal >= 1.2): met")


def test_a_speculative_goal_is_not_met_by_output_that_differs_from_target_only():
    """The goal is the best *exact* speculative decoding: a faster draft whose output differs is
    flagged, and the goal is not met whatever its ratio."""
    best = _goal_line(backends.markdown(_goals_res(95.0, 130.0, False)), "goal: our best speculative")
    assert "greedy == target-only: NO" in best and best.endswith("not met (the output is not target-only's)"), best


def test_the_batch_scaling_goal_is_said_from_the_unrounded_ratio():
    rows = [{"batch_size": b, "interface": "default", "target_tokens_per_s": t, "spec_tokens_per_s": s,
             "speedup": s / t, "acceptance_rate": 0.7} for b, t, s in ((1, 100.0, 100.0), (4, 300.0, 199.6))]
    md = "\n".join(run_bench.serving_markdown({"batch_throughput": rows}))
    assert "speculative 2.00x (goal 2x: not met (1.9960))" in md, md
    rows[1]["spec_tokens_per_s"] = 200.0
    assert "speculative 2.00x (goal 2x: met)" in "\n".join(run_bench.serving_markdown({"batch_throughput": rows}))


def test_verdict():
    assert record.verdict(0.95, 0.95) == "met"
    assert record.verdict(0.9, 0.95) == "not met"
    assert record.verdict(1.3, 1.2, exact=False) == "not met (the output is not target-only's)"


def test_host_share_is_of_the_decode_phase():
    """results.md: "Host share of decode time". A generation of 1.0 s: a 0.5 s prefill (0.3 s in the
    TLM's prefill call, 0.2 s of host work), then 0.5 s of decoding with 0.45 s in model calls: the
    decode phase's host share is 10%, not the whole generation's 25%."""
    m = _metrics(total=1.0, ttft=0.5, tlm=0.3 + 0.4, dlm=0.05, pre_tlm=0.3)
    assert spec.decode_host_share([m]) == pytest.approx(0.05 / 0.5)
    two = [m, _metrics(total=2.0, ttft=0.2, tlm=0.1 + 1.5, dlm=0.0, pre_tlm=0.1)]
    # a ratio of sums over the generations: (0.05 + 0.3) / (0.5 + 1.8)
    assert spec.decode_host_share(two) == pytest.approx(0.35 / 2.3)
    assert spec.decode_host_share([_metrics(total=0.5, ttft=0.5, tlm=0.3, dlm=0.0, pre_tlm=0.3, new=1)]) is None
    # the spec_vs_target row's share (results.md: "Host share of decode time at the best k") is that one
    m.update({"call_time_by_width": {"tlm": {"32": [1, 0.3], "3": [4, 0.4]}, "dlm": {"32": [1, 0.0], "1": [8, 0.05]}},
              "tlm_verify_calls": 4, "mean_tokens_per_tlm_call": 2.5, "accepted_tokens": 6,
              "acceptance_histogram": [0, 2, 2], "drafted_tokens": 8})
    _, host = spec._k_row(2, [m], target_rate=10.0, t_step=0.1, a=SimpleNamespace(log=lambda *_: None))
    assert host == pytest.approx(0.1)


def test_the_demo_refuses_one_new_token_before_any_work(tmp_path, capsys):
    """With one new token there is no decode phase: the toy demo reported a speedup of None with exit
    0, and the real demo ended its run with "no draft could be run" (exit 1)."""
    from demo import run_demo
    out = tmp_path / "out"
    assert run_demo.main(["--micro", "--max-new-tokens", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("demo: --max-new-tokens must be at least 2") and err.count("\n") == 1, err
    assert not out.exists()


def test_side_files_go_beside_results(tmp_path, monkeypatch):
    """--results /tmp/x/results.json still wrote step_floor's, suffix-real's and real_model.svg's files into
    bench/results/, over the committed ones; they now go beside --results, as mtbench's do."""
    from pathlib import Path
    from bench import step_floor, suffix
    a = SimpleNamespace(results=tmp_path / "x" / "results.json")
    assert record.beside_results(a, step_floor.RESULTS) == tmp_path / "x" / "results-step-floor.json"
    assert record.beside_results(a, "real_model.svg") == tmp_path / "x" / "real_model.svg"
    assert record.beside_results(SimpleNamespace(), suffix.REAL_RESULTS) == Path(suffix.REAL_RESULTS)
    # suffix-real end to end with its measurement stubbed: the files land beside --results only
    committed = Path(suffix.REAL_RESULTS)
    before = committed.read_bytes() if committed.exists() else None
    monkeypatch.setattr(suffix, "real_build_missing", lambda out: None)
    monkeypatch.setattr(suffix, "bench_suffix_real", lambda out, a: ([], {"k_list": [0]}))
    monkeypatch.setattr(suffix, "markdown", lambda rows, title: ["x"])
    monkeypatch.setattr(suffix, "real_title", lambda info: "t")
    a = SimpleNamespace(results=tmp_path / "x" / "results.json", real_out=tmp_path, log=lambda m: None)
    suffix.run_real(a, {"suffix-real"})
    assert (tmp_path / "x" / "results-suffix-real.json").exists()
    assert (committed.read_bytes() if committed.exists() else None) == before
