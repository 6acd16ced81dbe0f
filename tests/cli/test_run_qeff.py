"""``specdec-run --compare`` and QEfficient's run-side options (--generation-len, --prompt "a|b",
--prompts-txt-file-path, --device-group, --full-batch-size) on tiny exports (ONNX Runtime)."""
from __future__ import annotations

import json

import pytest
from runtime_helpers import make_tokenizer, one_line_error, run

from specdec_compile import cli as compile_cli
from specdec_compile.runtime import backends

IDS = "1,5,9,33,7,100,42,17,3,8,55"
IDS2 = "5,9,33,7,5,9"


@pytest.fixture(scope="module")
def pair(fixture_path, tmp_path_factory):
    """(tlm k=4, dlm, tlm batch 2, tokenizer): llama_gqa drafting for itself (acceptance 1)."""
    root = tmp_path_factory.mktemp("run_qeff")
    shape = ["--prefill-len", "8", "--ctx-len", "64", "--target", "ort"]
    outs = {}
    for name, extra in (("tlm", ["--role", "tlm", "--k", "4"]), ("dlm", ["--role", "dlm"]),
                        ("tlm_b2", ["--role", "tlm", "--k", "4", "--batch-size", "2"])):
        outs[name] = root / name
        assert compile_cli.main([str(fixture_path("llama_gqa"))] + shape + extra + ["-o", str(outs[name])]) == 0
    return outs["tlm"], outs["dlm"], outs["tlm_b2"], make_tokenizer(root / "tok")


# --------------------------------------------------------------------------- --compare

