"""Hidden states and feature drafts end to end: the CLI's refusals, the
artifact (manifest, specializations, custom IO), and verify against the export."""
from __future__ import annotations

import json

import onnx
import pytest

from feature_draft_models import POST_NORM, export_feature_draft
from models import export_spec
from specdec_compile import cli
from specdec_compile.contract import HIDDEN_STATES_KEY
from specdec_compile.verify import verify

SMALL = ["--prefill-len", "16", "--ctx-len", "64"]


def _err_line(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("model, args, msg", [
    ("gpt2", ["--role", "tlm", "--k", "3", "--hidden-states", "2"], "layer 2 is out of range for a model of 2"),
    ("gpt2", ["--role", "tlm", "--k", "3", "--hidden-states", "-3"], "out of range"),
    ("gpt2", ["--role", "tlm", "--k", "3", "--hidden-states", "0,0"], "names layer 0 twice"),
    ("gpt2", ["--role", "tlm", "--k", "3", "--hidden-states", "1,-1"], "names layer 1 twice"),
    ("gpt2", ["--role", "tlm", "--k", "3", "--hidden-states", "a"], "comma-separated layer indices"),
    ("gpt2", ["--role", "dlm", "--hidden-states", "-1"], "--hidden-states is for the target model"),
    ("gpt2", ["--role", "tlm", "--k", "3", "--feature-layers", "-1"], "--feature-layers is for a feature draft"),
    ("gpt2", ["--role", "dlm", "--k", "3", "--feature-layers", "-1"], "no feature input"),
    ("draft", ["--role", "dlm"], "a feature draft; name the target layers it reads with --feature-layers"),
    ("draft", ["--role", "tlm", "--k", "3"], "compile it with --role dlm --feature-layers"),
    ("draft", ["--role", "dlm", "--feature-layers", "-1"], "--k is required for a feature draft"),
    ("draft", ["--role", "dlm", "--k", "3", "--feature-layers", "1,2,3"], "not a multiple of 3"),
])
def test_bad_hidden_state_options_are_one_line_exit_2_nothing_written(fixture_path, tmp_path, capsys, model,
                                                                      args, msg):
    path = export_feature_draft(1) if model == "draft" else fixture_path(model)
    capsys.readouterr()          # what a first export printed is not the CLI's
    out = tmp_path / "out"
    assert cli.main([str(path), *args, "-o", str(out)]) == 2
    assert msg in _err_line(capsys)
    assert not out.exists()


def test_post_norm_model_refuses_hidden_states_but_compiles_without(tmp_path, capsys):
    path = export_spec("opt-postnorm", POST_NORM)
    capsys.readouterr()
    out = tmp_path / "out"
    assert cli.main([str(path), "--role", "tlm", "--k", "3", "--hidden-states", "-1", "-o", str(out)]) == 2
    assert "post-norm" in _err_line(capsys) and not out.exists()
    assert cli.main([str(path), "--role", "tlm", "--k", "3", "--target", "ort", "-o", str(out)]) == 0


def test_feature_draft_whose_layers_are_not_found_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """A feature draft needs its own last layer's output (draft_hidden_states): where the
    layers finder finds none, the CLI refuses in one line and writes nothing."""
    import specdec_compile.detect as detect
    from specdec_compile.errors import SpecdecError

    def none_found(*a, **k):
        raise SpecdecError("no residual stream found (test)")
    path = export_feature_draft(1)
    capsys.readouterr()
    monkeypatch.setattr(detect, "find_layer_outputs", none_found)
    out = tmp_path / "out"
    assert cli.main([str(path), "--role", "dlm", "--k", "3", "--feature-layers", "-1", "-o", str(out)]) == 2
    line = _err_line(capsys)
    assert "--feature-layers (the draft's own features)" in line and "no residual stream found (test)" in line
    assert not out.exists()


def test_mxint8_cache_leaves_the_features_float16(fixture_path, tmp_path, capsys):
    """--mxint8-kv-cache compresses the retained cache; the hidden states stay float16 (MXINT8 is
    no precision for features the host reads and writes)."""
    out = tmp_path / "tlm"
    assert cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--hidden-states", "-1",
                     "--mxint8-kv-cache", *SMALL, "-o", str(out)]) == 0
    io = (out / "custom_io.yaml").read_text()
    assert "IOName: past_key.0\n   Precision: mxint8" in io
    assert "IOName: hidden_states\n   Precision: float16" in io


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_tlm_hidden_states_artifact_and_verify(fixture_path, tmp_path, capsys, target):
    src = fixture_path("llama_gqa")
    out = tmp_path / "tlm"
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--hidden-states", "-1,0", "--target", target,
                     *SMALL, "-o", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["hidden_states"] == {"layers": [-1, 0], "layer_indices": [1, 0], "hidden_size": 64, "width": 128,
                                  "output": "hidden_states"}
    assert m["interface"]["outputs"][-1] == {"name": "hidden_states", "dtype": "float32",
                                             "shape": ["batch_size", "seq_len", 128]}
    if target == "qaic":  # float16 like the cache
        assert "IOName: hidden_states\n   Precision: float16" in (out / "custom_io.yaml").read_text()
    report = verify(src, out / "model.onnx", k=3, prefill_len=16, ctx_len=64, batch_size=2)
    assert report.ok and 0 < report.max_hidden_diff <= 1e-4


