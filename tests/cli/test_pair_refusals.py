"""``specdec-compile pair`` and ``specdec-run --pair`` refuse bad input in one line, exit 2, and leave
nothing behind: a folder with no model, a Hugging Face folder without optimum, a draft with another
tokenizer (its files, or its vocabulary size), a compiled artifact given as a model."""
from __future__ import annotations

import json
import sys

import pytest

from eagle3_models import target_export
from pair_models import OTHER_VOCAB_SPEC, dlm_folder, hf_folder, tlm_folder
from specdec_compile import cli
from specdec_compile.cli import run as run_cli

SHAPES = ["--k", "3", "--prefill-len", "8", "--ctx-len", "64", "--target", "ort"]


def refused(argv, capsys, tmp_path, main=None) -> str:
    """Run, expect exit 2 with one line on stderr and nothing new in tmp_path/work; return the line."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    before = sorted(p.name for p in work.iterdir())
    capsys.readouterr()
    code = (main or (lambda a: cli.main(["pair", *a])))([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in work.iterdir()) == before, "something was left behind"
    return err


def test_folder_with_no_model(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("no model here\n")
    err = refused(["--tlm", empty, "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "out"], capsys, tmp_path)
    assert "a folder with no model" in err and "model.onnx" in err and "config.json" in err


def test_missing_model_and_compiled_artifact(tmp_path, capsys):
    err = refused(["--tlm", tmp_path / "nope", "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "o"],
                  capsys, tmp_path)
    assert "no such file or directory" in err
    art = tmp_path / "art"
    art.mkdir()
    (art / "manifest.json").write_text("{}")
    err = refused(["--tlm", art, "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "o"], capsys, tmp_path)
    assert "a compiled artifact" in err


def test_hf_folder_without_optimum_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "optimum.exporters.onnx", None)   # import fails as if not installed
    err = refused(["--tlm", tlm_folder(), "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "out"],
                  capsys, tmp_path)
    assert "pip install 'specdec-compile[export]'" in err and "Hugging Face folder" in err


def test_draft_with_another_tokenizer(tmp_path, capsys):
    """Same vocabulary size, two ids exchanged: the tokenizers are compared, not only their sizes."""
    err = refused(["--tlm", tlm_folder(), "--dlm", dlm_folder("swap"), *SHAPES, "-o", tmp_path / "work" / "out"],
                  capsys, tmp_path)
    assert "tokenizer differs from the target's" in err and "id 3" in err


@pytest.mark.parametrize("tlm_kind", ["hf", "onnx"])
def test_draft_with_another_vocabulary_size(tmp_path, capsys, tlm_kind):
    """No tokenizer files on the draft's side: the vocabulary sizes (config.json's, or an .onnx
    export's logits) must be equal."""
    tlm = tlm_folder() if tlm_kind == "hf" else target_export("eagle3_llama")
    other = hf_folder("pair-dlm-v199", OTHER_VOCAB_SPEC, tokenizer=None)
    err = refused(["--tlm", tlm, "--dlm", other, *SHAPES, "-o", tmp_path / "work" / "out"], capsys, tmp_path)
    assert "199 tokens" in err and "211" in err and "another tokenizer" in err


def test_not_empty_out_is_kept(tmp_path, capsys):
    out = tmp_path / "work" / "busy"
    out.mkdir(parents=True)
    (out / "mine.txt").write_text("keep me\n")
    err = refused(["--tlm", target_export("eagle3_llama"), "--draft", "ngram", *SHAPES, "-o", out, "--force"],
                  capsys, tmp_path)
    assert "holds no pair.json" in err and (out / "mine.txt").read_text() == "keep me\n"


def _run(argv):
    return run_cli.main(argv)


