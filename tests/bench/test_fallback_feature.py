"""bench/fallback_feature.py on the tiny llama target and feature draft (seconds): the section's
record and rows, greedy equality enforced, the skip without make demo's build. SmolLM2 itself is
measured by ``python -m bench.run_bench --only fallback_feature`` (docs/runtime.md)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import fallback_feature
from feature_draft_models import export_feature_draft
from specdec_compile import cli as compile_cli

PL, CL = 8, 64


@pytest.fixture(scope="module")
def build(fixture_path, tmp_path_factory):
    """A build folder as make demo's holds them: tlm-base, tlm, tlm-hs and fdlm (tiny models)."""
    root = tmp_path_factory.mktemp("ff_build")
    common = ["--target", "ort", "--prefill-len", str(PL), "--ctx-len", str(CL)]
    target = str(fixture_path("llama_gqa"))
    tlm = ["--role", "tlm", "--k", "3", "--k-list", "0,1,3"]
    for name, argv in (("tlm-base", [target, "--role", "dlm"]), ("tlm", [target, *tlm]),
                       ("tlm-hs", [target, *tlm, "--hidden-states", "-1"]),
                       ("fdlm", [str(export_feature_draft(1)), "--role", "dlm", "--k", "3",
                                 "--feature-layers", "-1"])):
        assert compile_cli.main(argv + common + ["-o", str(root / name)]) == 0
    return root


def test_the_section_on_a_tiny_build(build):
    said = []
    rec = fallback_feature.measure(build, [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20]], threads=1,
                                   rounds=2, n_new=10, log=said.append)
    assert rec["threads"] == 1 and list(rec["decoders"]) == list(fallback_feature.DECODERS)
    for d, v in rec["decoders"].items():
        assert v["decode_tokens_per_s"] > 0 and v["ratio_to_target"] > 0, d
        assert v["width1_call_ms"] > 0          # every decoder's steps are width-1 TLM calls
    assert rec["decoders"]["target"]["ratio_to_target"] == 1.0
    assert said and "feature_k0" in said[0]
    md = "\n".join(fallback_feature.markdown({"prompts": 2, "new_tokens": 10, "rounds": 2, "runs": [rec]}))
    assert "| 1 | feature_k0 |" in md and "goal: feature_k0 >= 0.98x" in md
    assert rec["goal"] in ("met", "not met") or rec["goal"].startswith("not met (")
    assert f"Goal feature_k0 >= 0.98x at 1 thread(s): {rec['goal']}." in md


def test_the_goal_is_judged_on_the_unrounded_ratio():
    """0.9796 printed as 0.980x beside "goal >= 0.98x" read as met; the verdict line says it is not."""
    dec = {d: {"decode_tokens_per_s": 1.0, "ratio_to_target": 0.98, "width1_call_ms": 1.0, "host_ms_per_token": 0.1}
           for d in fallback_feature.DECODERS}
    run = {"threads": 1, "decoders": dec, "goal": fallback_feature.verdict(0.9796, fallback_feature.GOAL)}
    md = "\n".join(fallback_feature.markdown({"prompts": 1, "new_tokens": 4, "rounds": 1, "runs": [run]}))
    assert "| 0.980x |" in md and "at 1 thread(s): not met (0.9796)." in md


def test_a_greedy_difference_fails_loudly(build, monkeypatch):
    real = fallback_feature.decoders

    def wrong(bk, eos):
        decs = real(bk, eos)
        gen = decs["feature_k0"].generate

        def generate(p, **kw):
            r = gen(p, **kw)
            r.generated_ids[-1] = (r.generated_ids[-1] + 1) % 100
            return r
        decs["feature_k0"].generate = generate
        return decs
    monkeypatch.setattr(fallback_feature, "decoders", wrong)
    with pytest.raises(SystemExit, match="feature_k0's greedy output differs from target-only's"):
        fallback_feature.measure(build, [[1, 150, 20]], threads=1, rounds=1, n_new=4, log=lambda *_: None)


def test_skipped_with_the_reason_without_the_build(tmp_path):
    said = []
    a = SimpleNamespace(real_out=tmp_path / "nothing", log=said.append)
    assert fallback_feature.run(a, {"fallback_feature"}) == {}
    assert said and "skipped: no tlm-base, tlm, tlm-hs, fdlm" in said[0]
    assert fallback_feature.run(a, {"step_floor"}) == {}


def test_a_greedy_difference_in_any_round_fails_loudly(monkeypatch, tmp_path):
    """Every round's outputs are held to target-only's, not only the last round's (a difference in
    round 1 used to be overwritten by round 2's equal output and pass)."""
    import specdec_compile.runtime as rt

    class Backend:
        def __init__(self, *a, **k):
            self.artifact = SimpleNamespace(manifest={})

        def warmup(self):
            pass

        def close(self):
            pass

    class Dec:
        def __init__(self, name):
            self.name, self.calls = name, 0

        def generate(self, p, max_new_tokens):
            self.calls += 1
            wrong = self.name == "feature_k0" and self.calls == 1         # round 1 only
            m = {"new_tokens": 3, "total_time_s": 1.0, "ttft_s": 0.1, "host_time_s": 0.01,
                 "call_time_by_width": {"tlm": {"1": [2, 0.2]}}}
            return SimpleNamespace(generated_ids=[1, 2, 9 if wrong else 3], metrics=m)

    monkeypatch.setattr(rt, "OrtBackend", Backend)
    monkeypatch.setattr(fallback_feature, "decoders", lambda bk, eos: {d: Dec(d) for d in fallback_feature.DECODERS})
    with pytest.raises(SystemExit, match=r"feature_k0's greedy output differs from target-only's \(prompt 0, round 1\)"):
        fallback_feature.measure(tmp_path, [[5, 6]], threads=1, rounds=2, n_new=3, log=lambda *_: None)