def test_verify_catches_a_hidden_states_output_of_the_wrong_layer(fixture_path, tmp_path, capsys):
    src = fixture_path("gpt2")
    out = tmp_path / "tlm"
    assert cli.main([str(src), "--role", "tlm", "--k", "3", "--hidden-states", "-1", "--target", "ort", *SMALL,
                     "-o", str(out)]) == 0
    m = onnx.load(str(out / "model.onnx"))
    for p in m.metadata_props:
        if p.key == HIDDEN_STATES_KEY:
            p.value = "0"  # claims layer 0; the output holds layer 1
    lying = tmp_path / "lying.onnx"
    onnx.save(m, str(lying))
    report = verify(src, lying, k=3, prefill_len=16, ctx_len=64, batch_size=1)
    assert not report.ok and report.max_hidden_diff > 1e-3


@pytest.mark.parametrize("target", ["qaic", "ort"])
def test_feature_draft_artifact_and_verify(tmp_path, capsys, target):
    src = export_feature_draft(2)
    out = tmp_path / "dlm"
    assert cli.main([str(src), "--role", "dlm", "--feature-layers", "2,-1", "--k", "4", "--k-list", "2",
                     "--target", target, *SMALL, "-o", str(out)]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["specializations"] == [16, 5, 1, 3], "prompt, a round's k+1 accepted tokens, one draft, extra widths"
    assert m["k"] == 4 and m["k_list"] == [2, 4]
    fd = m["feature_draft"]
    assert fd["target_layers"] == [2, -1] and fd["width"] == 128 and fd["draft_width"] == 64
    names_in = [s["name"] for s in m["interface"]["inputs"]]
    names_out = [s["name"] for s in m["interface"]["outputs"]]
    assert names_in[-1] == "hidden_states" and names_out[-1] == "draft_hidden_states"
    assert m["interface"]["inputs"][-1]["shape"] == ["batch_size", "seq_len", 128]
    if target == "qaic":
        io = (out / "custom_io.yaml").read_text()
        assert "IOName: hidden_states\n" in io and "IOName: draft_hidden_states\n" in io
    report = verify(src, out / "model.onnx", k=4, prefill_len=16, ctx_len=64, batch_size=2,
                    widths=m["specializations"])
    assert report.ok and report.role == "dlm" and 0 < report.max_hidden_diff <= 1e-4
    # every specialization is called, the --k-list width 3 included, with its features checked
    assert {c.seq_len for c in report.checks} >= set(m["specializations"])