def test_run_pair_refusals(tmp_path, capsys):
    (tmp_path / "work").mkdir()
    err = refused(["--pair", tmp_path / "nothing", "--prompt-ids", "1,2"], capsys, tmp_path, main=_run)
    assert "--pair" in err and "no such directory" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "pair.json").write_text(json.dumps({"format": "specdec-pair", "format_version": 1, "draft": "model",
                                               "tlm": "../elsewhere", "dlm": "dlm"}))
    err = refused(["--pair", bad, "--prompt-ids", "1,2"], capsys, tmp_path, main=_run)
    assert "relative to the pair directory" in err
    # the pair.json file itself: said so, with the directory to give (it said "no pair.json in it")
    err = refused(["--pair", bad / "pair.json", "--prompt-ids", "1,2"], capsys, tmp_path, main=_run)
    assert "not the directory" in err and f"--pair {bad}" in err
    err = refused(["--pair", bad, "--tlm", bad, "--prompt-ids", "1,2"], capsys, tmp_path, main=_run)
    assert "not both" in err
    err = refused(["--prompt-ids", "1,2"], capsys, tmp_path, main=_run)
    assert "--tlm DIR is required" in err


def test_export_failure_leaves_nothing(tmp_path, capsys):
    """optimum fails on a damaged Hugging Face folder after the scratch directory was made: one line,
    and the scratch directory beside OUT is gone."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tlm_folder() / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    err = refused(["--tlm", broken, "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "deep" / "out"],
                  capsys, tmp_path)
    assert "optimum could not export it" in err


def test_python_api_refuses_bad_requests(tmp_path):
    from specdec_compile.errors import SpecdecError
    from specdec_compile.pair.build import PairRequest, build_pair
    for req, words in ((PairRequest(tlm="x", draft="eagle"), "not one of"),
                       (PairRequest(tlm="x", draft="ngram", target="openvino"), "a pair is for"),
                       (PairRequest(tlm="x", draft="model"), "needs its model"),
                       (PairRequest(tlm="x", draft="ngram", k=0), "k must be")):
        with pytest.raises(SpecdecError, match=words):
            build_pair(req, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_compile_takes_an_optimum_folder_and_says_what_to_run_for_an_hf_folder(tmp_path, capsys):
    """specdec-compile MODEL: an optimum export folder is its model.onnx; a Hugging Face folder is refused
    with the export command and the pair command to run."""
    export = target_export("eagle3_llama")
    capsys.readouterr()
    assert cli.main([str(export.parent), "--role", "tlm", "--k", "3", "--target", "ort", "-o", str(tmp_path / "t"),
                     "--quiet"]) == 0
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["source"]["file"] == "model.onnx"
    argv = [tlm_folder(), "--role", "tlm", "--k", "3", "-o", tmp_path / "work" / "t"]
    err = refused(argv, capsys, tmp_path, main=cli.main)
    assert "a Hugging Face folder" in err and "optimum-cli export onnx" in err and "specdec-compile pair" in err


def test_missing_external_data_and_a_damaged_pair_json(tmp_path, capsys):
    """An export whose external data file is gone is refused naming it; a pair.json whose file records
    are damaged is not trusted (every file hashed again), never a traceback."""
    import shutil

    import onnx
    src = tmp_path / "export"
    shutil.copytree(target_export("eagle3_llama").parent, src)
    m = onnx.load(str(src / "model.onnx"))
    onnx.save_model(m, str(src / "model.onnx"), save_as_external_data=True, location="weights.bin",
                    size_threshold=0)
    out = tmp_path / "work" / "out"
    argv = ["--tlm", src, "--draft", "ngram", *SHAPES, "-o", out]
    capsys.readouterr()
    assert cli.main(["pair", *(str(a) for a in argv)]) == 0
    pj = json.loads((out / "pair.json").read_text())
    assert [f["name"] for f in pj["inputs"]["tlm"]["files"] if f["role"]] == ["weights.bin"]
    for f in pj["inputs"]["tlm"]["files"]:
        f["size"] = "big"          # damaged: not trusted, rehashed; the key is the same
    (out / "pair.json").write_text(json.dumps(pj))
    capsys.readouterr()
    assert cli.main(["pair", *(str(a) for a in argv)]) == 0
    assert capsys.readouterr().out.startswith("cached: ")
    (src / "weights.bin").unlink()
    err = refused(argv, capsys, tmp_path)
    assert "weights.bin" in err and "cannot read" in err


# --------------------------------------------------------------------------- a hand-edited pair.json

@pytest.fixture(scope="module")
def ngram_pair(tmp_path_factory):
    """A built ngram pair (the TLM alone, from an .onnx export): the pair.json the cases below edit."""
    out = tmp_path_factory.mktemp("ngram") / "pair"
    assert cli.main(["pair", "--tlm", str(target_export("eagle3_llama")), "--draft", "ngram", *SHAPES,
                     "-o", str(out), "--quiet"]) == 0
    return out


def _edit(key, value):
    def fn(m, d):
        m[key] = value
    return fn


def _edit_qaic(value):
    def fn(m, d):
        m["settings"]["qaic"] = value
    return fn


def _tlm_link_out(m, d):
    """pair.json untouched; its tlm folder a link to a folder outside the pair directory."""
    import shutil
    shutil.move(str(d / "tlm"), str(d.parent / "elsewhere"))
    (d / "tlm").symlink_to(d.parent / "elsewhere")


# (edit, extra specdec-run arguments, words the one line has); each was a traceback (exit 3) or was
# read as something else (a device_group string ignored, a link leading out of the pair followed)
PAIR_JSON_CASES = {
    "settings a list": (_edit("settings", [1]), [], "settings [1] is not an object"),
    "qaic a string": (_edit_qaic("x"), [], "settings.qaic 'x' is not an object"),
    "device_group a number": (_edit_qaic({"device_group": 5}), ["--backend", "qaic"],
                              "settings.qaic.device_group 5 is not a list"),
    "device_group a string": (_edit_qaic({"device_group": "0,1"}), ["--backend", "qaic"],
                              "settings.qaic.device_group '0,1' is not a list"),
    "no target (--compile)": (lambda m, d: m.pop("target"), ["--compile"], "target None is not one of ort, qaic"),
    "target a list": (_edit("target", ["qaic"]), [], "target ['qaic'] is not one of"),
    "k a string": (_edit("k", "3"), [], "k '3' is not an integer >= 1"),
    "format_version true": (_edit("format_version", True), [], "format_version True"),
    "tlm a link out of the pair": (_tlm_link_out, [], "is not a folder inside the pair directory"),
}


@pytest.mark.parametrize("name", sorted(PAIR_JSON_CASES))
def test_a_damaged_pair_json_is_refused_in_one_line(ngram_pair, tmp_path, capsys, name):
    import shutil
    edit, extra, needle = PAIR_JSON_CASES[name]
    d = tmp_path / "p" / "pair"
    shutil.copytree(ngram_pair, d)
    m = json.loads((d / "pair.json").read_text())
    edit(m, d)
    (d / "pair.json").write_text(json.dumps(m))
    err = refused(["--pair", d, "--prompt-ids", "1,2", "--max-new-tokens", "2", *extra], capsys, tmp_path,
                  main=_run)
    assert needle in err, err


def test_an_edited_pair_json_is_no_cache_hit(ngram_pair, tmp_path, capsys):
    """pair.json says draft suffix where the key stands for ngram: not reported cached ("same settings"),
    refused without --force; --force rebuilds what the command asks for."""
    import shutil
    out = tmp_path / "work" / "pair"
    shutil.copytree(ngram_pair, out)
    m = json.loads((out / "pair.json").read_text())
    m["draft"] = m["settings"]["draft"] = "suffix"
    (out / "pair.json").write_text(json.dumps(m))
    argv = ["--tlm", target_export("eagle3_llama"), "--draft", "ngram", *SHAPES, "-o", out]
    err = refused(argv, capsys, tmp_path)
    assert "holds this pair" in err and "edited or incomplete" in err
    assert cli.main(["pair", *(str(a) for a in argv), "--force", "--quiet"]) == 0
    assert json.loads((out / "pair.json").read_text())["draft"] == "ngram"


def test_a_compiled_artifact_with_its_model_onnx_is_no_model(ngram_pair, tmp_path, capsys):
    """A TLM artifact holds model.onnx too: refused as an artifact up front, not compiled again as if an
    optimum export (which failed only after the TLM was built, naming the rewritten cache)."""
    err = refused(["--tlm", ngram_pair / "tlm", "--draft", "ngram", *SHAPES, "-o", tmp_path / "work" / "o"],
                  capsys, tmp_path)
    assert "a compiled artifact" in err