def test_compare_json_reports_both_runs_on_the_same_prompts(pair, capsys):
    tlm, dlm, _, _ = pair
    code, out, err = run(["--tlm", tlm, "--dlm", dlm, "--prompt-ids", IDS, "--prompt-ids", IDS2,
                          "--max-new-tokens", 16, "--eos-id", -1, "--compare", "--json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    t, s = rep["target_only"], rep["speculative"]
    for r in (t, s):
        assert r["new_tokens"] == 32
        for key in ("ttft_s", "decode_tokens_per_s", "total_tokens_per_s", "e2e_s"):
            assert r[key] > 0
        assert r["total_tokens_per_s"] == pytest.approx(r["new_tokens"] / r["e2e_s"])
    assert t["mean_tokens_per_tlm_call"] == 1
    assert s["mean_tokens_per_tlm_call"] > 2          # the draft is the target itself: every draft accepted
    assert rep["speedup"] == pytest.approx(s["total_tokens_per_s"] / t["total_tokens_per_s"])
    assert rep["greedy"] is True and rep["identical"] is True and rep["differing_prompts"] == []
    res = rep["results"]
    assert [r["prompt_ids"] for r in res["target_only"]] == [r["prompt_ids"] for r in res["speculative"]]
    assert [r["generated_ids"] for r in res["target_only"]] == [r["generated_ids"] for r in res["speculative"]]
    # the target-only side is what --target-only alone generates
    code, out2, _ = run(["--tlm", tlm, "--target-only", "--prompt-ids", IDS, "--prompt-ids", IDS2,
                         "--max-new-tokens", 16, "--eos-id", -1, "--json"], capsys)
    assert [r["generated_ids"] for r in json.loads(out2)["results"]] == \
        [r["generated_ids"] for r in res["target_only"]]


def test_compare_text_report_and_sampling(pair, capsys):
    tlm, dlm, _, tok = pair
    code, out, err = run(["--tlm", tlm, "--draft", "ngram", "--tokenizer", tok, "--prompt", "w5 w9 w33 w5 w9",
                          "--max-new-tokens", 8, "--compare"], capsys)
    assert code == 0, err
    assert out.startswith("w5 w9 w33 w5 w9")           # the text, then the report
    for label in ("TTFT (s)", "decode (tokens/s)", "total (tokens/s)", "E2E (s)", "tokens per target call",
                  "speedup (total tokens/s): ", "greedy outputs identical: yes"):
        assert label in out, label
    assert "target-only" in out and "speculative" in out
    # sampling: one seed for both runs, given or drawn; the texts are not compared
    code, out, err = run(["--tlm", tlm, "--dlm", dlm, "--prompt-ids", IDS, "--max-new-tokens", 6, "--compare",
                          "--json", "--temperature", "0.8"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["greedy"] is False and rep["identical"] is None and isinstance(rep["seed"], int)
    # (without --seed a plain sampled run drew a 128-bit seed and was refused: "seed must be ... < 2**64")
    code, _, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", IDS, "--max-new-tokens", 3,
                        "--temperature", "0.8"], capsys)
    assert code == 0, err


def test_compare_says_when_greedy_outputs_differ():
    from specdec_compile.runtime.compare import compare_runs, format_report
    from specdec_compile.runtime.metrics import GenerationResult, Meter

    def result(ids):
        m = Meter(4, record_calls=False)
        m.first_token()
        return GenerationResult([1, 2], ids, ["target"] * len(ids), "max_new_tokens",
                                metrics=m.metrics(len(ids), speculative=False))

    rep = compare_runs(([result([5, 6]), result([7, 8])], 1.0), ([result([5, 6]), result([7, 9])], 0.5),
                       greedy=True)
    assert rep["identical"] is False and rep["differing_prompts"] == [1]
    assert rep["speedup"] == pytest.approx(2.0)
    assert "greedy outputs identical: NO (prompt 2 differs)" in format_report(rep)


def test_compare_bad_inputs(pair, capsys):
    tlm, dlm, _, _ = pair
    one_line_error(*run(["--tlm", tlm, "--target-only", "--prompt-ids", IDS, "--compare"], capsys)[::2],
                   "--compare", "--target-only")
    one_line_error(*run(["--tlm", tlm, "--prompt-ids", IDS, "--compare"], capsys)[::2], "--dlm")


# --------------------------------------------------------------------------- QEfficient's words

def test_generation_len_is_max_new_tokens(pair, capsys):
    tlm, _, _, _ = pair
    base = ["--tlm", tlm, "--target-only", "--prompt-ids", IDS, "--eos-id", -1, "--json"]
    code, out, err = run(base + ["--generation-len", 7], capsys)
    assert code == 0, err
    assert len(json.loads(out)["results"][0]["generated_ids"]) == 7
    code, out, err = run(base, capsys)          # the default is still 128: more than the context holds here
    assert code == 0 and json.loads(out)["results"][0]["metrics"]["stop_reason"] == "ctx_len"
    one_line_error(*run(base + ["--generation-len", 7, "--max-new-tokens", 7], capsys)[::2],
                   "--generation-len", "not both")
    one_line_error(*run(base + ["--generation-len", -1], capsys)[::2], "--generation-len must be >= 0")
    one_line_error(*run(base + ["--max-new-tokens", -1], capsys)[::2], "--max-new-tokens must be >= 0")


def test_pipe_separated_prompts_and_a_literal_pipe(pair, capsys):
    from specdec_compile.cli.qeff_words import split_prompts
    from specdec_compile.errors import SpecdecError
    assert split_prompts(["a|b", "c"]) == ["a", "b", "c"]       # repeated --prompt still works
    assert split_prompts(["x \\| y"]) == ["x | y"]
    assert split_prompts(["one"]) == ["one"]
    with pytest.raises(SpecdecError, match="empty prompt"):
        split_prompts(["a||b"])
    tlm, _, _, tok = pair
    base = ["--tlm", tlm, "--target-only", "--tokenizer", tok, "--max-new-tokens", 3, "--json"]
    code, out, err = run(base + ["--prompt", "w5 w9|w33 w7", "--prompt", "w100"], capsys)
    assert code == 0, err
    texts = [r["prompt_ids"] for r in json.loads(out)["results"]]
    assert texts == [[5, 9], [33, 7], [100]]
    code, out, err = run(base + ["--prompt", "w5 \\| w9"], capsys)   # one prompt; | is not a word here: <unk>
    assert code == 0, err
    assert [r["prompt_ids"] for r in json.loads(out)["results"]] == [[5, 0, 9]]
    one_line_error(*run(base + ["--prompt", "w5|"], capsys)[::2], "empty prompt", "\\|")


def test_prompts_txt_file_path_one_prompt_a_line(pair, capsys, tmp_path):
    tlm, _, _, tok = pair
    f = tmp_path / "prompts.txt"
    f.write_text("w5 w9\n\n  w33 w7 \nw100\n")
    base = ["--tlm", tlm, "--target-only", "--tokenizer", tok, "--max-new-tokens", 3, "--json"]
    code, out, err = run(base + ["--prompts-txt-file-path", f], capsys)
    assert code == 0, err
    assert [r["prompt_ids"] for r in json.loads(out)["results"]] == [[5, 9], [33, 7], [100]]
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    one_line_error(*run(base + ["--prompts-txt-file-path", blank], capsys)[::2], "no prompts")
    one_line_error(*run(base + ["--prompts-txt-file-path", tmp_path / "none.txt"], capsys)[::2], "cannot read")
    one_line_error(*run(base + ["--prompts-txt-file-path", f, "--prompt", "w5"], capsys)[::2], "not allowed")


def test_device_group_is_the_tlm_device_ids(pair, capsys, monkeypatch):
    tlm, dlm, _, _ = pair
    seen = []
    real = backends.open_backend

    def spy(art, kind="ort", *, device_ids=None, **kw):
        seen.append((kw.get("expect_role"), device_ids))
        return real(art, kind, device_ids=device_ids, **kw)

    monkeypatch.setattr(backends, "open_backend", spy)
    base = ["--tlm", tlm, "--dlm", dlm, "--prompt-ids", IDS, "--max-new-tokens", 2, "--json"]
    for group in ("[0]", "0"):
        seen.clear()
        code, _, err = run(base + ["--device-group", group], capsys)
        assert code == 0, err
        assert seen == [("tlm", [0]), ("dlm", None)]
    cases = [(["--device-group", "[0,1"], "unbalanced"), (["--device-group", "[a]"], "--device-group: expected"),
             (["--device-group", "[]"], "--device-group: expected"),
             (["--device-group", "0", "--tlm-device-ids", "0"], "not both"),
             (["--device-group", "[-1]"], "device ids")]
    for extra, needle in cases:
        code, _, err = run(base + extra, capsys)
        one_line_error(code, err, needle)
        if extra[1] != "0":     # the flag the user gave, not the one it stands for
            assert "--tlm-device-ids" not in err, err


def test_full_batch_size_checks_the_compiled_batch(pair, capsys):
    tlm, _, tlm_b2, _ = pair
    base = ["--target-only", "--prompt-ids", IDS, "--prompt-ids", IDS2, "--max-new-tokens", 3, "--json"]
    code, out, err = run(["--tlm", tlm_b2, "--full-batch-size", 2] + base, capsys)
    assert code == 0, err
    assert json.loads(out)["metrics"]["batch_size"] == 2
    one_line_error(*run(["--tlm", tlm, "--full-batch-size", 2] + base, capsys)[::2],
                   "--full-batch-size 2", "batch size 1", "--batch-size 2")
    one_line_error(*run(["--tlm", tlm, "--full-batch-size", 0] + base, capsys)[::2], ">= 1")
