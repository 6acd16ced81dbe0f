"""``specdec-compile pair``: the quick start in one command, from Hugging Face folders of tiny random
models (tests/cli/pair_models.py), for a draft model, a speculators EAGLE-3 head and n-gram drafts;
``specdec-run --pair`` runs each, and greedy speculative output equals target-only decoding."""
from __future__ import annotations

import json
import time

import pytest

from eagle3_models import DATA, target_export
from pair_models import dlm_folder, pair, run, tlm_folder
from specdec_compile import cli

SHAPES = ["--k", "3", "--prefill-len", "8", "--ctx-len", "64"]
DRAFTS = {"model": lambda: ["--dlm", dlm_folder()], "head": lambda: ["--head", DATA / "llama"],
          "ngram": lambda: ["--draft", "ngram"]}
PROMPT = "w5 w6 w7 w8 w5 w6 w7"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """built(draft, target="ort") -> (OUT, argv): the pair of the target's HF folder and ``draft``, made once."""
    root = tmp_path_factory.mktemp("pairs")
    made = {}

    def get(draft, target="ort"):
        if (draft, target) not in made:
            out = root / f"{draft}-{target}"
            argv = ["--tlm", tlm_folder(), *DRAFTS[draft](), *SHAPES, "--target", target, "-o", out, "--quiet"]
            assert cli.main(["pair", *(str(a) for a in argv)]) == 0
            made[draft, target] = (out, argv)
        return made[draft, target]

    return get


@pytest.mark.parametrize("draft", sorted(DRAFTS))
def test_one_command_from_hf_folders_runs_and_equals_target_only(built, draft, capsys):
    out, _ = built(draft)
    m = json.loads((out / "pair.json").read_text())
    assert (m["format"], m["format_version"], m["draft"], m["k"], m["target"]) == ("specdec-pair", 1, draft, 3, "ort")
    assert m["tlm"] == "tlm" and (out / "tlm" / "model.onnx").is_file()
    assert m["dlm"] == (None if draft == "ngram" else "dlm")
    assert not (out / "dlm").exists() if draft == "ngram" else (out / "dlm" / "model.onnx").is_file()
    assert m["tokenizer"] == "tokenizer" and (out / "tokenizer" / "tokenizer.json").is_file()
    assert m["inputs"]["tlm"]["kind"] == "hf" and len(m["inputs"]["tlm"]["sha256"]) == 64
    assert all(v["ok"] for v in m["verify"].values()) and set(m["verify"]) == ({"tlm"} | ({"dlm"} if m["dlm"] else set()))
    tlm, dlm = (json.loads((out / d / "manifest.json").read_text()) if (out / d).exists() else None for d in ("tlm", "dlm"))
    assert (tlm["k"], tlm["prefill_len"], tlm["ctx_len"], tlm["batch_size"]) == (3, 8, 64, 1)
    if dlm is not None:
        assert (dlm["prefill_len"], dlm["ctx_len"], dlm["batch_size"]) == (8, 64, 1)
    if draft == "head":   # aux ids 1, 2, 4 of the recorded head: the outputs of target layers 0, 1, 3
        assert tlm["hidden_states"]["layer_indices"] == [0, 1, 3] and dlm["feature_draft"]["eagle3"]
    code, text, err = run(["--pair", out, "--prompt", PROMPT, "--max-new-tokens", 24, "--compare", "--json"], capsys)
    assert code == 0, err
    report = json.loads(text)
    assert report["identical"] is True and report["speculative"]["new_tokens"] == 24
    spec, target = report["results"]["speculative"][0], report["results"]["target_only"][0]
    assert spec["generated_ids"] == target["generated_ids"]
    if draft != "ngram":   # the draft model ran: it proposed drafts, which the target checked
        assert spec["metrics"]["dlm_calls"] > 0 and spec["metrics"]["drafted_tokens"] > 0


