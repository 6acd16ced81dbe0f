"""``specdec-compile pair``: defects found by a hunt, each reproduced here first.

- ``--mos 0`` (a valid -mos=0) was dropped as "not given": compile.sh had no -mos=0, pair.json's
  settings.qaic did not record it, and with ``--target ort`` it was not refused;
- ``-o .`` (OUT the current directory) built and published the pair, then exited 2 naming
  ``--pair .`` (the directory the shell stood in had been replaced);
- ``--force`` replaced (deleted) a folder whose ``pair.json`` is not a pair manifest;
- a head pair's ``settings.tlm_options.hidden_states`` said [] while its TLM outputs the
  layers the head reads;
- from Python, ``mxfp6_matmul="no"`` compiled with MX6 (and recorded "no"); ``tlm=None`` was a
  TypeError.
"""
from __future__ import annotations

import json

import pytest

from eagle3_models import DATA, target_export
from pair_models import pair
from specdec_compile.errors import SpecdecError

SHAPES = ["--k", "3", "--prefill-len", "8", "--ctx-len", "64"]


def _ngram(out, *extra):
    return ["--tlm", target_export("eagle3_llama"), "--draft", "ngram", *SHAPES, *extra, "-o", out]


def _one_line(code, err):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_mos_zero_is_applied_and_recorded(tmp_path, capsys):
    out = tmp_path / "p"
    code, _, err = pair(_ngram(out, "--target", "qaic", "--mos", "0", "--quiet"), capsys)
    assert code == 0, err
    m = json.loads((out / "pair.json").read_text())
    assert m["settings"]["qaic"] == {"mos": 0}
    assert m["settings"]["tlm_options"]["mos"] == 0
    assert "-mos=0" in (out / "tlm" / "compile.sh").read_text()
    code, _, err = pair(_ngram(tmp_path / "o", "--target", "ort", "--mos", "0"), capsys)
    _one_line(code, err)
    assert "--mos 0" in err and "--target qaic" in err and not (tmp_path / "o").exists()


