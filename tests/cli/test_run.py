"""``specdec-run``: output, --json, prompts, and every bad input as one line + exit 2."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import make_tokenizer, one_line_error, run

import models
from specdec_compile import cli as compile_cli
from specdec_compile.cli import run as run_cli

PL, CL = 8, 64
IDS = [1, 5, 9, 33, 7, 100, 42, 17, 3, 8, 55]


@pytest.fixture(scope="module")
def arts(fixture_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("rt_cli")
    made = {}

    def get(name, role, target="ort", k=None, ctx=CL, pl=PL, batch=1):
        key = (name, role, target, k, ctx, pl, batch)
        if key not in made:
            out = root / "-".join(str(x) for x in key if x is not None)
            argv = [str(fixture_path(name)), "--role", role, "--target", target, "--prefill-len", str(pl),
                    "--ctx-len", str(ctx), "--batch-size", str(batch), "-o", str(out)]
            if k is not None:
                argv += ["--k", str(k)]
            assert compile_cli.main(argv) == 0
            made[key] = out
        return made[key]

    made["tok"] = make_tokenizer(root / "tok")
    return get, made["tok"], root


def test_json_output_matches_the_api(arts, capsys):
    get, tok, _ = arts
    code, out, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("gpt2", "dlm"), "--tokenizer", tok,
                          "--prompt-ids", ",".join(map(str, IDS)), "--max-new-tokens", 20, "--json",
                          "--eos-id", -1], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == {"results", "metrics"}
    (r,) = obj["results"]
    assert r["prompt_ids"] == IDS and len(r["generated_ids"]) == 20
    assert r["text"] == " ".join(f"w{i}" for i in r["generated_ids"] if i > 2)
    for key in ("ttft_s", "decode_tokens_per_s", "acceptance_rate", "mean_tokens_per_tlm_call",
                "acceptance_histogram", "dlm_time_s", "tlm_time_s", "host_time_s", "new_tokens"):
        assert key in r["metrics"] and key in obj["metrics"]
    # the same ids as target-only and as the Python API
    code, out2, _ = run(["--tlm", get("llama_gqa", "tlm", k=4), "--target-only", "--prompt-ids",
                         ",".join(map(str, IDS)), "--max-new-tokens", 20, "--json", "--eos-id", -1], capsys)
    assert code == 0 and json.loads(out2)["results"][0]["generated_ids"] == r["generated_ids"]


def test_text_prompts_stream_plain_and_metrics_on_stderr(arts, capsys, tmp_path):
    get, tok, _ = arts
    pf = tmp_path / "prompts.txt"
    pf.write_text("w5 w9 w33 w7\n<endofprompt>\nw100 w42 w17\n<endofprompt>\n\n")
    code, out, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("llama_gqa", "dlm"),
                          "--tokenizer", tok, "--prompt-file", pf, "--max-new-tokens", 12], capsys)
    assert code == 0, err
    assert "w5 w9 w33 w7" in out and "w100 w42 w17" in out and "[prompt 2/2]" in out
    assert "\x1b[" not in out                      # plain when not a terminal
    assert "acceptance rate: 1" in err and "decode tokens/s" in err
    code, out, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("llama_gqa", "dlm"),
                          "--tokenizer", tok, "--prompt-file", pf, "--max-new-tokens", 12, "--json"], capsys)
    assert len(json.loads(out)["results"]) == 2 and json.loads(out)["metrics"]["prompts"] == 2


def test_eos_ends_the_text_and_is_in_the_ids(arts, capsys):
    get, tok, _ = arts
    args = ["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("llama_gqa", "dlm"), "--prompt-ids",
            ",".join(map(str, IDS)), "--max-new-tokens", 20, "--json"]
    code, out, _ = run(args + ["--eos-id", -1], capsys)
    ids = json.loads(out)["results"][0]["generated_ids"]
    eos = ids[3]
    code, out, _ = run(args + ["--eos-id", eos], capsys)
    r = json.loads(out)["results"][0]
    assert r["generated_ids"] == ids[: ids.index(eos) + 1] and r["metrics"]["stop_reason"] == "eos"


def test_sampling_options_and_copy_cache(arts, capsys):
    get, tok, _ = arts
    args = ["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("gpt2", "dlm"), "--prompt-ids", "1,5,9",
            "--max-new-tokens", 15, "--temperature", 0.8, "--top-k", 20, "--top-p", 0.9, "--seed", 3, "--json"]
    code, a, err = run(args, capsys)
    assert code == 0, err
    code, b, _ = run(args + ["--copy-cache"], capsys)
    assert json.loads(a)["results"][0]["generated_ids"] == json.loads(b)["results"][0]["generated_ids"]


# ----------------------------------------------------------------------------- bad inputs

@pytest.fixture(scope="module")
def other_vocab_dlm(arts, tmp_path_factory):
    """A DLM artifact of a model with another vocabulary (97 tokens)."""
    get, _, root = arts
    name = "rt_llama_vocab97"
    if name not in models.CONFIGS:
        cfg = json.loads(json.dumps(models.CONFIGS["llama_gqa"]))
        cfg["config"]["vocab_size"] = 97
        models.CONFIGS[name] = cfg
    src = models.export_fixture(name)
    out = root / "dlm-vocab97"
    if not out.exists():
        assert compile_cli.main([str(src), "--role", "dlm", "--target", "ort", "--prefill-len", str(PL),
                                 "--ctx-len", str(CL), "-o", str(out)]) == 0
    return out


def test_another_table_size_is_no_mismatch(arts, other_vocab_dlm, capsys):
    """A DLM with 97 rows and a TLM with 211 share the manifests' token ids: they run
    (issue 14), and the output is the target's."""
    get, tok, _ = arts
    common = ["--tlm", get("llama_gqa", "tlm", k=4), "--prompt-ids", "1,2,150,3", "--max-new-tokens", 15,
              "--json", "--eos-id", -1]
    code, out, err = run(common + ["--dlm", other_vocab_dlm], capsys)
    assert code == 0, err
    code, base, _ = run(common + ["--target-only"], capsys)
    assert json.loads(out)["results"][0]["generated_ids"] == json.loads(base)["results"][0]["generated_ids"]


