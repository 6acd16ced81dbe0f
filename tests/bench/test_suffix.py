"""bench/suffix.py on tiny stand-ins: the SmolLM2 workloads' construction (a word-level fake
tokenizer with a chat template), the rows' arithmetic, the measuring loop on FAKE backends
(specdec_compile.runtime.testing), the shared table, the skip without a build; SmolLM2 itself
only when ``make demo`` has built it (as tests/demo/test_demo_real_parts.py)."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import suffix
from workshop.prompts import DEMO_PROMPTS

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "build" / "demo"


class WordTok:
    """Words and punctuation as tokens; a chat template that wraps the message in marker tokens."""

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def _ids(self, text: str) -> list[int]:
        out = []
        for w in re.findall(r"\w+|\S", text):
            if w not in self.vocab:
                self.vocab[w] = len(self.words)
                self.words.append(w)
            out.append(self.vocab[w])
        return out

    def __call__(self, text: str) -> dict:
        return {"input_ids": self._ids(text)}

    def apply_chat_template(self, msgs, add_generation_prompt=True):
        return self._ids(f"<user> {msgs[0]['content']} </user> <assistant>")

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)


def test_real_workloads_are_chat_formatted_repeated_requests_that_fit():
    tok = WordTok()
    w = suffix.real_workloads(tok, 2, 2, ctx_len=256, n_new=32)
    assert list(w) == ["demo_instructions", "repeated"]
    assert [tok.decode(p) for p in w["demo_instructions"]] == \
        [tok.decode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in DEMO_PROMPTS[:2]]
    rep = [tok.decode(p) for p in w["repeated"]]
    assert len(rep) == 6 and all(len(p) + 32 <= 256 for p in w["repeated"])
    for i in range(0, 6, 3):
        first, renamed, again = rep[i:i + 3]
        assert all(t.startswith("< user > Complete this Python function") and t.endswith("< assistant >")
                   for t in (first, renamed, again))
        name = re.search(r"def (\w+) \(", first).group(1)
        assert f"def {name}_new (" in renamed and f"def new_{name} (" in again
        assert renamed.replace(f"{name}_new", name) == first              # only the rename differs
    # a context too short for the demo instructions: one line, no run
    with pytest.raises(SystemExit, match="exceeds the context length"):
        suffix.real_workloads(tok, 1, 1, ctx_len=24, n_new=16)


def test_rows_of_tokens_per_call_and_speedup_over_target_only():
    best = {"none": [10.0, 20.0], "ngram": [20.0, 40.0], "suffix": [0.0, 30.0]}
    calls = {"none": [10, 10], "ngram": [30, 15], "suffix": [8, 4]}
    rows = {r["draft"]: r for r in suffix.rows_of("repeated", best, calls)}
    assert rows["none"]["speedup"] == 1.0 and rows["none"]["tokens_per_tlm_call"] == 1.0
    assert rows["none"]["tokens_per_s"] == pytest.approx(2 / (1 / 10 + 1 / 20), abs=0.05)   # harmonic mean
    assert rows["ngram"]["speedup"] == pytest.approx(2.0) and rows["ngram"]["tokens_per_tlm_call"] == 2.0
    assert rows["suffix"]["speedup"] == pytest.approx(30 / (2 / (1 / 10 + 1 / 20)), abs=1e-3)  # no-decode prompt left out
    assert {r["workload"] for r in rows.values()} == {"repeated"} and rows["suffix"]["prompts"] == 2
    none_zero = suffix.rows_of("x", {"none": [0.0], "suffix": [5.0]}, {"none": [1, 1], "suffix": [2, 1]})
    assert none_zero[1]["speedup"] is None
    md = suffix.markdown(none_zero, "title line")
    assert md[0] == "title line" and md[2].startswith("| workload | draft |") and "| x | suffix | 2.00 | - |" in md
    assert suffix.markdown(none_zero)[0].startswith("| workload")          # the toy's table: no title


def test_measure_on_fake_backends_checks_greedy_equality():
    from specdec_compile.runtime import SpecDecoder, SuffixDraft, TargetOnlyDecoder
    from specdec_compile.runtime.testing import fake_pair
    tlm, _, _ = fake_pair(ctx_len=96, prefill_len=8, k=4, k_list=[0, 1, 2, 4])
    decs = {"none": TargetOnlyDecoder(tlm), "ngram": SpecDecoder(tlm, None, draft="ngram"),
            "suffix": SpecDecoder(tlm, SuffixDraft())}
    base = [1, 2, 3, 4, 5, 1, 2, 3]
    work = {"a": [base, base + [6], base], "b": [[7, 8, 9]]}
    log: list[str] = []
    rows = suffix.measure(decs, work, 12, 2, log.append, "[t]")
    assert [(r["workload"], r["draft"]) for r in rows] == [(k, d) for k in "ab" for d in decs]
    assert all(r["tokens_per_tlm_call"] >= 1.0 and r["speedup"] for r in rows) and len(log) == 6
    assert [r["tokens_per_tlm_call"] for r in rows if r["draft"] == "none"] == [1.0, 1.0]

    class Wrong:                                       # a "speculative" decoder whose output differs
        def generate(self, p, max_new_tokens):
            r = decs["none"].generate(p, max_new_tokens=max_new_tokens)
            r.generated_ids = r.generated_ids[:-1] + [(r.generated_ids[-1] + 1) % 23]
            return r
    with pytest.raises(SystemExit, match="differs from target-only"):
        suffix.measure({"none": decs["none"], "wrong": Wrong(), "suffix": decs["suffix"]}, {"a": [base]},
                       4, 1, log.append)


def test_real_rows_are_skipped_with_a_reason_without_a_build(tmp_path):
    log: list[str] = []
    a = SimpleNamespace(real_out=tmp_path / "nothing", log=log.append)
    assert suffix.run_real(a, {"spec"}) == {} and log == []
    assert suffix.run_real(a, {"suffix-real"}) == {}
    assert len(log) == 1 and "skipped: no SmolLM2 build" in log[0] and "make demo" in log[0]


@pytest.mark.slow
def test_real_rows_on_a_tiny_compiled_stand_in_build(fixture_path, tmp_path, monkeypatch):
    """The SmolLM2 path end to end on a tiny export laid out as make demo's build (tlm with
    K=0, dlm, tlm-base): the workloads, the three decoders, the results files."""
    import json
    import subprocess
    import sys

    from demo import real_demo
    from specdec_compile.runtime import OrtBackend
    src = fixture_path("llama_gqa")
    for name, args in (("tlm", ["--role", "tlm", "--k", "4", "--k-list", "0,1,2,4"]), ("dlm", ["--role", "dlm"]),
                       ("tlm-base", ["--role", "dlm"])):
        res = subprocess.run([sys.executable, "-m", "specdec_compile.cli", str(src), *args, "--target", "ort",
                              "--ctx-len", "128", "-o", str(tmp_path / name)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-800:]
    (tmp_path / "tokenizer").mkdir()
    tok = WordTok()
    tok.eos_token_id = None
    small = tok._ids
    tok._ids = lambda text: [i % 200 + 3 for i in small(text)]    # within the fixture's 211 ids
    monkeypatch.setattr(real_demo, "open_backends", lambda out, threads: (
        tok, *(OrtBackend(out / d, intra_op_threads=1) for d in ("tlm", "dlm", "tlm-base"))))
    monkeypatch.setattr(suffix, "REAL_RESULTS", tmp_path / "results-suffix-real.json")
    log: list[str] = []
    a = SimpleNamespace(real_out=tmp_path, ort_threads=1, suffix_real_prompts=2, suffix_real_functions=1,
                        suffix_real_new_tokens=10, suffix_real_repeats=1, log=log.append)
    out = suffix.run_real(a, {"suffix"})
    rows = out["suffix_drafts_real"]
    assert [(r["workload"], r["draft"]) for r in rows] == [(w, d) for w in ("demo_instructions", "repeated")
                                                          for d in ("none", "ngram", "suffix")]
    assert all(r["tokens_per_tlm_call"] >= 1.0 for r in rows) and rows[3]["prompts"] == 3
    js = json.loads((tmp_path / "results-suffix-real.json").read_text())
    assert js["rows"] == rows and js["settings"]["k_list"] == [0, 1, 2, 4]
    md = (tmp_path / "results-suffix-real.md").read_text()
    assert "SmolLM2" in md and "| repeated | suffix |" in md and "grounded/free not measured" in md


@pytest.mark.skipif(suffix.real_build_missing(REAL) is not None,
                    reason="the real model is not built here (make demo builds build/demo; tests never download it)")
def test_real_rows_on_smollm2_when_built():
    a = SimpleNamespace(ort_threads=1, suffix_real_prompts=1, suffix_real_functions=1, suffix_real_new_tokens=8,
                        suffix_real_repeats=1, log=lambda m: None)
    rows, info = suffix.bench_suffix_real(REAL, a)
    assert [r["draft"] for r in rows] == ["none", "ngram", "suffix"] * 2 and 0 in info["k_list"]