def test_second_pair_is_cached_and_force_rebuilds(built, capsys):
    out, argv = built("ngram")
    (out / "tlm").touch()    # mtimes of the pair itself do not matter
    t0 = time.perf_counter()
    code, text, err = pair([a for a in argv if a != "--quiet"], capsys)
    took = time.perf_counter() - t0
    assert code == 0, err
    assert text.startswith("cached: ") and len(text.strip().splitlines()) == 1
    assert took < 10, took     # the goal is < 2 s (docs/pair.md); loose here, the cores are shared
    key = json.loads((out / "pair.json").read_text())["key"]
    code, text, err = pair([a for a in argv if a != "--quiet"] + ["--force"], capsys)
    assert code == 0, err
    assert text.startswith("pair ") and "cached" not in text
    assert json.loads((out / "pair.json").read_text())["key"] == key


def test_other_settings_on_the_same_out_need_force(built, capsys):
    out, argv = built("ngram")
    before = (out / "pair.json").read_text()
    other = [a if a != "3" else "2" for a in argv]      # --k 2
    code, _, err = pair(other, capsys)
    assert code == 2 and "other settings" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert (out / "pair.json").read_text() == before


def test_qaic_pair_writes_compile_sh_for_both(built, capsys, tmp_path, monkeypatch):
    out, _ = built("model", "qaic")
    m = json.loads((out / "pair.json").read_text())
    assert m["target"] == "qaic" and m["compile_scripts"] == ["tlm/compile.sh", "dlm/compile.sh"]
    for d in ("tlm", "dlm"):
        assert (out / d / "compile.sh").is_file() and json.loads((out / d / "manifest.json").read_text())["target"] == "qaic"
    # specdec-run --pair OUT --compile runs both scripts with the compiler it finds: a FAKE one here
    bindir, log = tmp_path / "bin", tmp_path / "ran.txt"
    bindir.mkdir()
    fake = bindir / "qaic-exec"
    fake.write_text('#!/usr/bin/env bash\n# FAKE qaic compiler for tests: records where it ran, compiles nothing\n'
                    'echo "$PWD" >> "$FAKE_QAIC_LOG"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_QAIC_LOG", str(log))
    code, _, err = run(["--pair", out, "--compile"], capsys)
    assert code == 0, err
    ran = log.read_text().split()
    assert len(ran) == 2 and ran[0].startswith(str(out / "tlm")) and ran[1].startswith(str(out / "dlm"))


def test_optimum_folder_and_onnx_file_inputs(tmp_path, capsys):
    """An optimum export folder and an .onnx file are taken as they are (no export)."""
    export = target_export("eagle3_llama")
    for given, kind in ((export.parent, "optimum"), (export, "onnx")):
        out = tmp_path / kind
        code, _, err = pair(["--tlm", given, "--draft", "suffix", *SHAPES, "--target", "ort", "-o", out], capsys)
        assert code == 0, err
        m = json.loads((out / "pair.json").read_text())
        assert m["inputs"]["tlm"]["kind"] == kind and m["draft"] == "suffix"
        code, text, err = run(["--pair", out, "--prompt-ids", "5,6,7,5,6", "--max-new-tokens", 5, "--json"], capsys)
        assert code == 0, err and json.loads(text)["metrics"]["new_tokens"] == 5


def test_cache_key_is_the_content_not_the_mtime(tmp_path, capsys, monkeypatch):
    """A cache hit reads no file whose size and mtime are as recorded; a touched file is hashed
    again (same content: still cached); changed content is another key (refused without --force)."""
    import os
    import shutil

    src = tmp_path / "export"
    shutil.copytree(target_export("eagle3_llama").parent, src)
    out = tmp_path / "pair"
    argv = ["--tlm", src, "--draft", "suffix", *SHAPES, "--target", "ort", "-o", out]
    assert pair(argv, capsys)[0] == 0
    import specdec_compile.model_io as model_io
    real = model_io.sha256_file

    def no_reads(path, *a, **k):
        raise AssertionError(f"read {path} although its size and mtime are as recorded")

    monkeypatch.setattr(model_io, "sha256_file", no_reads)
    code, text, err = pair(argv, capsys)
    assert code == 0 and text.startswith("cached: "), err
    read = []
    monkeypatch.setattr(model_io, "sha256_file", lambda p, *a, **k: read.append(os.path.basename(p)) or real(p, *a, **k))
    st = (src / "config.json").stat()
    os.utime(src / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    code, text, err = pair(argv, capsys)
    assert code == 0 and text.startswith("cached: ") and read == ["config.json"], (err, read)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "note": "changed"}))
    code, _, err = pair(argv, capsys)
    assert code == 2 and "other settings or inputs" in err