def test_different_tokenizers(arts, capsys, tmp_path):
    get, tok, _ = arts
    base = ["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("gpt2", "dlm"), "--prompt", "w5 w9",
            "--tokenizer", tok]
    code, _, err = run(base + ["--dlm-tokenizer", make_tokenizer(tmp_path / "swapped", swap=True)], capsys)
    one_line_error(code, err, "tokenizers differ")
    code, _, err = run(base + ["--dlm-tokenizer", make_tokenizer(tmp_path / "small", n=150)], capsys)
    assert code == 0, err      # a shorter tokenizer that agrees on the ids it has: compatible (issue 14)
    code, _, err = run(base + ["--dlm-tokenizer", make_tokenizer(tmp_path / "eos", eos="<s>")], capsys)
    one_line_error(code, err, "EOS")
    big = make_tokenizer(tmp_path / "big", n=300)
    code, _, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("gpt2", "dlm"), "--prompt", "w5",
                        "--tokenizer", big], capsys)
    one_line_error(code, err, "300 tokens", "211")


def test_different_eos_in_the_manifests(arts, capsys, tmp_path):
    get, tok, _ = arts
    bad = tmp_path / "dlm"
    shutil.copytree(get("gpt2", "dlm"), bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["eos_token_id"] = 7
    (bad / "manifest.json").write_text(json.dumps(m))
    code, _, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", bad, "--prompt-ids", "1,2,3"], capsys)
    one_line_error(code, err, "different EOS")


@pytest.mark.parametrize("change,needle", [(dict(ctx=32), "context length"), (dict(pl=4), "prefill length"),
                                           (dict(batch=2), "batch size")])
def test_different_shapes(arts, capsys, change, needle):
    get, tok, _ = arts
    code, _, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", get("gpt2", "dlm", **change),
                        "--prompt-ids", "1,2,3"], capsys)
    one_line_error(code, err, needle)


