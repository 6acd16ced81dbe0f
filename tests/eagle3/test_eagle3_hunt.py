"""Defects found in ``import-head`` by a hostile-input hunt, each pinned: config values and safetensors
headers that crashed (exit 3) instead of one line, weights that became infinite after the float32
cast, aux ids listed out of order compiled in the listed order (vLLM concatenates them in layer
order), parent directories of OUT left behind by a refusal, and stale test paths in the docs."""
from __future__ import annotations

import json
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from eagle3_models import DATA, target_export
from specdec_compile import cli
from specdec_compile.eagle3.checkpoint import read_checkpoint
from specdec_compile.eagle3.importer import target_layers
from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors
from specdec_compile.eagle3.target import Target
from specdec_compile.errors import SpecdecError

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp_path, case="llama"):
    d = tmp_path / "ckpt"
    shutil.copytree(DATA / case, d)
    (d / "reference.npz").unlink()
    return d


def _config(d, **changes):
    cfg = json.loads((d / "config.json").read_text())
    layer = changes.pop("layer", {})
    cfg.update(changes)
    cfg["transformer_layer_config"].update(layer)
    (d / "config.json").write_text(json.dumps(cfg))


def _refused(tmp_path, capsys, ckpt, *needles, out=None, tlm=None):
    out = out or tmp_path / "out"
    tlm = tlm or target_export("eagle3_llama")
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    code = cli.main(["import-head", str(ckpt), "--tlm", str(tlm), "--target", "ort",
                     "-o", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec-compile: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before


def _replace_in_config(d, old: str, new: str):
    text = (d / "config.json").read_text()
    assert old in text
    (d / "config.json").write_text(text.replace(old, new, 1))


# --------------------------------------------------------------------------- config.json

CONFIG_CASES = {
    # OverflowError (exit 3): float() of an integer past float's range
    "eps 10**400": (lambda d: _config(d, layer={"rms_norm_eps": 10 ** 400}), ["rms_norm_eps", "positive number"]),
    "rope_theta 10**400": (lambda d: _config(d, layer={"rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 10 ** 400}}),
                           ["rope_theta", "not a positive number"]),
    "linear factor 10**400": (lambda d: _config(d, layer={"rope_parameters": {"rope_type": "linear",
                                                                              "rope_theta": 1e4,
                                                                              "factor": 10 ** 400}}),
                              ["needs a positive factor"]),
    # ValueError (exit 3): Python refuses to read an integer of more than 4300 digits
    "a 5000-digit integer": (lambda d: _replace_in_config(d, '"intermediate_size": 96',
                                                          '"intermediate_size": 1' + "0" * 5000),
                             ["config.json: not readable JSON"]),
    # RecursionError (exit 3)
    "deeply nested JSON": (lambda d: (d / "config.json").write_text("[" * 100000 + "]" * 100000),
                           ["config.json: not readable JSON"]),
    # a boolean or a float where an integer belongs was read as 1 / 64
    "num_hidden_layers true": (lambda d: _config(d, layer={"num_hidden_layers": True}),
                               ["num_hidden_layers is True, expected a positive integer"]),
    "num_hidden_layers 1.0": (lambda d: _config(d, layer={"num_hidden_layers": 1.0}),
                              ["num_hidden_layers is 1.0, expected a positive integer"]),
    "target_hidden_size 64.0": (lambda d: _config(d, target_hidden_size=64.0),
                                ["target_hidden_size is 64.0, expected null or an integer"]),
    # refused, but with an untrue line: "target_hidden_size 64 differs from the head's hidden size 64"
    "target_hidden_size a string": (lambda d: _config(d, target_hidden_size="64"),
                                    ["target_hidden_size is '64', expected null or an integer"]),
    "use_sliding_window a string": (lambda d: _config(d, layer={"use_sliding_window": "false"}),
                                    ["use_sliding_window is 'false', expected true or false"]),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_config_values_are_refused_in_one_line(tmp_path, capsys, name):
    d = _copy(tmp_path)
    mutate, needles = CONFIG_CASES[name]
    mutate(d)
    _refused(tmp_path, capsys, d, *needles)


def test_a_checkpoint_that_is_a_file_is_not_called_missing(tmp_path, capsys):
    f = tmp_path / "ckpt"
    f.write_text("{}")
    _refused(tmp_path, capsys, f, "is not a directory")


# --------------------------------------------------------------------------- aux ids in another order

def test_aux_ids_out_of_order_are_read_in_layer_order(tmp_path):
    """vLLM (and speculators' data generator) append the aux hidden states while running the layers, in
    ascending order whatever the list's order: fc's input blocks are the layers ascending. The ids
    [4, 1, 2] were compiled as --hidden-states 3,0,1, fc reading layer 3 where it was trained on 0."""
    d = _copy(tmp_path)
    _config(d, eagle_aux_hidden_state_layer_ids=[4, 1, 2])
    ck = read_checkpoint(d)
    t = Target(path=Path("t.onnx"), model=Path("t.onnx"), num_layers=4, hidden_size=64, vocab_size=211,
               file="t.onnx", sha256="0" * 64, exposed=None)
    assert target_layers(ck, t) == ((1, 2, 4), (0, 1, 3))


# --------------------------------------------------------------------------- weights

def test_float64_weights_past_float32_are_refused(tmp_path, capsys):
    """A finite float64 of 1e300 became inf in the float32 head (exit 0, an artifact of NaN logits)."""
    d = _copy(tmp_path)
    t = {k: np.array(v) for k, v in read_safetensors(d / "model.safetensors").items()}
    t["fc.weight"] = t["fc.weight"].astype(np.float64)
    t["fc.weight"][0, 0] = 1e300
    write_safetensors(d / "model.safetensors", t)
    _refused(tmp_path, capsys, d, "'fc.weight'", "float32")


# --------------------------------------------------------------------------- safetensors headers

def _raw(path, text: bytes, data: bytes = b""):
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize("text,data,needle", [
    (b"[" * 100000 + b"]" * 100000, b"", "not JSON"),                                   # RecursionError
    (b'{"x":{"dtype":"F32","shape":[1' + b"0" * 5000 + b'],"data_offsets":[0,4]}}', b"\0" * 4,
     "not JSON"),                                                                        # ValueError
    (b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
     b"\0" * 8, "names 'x' twice"),                                                      # the last one was read
    (b'{"__metadata__":{},"__metadata__":{"a":"b"}}', b"", "names '__metadata__' twice"),
])
def test_hostile_headers_are_one_line_errors(tmp_path, text, data, needle):
    f = _raw(tmp_path / "bad.safetensors", text, data)
    with pytest.raises(SpecdecError) as e:
        read_safetensors(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_header_past_the_limit_is_not_said_to_be_past_the_end(tmp_path, monkeypatch):
    from specdec_compile.eagle3 import safetensors as st
    monkeypatch.setattr(st, "_MAX_HEADER", 16)
    f = _raw(tmp_path / "big.safetensors", json.dumps({"x": {"dtype": "F32", "shape": [1],
                                                              "data_offsets": [0, 4]}}).encode(), b"\0" * 4)
    with pytest.raises(SpecdecError) as e:
        read_safetensors(f)
    assert "larger than" in str(e.value) and "past the end" not in str(e.value)


# --------------------------------------------------------------------------- nothing written

def test_a_refusal_after_the_checks_leaves_no_parent_directories(tmp_path, capsys, monkeypatch):
    """-o a/b/out with torch missing: refused in one line, and a/b not created."""
    tlm = target_export("eagle3_llama")
    monkeypatch.setitem(sys.modules, "torch", None)      # `import torch` now fails
    _refused(tmp_path, capsys, DATA / "llama", "pip install", out=tmp_path / "a" / "b" / "out", tlm=tlm)


# --------------------------------------------------------------------------- docs

def test_the_tests_the_doc_names_exist():
    text = (ROOT / "docs" / "import-head.md").read_text()
    named = set(re.findall(r"tests/[\w/]+\.py", text))
    assert named
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, missing


def test_a_shape_of_huge_dimensions_is_a_one_line_error(tmp_path):
    """[10**3000, 10**3000]: the byte count it implies has 6000 digits, which the message could not
    print (ValueError, exit 3)."""
    big = "1" + "0" * 3000
    text = ('{"x":{"dtype":"F32","shape":[' + big + "," + big + '],"data_offsets":[0,4]}}').encode()
    f = _raw(tmp_path / "big.safetensors", text, b"\0" * 4)
    with pytest.raises(SpecdecError) as e:
        read_safetensors(f)
    assert "bytes for F32" in str(e.value) and len(str(e.value)) < 1000


def test_a_header_of_thousands_of_huge_dimensions_does_not_hang(tmp_path):
    """4000 dimensions of 10**4000 (a 16 MB header): the product of the shape took minutes (killed
    after 120 s); it is bounded by the data size now."""
    import time
    big = "1" + "0" * 4000
    text = ('{"x":{"dtype":"F32","shape":[' + ",".join([big] * 4000) + '],"data_offsets":[0,4]}}').encode()
    f = _raw(tmp_path / "slow.safetensors", text, b"\0" * 4)
    t0 = time.perf_counter()
    with pytest.raises(SpecdecError) as e:
        read_safetensors(f)
    assert time.perf_counter() - t0 < 20 and len(str(e.value)) < 1000