def test_batch_pair_of_optimum_folders_runs_every_row(tmp_path, capsys):
    """A default DLM with a batch-2 TLM: pair compiles both at batch 2, and the pair decodes two prompts at
    once with greedy output equal to target-only (supported, not refused at run time)."""
    from models import export_fixture
    out = tmp_path / "b2"
    argv = ["--tlm", target_export("eagle3_llama").parent, "--dlm", export_fixture("llama_gqa").parent, *SHAPES,
            "--batch-size", "2", "--target", "ort", "-o", out]
    code, _, err = pair(argv, capsys)
    assert code == 0, err
    assert {json.loads((out / d / "manifest.json").read_text())["batch_size"] for d in ("tlm", "dlm")} == {2}
    code, text, err = run(["--pair", out, "--prompt-ids", "5,6,7,5,6", "--prompt-ids", "9,10,11", "--max-new-tokens",
                           12, "--compare", "--json"], capsys)
    assert code == 0, err
    report = json.loads(text)
    assert report["identical"] is True and report["speculative"]["new_tokens"] == 24


def test_a_failed_verification_writes_nothing(tmp_path, capsys, monkeypatch):
    """When verify finds the compiled TLM differs from its export, pair exits 1 in one line and OUT is
    not written (the report is forced to fail here: the compiler's output is right)."""
    from specdec_compile.verify.replay import VerifyReport
    monkeypatch.setattr(VerifyReport, "ok", property(lambda self: False))
    out = tmp_path / "work" / "out"
    code, _, err = pair(["--tlm", target_export("eagle3_llama").parent, "--draft", "ngram", *SHAPES, "--target", "ort",
                         "-o", out], capsys)
    assert code == 1 and "differs from its export" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "work").exists()


def test_head_with_int8_weights_runs_and_equals_target_only(built, tmp_path, capsys):
    """--head-weights int8: the imported head's MatMuls are weight-only int8 (the dlm manifest says so,
    pair.json's settings too, and the key differs from the float pair's); greedy output is still the target's."""
    float_out, argv = built("head")
    out = tmp_path / "int8"
    argv = [a if a != float_out else out for a in argv] + ["--head-weights", "int8"]
    code, _, err = pair(argv, capsys)
    assert code == 0, err
    m = json.loads((out / "pair.json").read_text())
    assert m["settings"]["head_weights"] == "int8"
    assert m["key"] != json.loads((float_out / "pair.json").read_text())["key"]
    rec = json.loads((out / "dlm" / "manifest.json").read_text())["feature_draft"]["eagle3"]["weights"]
    assert rec["format"] == "int8" and rec["matmuls"] > 0 and m["verify"]["dlm"]["ok"]
    code, text, err = run(["--pair", out, "--prompt", PROMPT, "--max-new-tokens", 24, "--compare", "--json"], capsys)
    assert code == 0, err
    report = json.loads(text)
    assert report["identical"] is True
    assert report["results"]["speculative"][0]["metrics"]["dlm_calls"] > 0


@pytest.mark.parametrize("words, needle", [
    (["--head", str(DATA / "llama"), "--target", "qaic", "--head-weights", "int8"], "quantizes to ONNX Runtime's "
     "MatMulNBits, which Cloud AI 100 has no precedent for: use --target ort ("),
    (["--draft", "ngram", "--target", "ort", "--head-weights", "int4"], "only --head gives"),
])
def test_head_weights_refused_where_they_cannot_apply(tmp_path, capsys, monkeypatch, words, needle):
    import specdec_compile.pair.export as export
    monkeypatch.setattr(export, "export_hf", lambda *a, **k: pytest.fail("exported"))
    code, _, err = pair(["--tlm", tlm_folder(), *SHAPES, *words, "-o", tmp_path / "out"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert list(tmp_path.iterdir()) == []
