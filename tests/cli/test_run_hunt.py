"""``specdec-run`` defects found by a hunt over its command line: each test failed on the old code."""
from __future__ import annotations

import io
import json
import re
import sys

import pytest
from runtime_helpers import one_line_error, run

from specdec_compile import cli as compile_cli

PL, CL = 8, 64


@pytest.fixture(scope="module")
def tlm(fixture_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("rt_hunt") / "tlm"
    assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--target", "ort", "--k", "4",
                             "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out), "--quiet"]) == 0
    return out


def _markup_tokenizer(path):
    """A word-level tokenizer of 211 ids whose words 5 and 9 are rich markup: "[/x]" and "[i]"."""
    from tokenizers import Tokenizer, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 211)}}
    del vocab["w5"], vocab["w9"]
    vocab.update({"[/x]": 5, "[i]": 9})
    t = Tokenizer(tm.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(path))
    return path


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_terminal_output_is_the_text_not_rich_markup(tlm, tmp_path, capsys, monkeypatch):
    """On a terminal the text went through rich's markup: "[prompt 2/2]" and "[i]" vanished (read as
    styles) and "[/x]" (a closing tag with none open) ended the run with an internal error, exit 3."""
    tok = _markup_tokenizer(tmp_path / "tok")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    argv = ["--tlm", tlm, "--target-only", "--tokenizer", tok, "--max-new-tokens", 3, "--eos-id", -1]
    code, plain, err = run(argv + ["--prompt", "w3 [i] w4|w6 [/x] w7"], capsys)
    assert code == 0, err
    term = _Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    code, _, err = run(argv + ["--prompt", "w3 [i] w4|w6 [/x] w7"], capsys)
    assert code == 0, err
    shown = term.getvalue()
    assert "\x1b[" in shown                          # coloured: the terminal path
    assert re.sub(r"\x1b\[[0-9;]*m", "", shown) == plain
    assert "[prompt 2/2]" in plain and "w3 [i] w4" in plain and "w6 [/x] w7" in plain


@pytest.mark.parametrize("ids", ["1_0", "+5", "\u0665", "\uff15", "5,1_0"])
def test_id_lists_take_ascii_integers_only(tlm, capsys, ids):
    """int() reads "1_0" as 10, "+5" and other scripts' digits as 5: the old code ran on a prompt the
    user did not write (and opened the devices "0_1" names as device 1), where --device-group refuses them."""
    code, out, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", ids, "--max-new-tokens", 2], capsys)
    one_line_error(code, err, "--prompt-ids", "integers")
    assert out == ""
    code, _, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", "5", "--tlm-device-ids", ids], capsys)
    one_line_error(code, err, "--tlm-device-ids")


@pytest.mark.parametrize("extra,flag", [
    (["--top-k", 5], "--top-k"), (["--top-p", 0.5], "--top-p"), (["--seed", 3], "--seed"),
    (["--temperature", 0, "--seed", 3], "--seed"), (["--temperature", "1e-6", "--top-k", 5], "--top-k"),
])
def test_sampling_options_without_sampling_are_refused(tlm, capsys, extra, flag):
    """Greedy decoding ignores them: the old code ran greedily with exit 0 (no "seed" recorded), a
    run the user took for a sampled one."""
    code, out, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", "1,5,9", "--max-new-tokens", 2,
                          "--json", *extra], capsys)
    one_line_error(code, err, flag, "greedily")
    assert out == ""
    code, out, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", "1,5,9", "--max-new-tokens", 2,
                          "--json", "--temperature", 0.7, *extra[-2:]], capsys)
    assert code == 0 and "seed" in json.loads(out), err


@pytest.mark.parametrize("extra,flag", [(["--draft", "dlm"], "--draft dlm"), (["--no-fallback"], "--no-fallback")])
def test_draft_options_with_target_only_are_refused(tlm, capsys, extra, flag):
    """--target-only drafts nothing: the old code dropped --draft dlm and --no-fallback without a word
    (as it refuses --k, --draft ngram and --draft hybrid there)."""
    code, out, err = run(["--tlm", tlm, "--target-only", "--prompt-ids", "1,5,9", *extra], capsys)
    one_line_error(code, err, flag, "--target-only")
    assert out == ""


@pytest.mark.parametrize("draft", ["dlm", "hybrid"])
def test_a_draft_model_asked_of_an_ngram_pair(fixture_path, tmp_path_factory, capsys, draft):
    """--pair of an ngram pair with --draft dlm said "--dlm DIR is required" (and --draft hybrid "needs
    --dlm DIR"), options --pair then refuses: the line now says the pair has no draft model."""
    out = tmp_path_factory.getbasetemp() / "hunt-ngram-pair"
    if not (out / "pair.json").is_file():
        assert compile_cli.main(["pair", "--tlm", str(fixture_path("llama_gqa")), "--draft", "ngram", "--k", "3",
                                 "--prefill-len", str(PL), "--ctx-len", str(CL), "--target", "ort", "-o", str(out),
                                 "--quiet"]) == 0
    code, _, err = run(["--pair", out, "--draft", draft, "--prompt-ids", "1,5,9"], capsys)
    one_line_error(code, err, f"--draft {draft}", "ngram pair", "has none")
    assert "--dlm DIR" not in err


@pytest.mark.parametrize("flag", ["--prompt-file", "--prompts-txt-file-path"])
def test_a_byte_order_mark_is_not_prompt_text(tlm, tmp_path, capsys, flag):
    """A UTF-8 byte-order mark (Windows editors write one) became part of the first prompt: "w5" read as
    "\\ufeffw5", an unknown word (id 0), and the run decoded another prompt with exit 0."""
    from runtime_helpers import make_tokenizer
    tok = make_tokenizer(tmp_path / "tok")
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("w5 w9 w33\n", encoding="utf-8")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    argv = ["--tlm", tlm, "--target-only", "--tokenizer", tok, "--max-new-tokens", 4, "--eos-id", -1, "--json"]
    got = []
    for f in (plain, marked):
        code, out, err = run(argv + [flag, f], capsys)
        assert code == 0, err
        got.append(json.loads(out))
    assert got[1]["results"][0]["prompt_ids"] == got[0]["results"][0]["prompt_ids"] == [5, 9, 33]


def test_no_token_means_no_time_to_first_token(tlm, capsys):
    """--max-new-tokens 0 recorded a ttft_s (the generation's whole time) for a token never made."""
    argv = ["--tlm", tlm, "--target-only", "--prompt-ids", "5,9,33", "--max-new-tokens", 0, "--json"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    rec = json.loads(out)
    assert rec["results"][0]["generated_ids"] == []
    assert rec["results"][0]["metrics"]["ttft_s"] is None and rec["metrics"]["ttft_s"] is None
    code, out, err = run(argv[:-3] + ["--max-new-tokens", 2, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["metrics"]["ttft_s"] > 0