def test_output_the_current_directory_is_refused(tmp_path, capsys, monkeypatch):
    """OUT would be removed and renamed under the shell standing in it: refused, nothing written."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, _, err = pair(_ngram(".", "--target", "ort"), capsys)
    _one_line(code, err)
    assert "current directory" in err
    assert list(here.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_output_holding_the_current_directory_is_refused(tmp_path, capsys, monkeypatch):
    out = tmp_path / "p"
    code, _, err = pair(_ngram(out, "--target", "ort", "--quiet"), capsys)
    assert code == 0, err
    before = sorted(p.name for p in out.rglob("*"))
    monkeypatch.chdir(out / "tlm")
    other_k = ["--tlm", target_export("eagle3_llama"), "--draft", "ngram", "--k", "2", *SHAPES[2:]]   # another pair
    code, _, err = pair([*other_k, "--target", "ort", "--force", "-o", ".."], capsys)
    _one_line(code, err)
    assert "current directory" in err and sorted(p.name for p in out.rglob("*")) == before
    monkeypatch.chdir(tmp_path)
    code, text, err = pair(_ngram("p", "--target", "ort"), capsys)    # the same pair: still a cache hit
    assert code == 0 and text.startswith("cached: "), err


def test_force_keeps_a_folder_whose_pair_json_is_not_a_pair(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "pair.json").write_text('{"pairs": [[1, 2]]}\n')
    (out / "data.txt").write_text("precious\n")
    code, _, err = pair(_ngram(out, "--target", "ort", "--force"), capsys)
    _one_line(code, err)
    assert "holds a pair.json that is not a readable one of specdec-compile pair" in err
    assert sorted(p.name for p in out.iterdir()) == ["data.txt", "pair.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_force_with_a_damaged_pair_json_says_so(tmp_path, capsys):
    """A truncated pair.json was reported as "holds no pair.json": the folder holds one, unreadable."""
    out = tmp_path / "p"
    code, _, err = pair(_ngram(out, "--target", "ort", "--quiet"), capsys)
    assert code == 0, err
    text = (out / "pair.json").read_text()
    (out / "pair.json").write_text(text[: len(text) // 2])
    before = sorted(p.name for p in out.rglob("*"))
    code, _, err = pair(_ngram(out, "--target", "ort", "--force"), capsys)
    _one_line(code, err)
    assert "holds a pair.json that is not a readable one" in err and "remove" in err
    assert sorted(p.name for p in out.rglob("*")) == before


def test_python_api_refuses_bool_ish_and_missing_values(tmp_path):
    from specdec_compile.pair.build import PairRequest, build_pair
    tlm = str(target_export("eagle3_llama"))
    cases = ((dict(tlm=tlm, mxfp6_matmul="no"), "mxfp6_matmul must be True or False"),
             (dict(tlm=tlm, mxint8_kv_cache=1), "mxint8_kv_cache must be True or False"),
             (dict(tlm=tlm, aic_enable_depth_first="yes"), "aic_enable_depth_first must be True or False"),
             (dict(tlm=None), "tlm must be a path"),
             (dict(tlm=tlm, draft="model", dlm=5), "dlm must be a path"))
    for kw, words in cases:
        with pytest.raises(SpecdecError, match=words):
            build_pair(PairRequest(**{"draft": "ngram", "k": 3, "prefill_len": 8, "ctx_len": 64, **kw}),
                       tmp_path / "out")
    with pytest.raises(SpecdecError, match="output must be a path"):
        build_pair(PairRequest(tlm=tlm, draft="ngram", k=3, prefill_len=8, ctx_len=64), None)
    assert list(tmp_path.iterdir()) == []


def test_head_pair_records_the_layers_its_tlm_outputs(tmp_path, capsys):
    """settings.tlm_options is what the TLM was compiled with: the head's layers (aux ids 1, 2, 4);
    the same command again is still a cache hit, and a pair.json edited there is none."""
    out = tmp_path / "head"
    argv = ["--tlm", target_export("eagle3_llama"), "--head", DATA / "llama", *SHAPES, "--target", "ort", "-o", out]
    code, _, err = pair([*argv, "--quiet"], capsys)
    assert code == 0, err
    m = json.loads((out / "pair.json").read_text())
    tlm = json.loads((out / "tlm" / "manifest.json").read_text())
    assert tlm["hidden_states"]["layer_indices"] == [0, 1, 3]
    assert m["settings"]["tlm_options"]["hidden_states"] == [0, 1, 3]
    code, text, err = pair(argv, capsys)
    assert code == 0 and text.startswith("cached: "), (text, err)
    m["settings"]["tlm_options"]["hidden_states"] = [0, 1, 2]
    (out / "pair.json").write_text(json.dumps(m))
    code, _, err = pair(argv, capsys)
    _one_line(code, err)
    assert "edited or incomplete" in err


def test_device_group_with_spaces_is_every_device(tmp_path, capsys):
    """QEfficient's --device-group [0 1] (space-separated, as specdec-run's device ids take them) was read
    as the digits joined: device 1 alone ([1 2 3]: device 123), the TLM compiled for one device."""
    from specdec_compile.cli.qeff_words import device_group
    assert device_group("[0 1]") == (0, 1) and device_group("1 2 3") == (1, 2, 3)
    assert device_group(" [0, 1] ") == (0, 1)
    for bad in ("[0,1,]", "[+1]", "[\u0661]", "[0;1]"):
        with pytest.raises(SpecdecError, match="expected device ids"):
            device_group(bad)
    out = tmp_path / "p"
    code, _, err = pair(_ngram(out, "--target", "qaic", "--device-group", "[0 1]", "--quiet"), capsys)
    assert code == 0, err
    m = json.loads((out / "pair.json").read_text())
    assert m["settings"]["qaic"]["device_group"] == [0, 1] and m["settings"]["tlm_options"]["num_devices"] == 2


def test_a_model_that_is_neither_file_nor_folder(tmp_path, capsys):
    """/dev/null was "a folder with no model in it"."""
    code, _, err = pair(["--tlm", "/dev/null", "--draft", "ngram", *SHAPES, "--target", "ort", "-o", tmp_path / "o"],
                        capsys)
    _one_line(code, err)
    assert "not a regular file or a folder" in err and not (tmp_path / "o").exists()