@pytest.mark.parametrize("damage,needle", [
    ("rm specializations.json", "specializations.json: missing"),
    ("rm manifest.json", "manifest.json: missing"),
    ("rm model.onnx", "model.onnx: missing"),
    ("corrupt manifest.json", "corrupt JSON"),
    ("corrupt specializations.json", "corrupt JSON"),
    ("corrupt model.onnx", "cannot load"),
    ("empty specializations.json", "expected"),
])
def test_missing_or_corrupt_artifact_files(arts, capsys, tmp_path, damage, needle):
    get, tok, _ = arts
    bad = tmp_path / "dlm"
    shutil.copytree(get("gpt2", "dlm"), bad)
    op, name = damage.split()
    if op == "rm":
        (bad / name).unlink()
    elif op == "corrupt":
        (bad / name).write_bytes((bad / name).read_bytes()[: 40] + b"\x00garbage")
    else:
        (bad / name).write_text('{"specializations": []}')
    code, _, err = run(["--tlm", get("llama_gqa", "tlm", k=4), "--dlm", bad, "--prompt-ids", "1,2,3"], capsys)
    one_line_error(code, err, needle)


def test_other_bad_inputs(arts, capsys, tmp_path):
    get, tok, _ = arts
    tlm, dlm = get("llama_gqa", "tlm", k=4), get("gpt2", "dlm")
    cases = [
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", ",".join(["5"] * CL)], "does not fit"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,x"], "comma-separated"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,999"], "out of range"),
        (["--tlm", dlm, "--dlm", tlm, "--prompt-ids", "1,2"], "swapped"),
        (["--tlm", tlm, "--dlm", tmp_path / "nope", "--prompt-ids", "1,2"], "no such artifact"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt", "w5"], "--tokenizer"),
        (["--tlm", tlm, "--prompt-ids", "1,2"], "--dlm"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,2", "--backend", "qaic"], "Cloud AI 100 runtime"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,2", "--temperature", "-1"], "temperature"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,2", "--k", "2"], "not compiled"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-ids", "1,2", "--tokenizer", tmp_path], "tokenizer"),
        (["--tlm", tlm, "--dlm", dlm], "required"),
        (["--tlm", tlm, "--dlm", dlm, "--prompt-file", tmp_path / "none.txt"], "cannot read"),
    ]
    for argv, needle in cases:
        code, _, err = run(argv, capsys)
        one_line_error(code, err, needle)


def test_console_script(arts):
    get, tok, _ = arts
    exe = Path(sys.executable).parent / "specdec-run"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "specdec_compile.cli.run"]
    ok = subprocess.run(cmd + ["--tlm", str(get("llama_gqa", "tlm", k=4)), "--dlm", str(get("gpt2", "dlm")),
                               "--tokenizer", str(tok), "--prompt", "w5 w9 w33", "--max-new-tokens", "5"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("w5 w9 w33")
    bad = subprocess.run(cmd + ["--tlm", "/nonexistent", "--target-only", "--prompt-ids", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("specdec-run: error:")


def test_chat_applies_the_chat_template(arts, capsys, tmp_path):
    from transformers import AutoTokenizer
    get, tok, _ = arts
    t = AutoTokenizer.from_pretrained(str(tok), local_files_only=True)
    t.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w3{% endif %}"
    chat_tok = tmp_path / "chat_tok"
    t.save_pretrained(str(chat_tok))
    base = ["--tlm", get("llama_gqa", "tlm", k=4), "--target-only", "--max-new-tokens", 5, "--json"]
    code, out, err = run(base + ["--tokenizer", chat_tok, "--prompt", "w5 w9", "--chat"], capsys)
    assert code == 0, err
    assert json.loads(out)["results"][0]["prompt_ids"] == t("w5 w9 w3")["input_ids"]
    one_line_error(*run(base[:-1] + ["--tokenizer", tok, "--prompt", "w5", "--chat"], capsys)[::2],
                   "no chat template")
    one_line_error(*run(base + ["--tokenizer", chat_tok, "--prompt-ids", "5,9", "--chat"], capsys)[::2],
                   "--chat applies the chat template to text")
    one_line_error(*run(base + ["--prompt", "w5", "--chat"], capsys)[::2], "--chat needs --tokenizer")
