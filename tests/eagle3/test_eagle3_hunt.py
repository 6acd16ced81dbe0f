"""Defects found in ``import-head`` by a hostile-input hunt, each pinned: config values and safetensors
headers that crashed (exit 3) instead of one line, weights that became infinite after the float32
cast, aux ids listed out of order compiled in the listed order (vLLM concatenates them in layer
order), parent directories of OUT left behind by a refusal, and stale test paths in the docs."""
from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from eagle3_models import DATA, copy_case, edit_config, refused_import, target_export
from specdec_compile.eagle3.checkpoint import read_checkpoint
from specdec_compile.eagle3.importer import target_layers
from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors
from specdec_compile.eagle3.target import Target
from specdec_compile.errors import SpecdecError

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkpoint_that_is_a_file_is_not_called_missing(tmp_path, capsys):
    f = tmp_path / "ckpt"
    f.write_text("{}")
    refused_import(tmp_path, capsys, f, "is not a directory")


# --------------------------------------------------------------------------- aux ids in another order

def test_aux_ids_out_of_order_are_read_in_layer_order(tmp_path):
    """vLLM (and speculators' data generator) append the aux hidden states while running the layers, in
    ascending order whatever the list's order: fc's input blocks are the layers ascending. The ids
    [4, 1, 2] were compiled as --hidden-states 3,0,1, fc reading layer 3 where it was trained on 0."""
    d = copy_case(tmp_path)
    edit_config(d, eagle_aux_hidden_state_layer_ids=[4, 1, 2])
    ck = read_checkpoint(d)
    t = Target(path=Path("t.onnx"), model=Path("t.onnx"), num_layers=4, hidden_size=64, vocab_size=211,
               file="t.onnx", sha256="0" * 64, exposed=None)
    assert target_layers(ck, t) == ((1, 2, 4), (0, 1, 3))


# --------------------------------------------------------------------------- weights

def test_float64_weights_past_float32_arerefused_import(tmp_path, capsys):
    """A finite float64 of 1e300 became inf in the float32 head (exit 0, an artifact of NaN logits)."""
    d = copy_case(tmp_path)
    t = {k: np.array(v) for k, v in read_safetensors(d / "model.safetensors").items()}
    t["fc.weight"] = t["fc.weight"].astype(np.float64)
    t["fc.weight"][0, 0] = 1e300
    write_safetensors(d / "model.safetensors", t)
    refused_import(tmp_path, capsys, d, "'fc.weight'", "float32")


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
    (b'{"t2d":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}', b"\x01\x00\x02",
     "BOOL bytes other than 0 and 1"),                                                   # 2 was read as True
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
    refused_import(tmp_path, capsys, DATA / "llama", "pip install", out=tmp_path / "a" / "b" / "out", tlm=tlm)


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


def test_a_compiled_tlm_gives_the_draft_its_shapes(tmp_path, capsys):
    """import-head with a compiled TLM directory wrote a draft of the defaults (ctx 256, PL 32) beside a
    TLM of ctx 64, PL 8, with exit 0; specdec-run then refused the pair. The TLM's values are the
    defaults now, and another batch, context or prefill length is refused in one line, nothing written."""
    from eagle3_models import compile_target
    from specdec_compile import cli
    from specdec_compile.runtime import OrtBackend, SpecDecoder, TargetOnlyDecoder
    tlm = compile_target("llama", tmp_path / "tlm", k=3, prefill_len=8, ctx_len=64)
    out = tmp_path / "head"
    assert cli.main(["import-head", str(DATA / "llama"), "--tlm", str(tlm), "-o", str(out), "--quiet"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert (m["ctx_len"], m["prefill_len"], m["batch_size"], m["target"], m["k"]) == (64, 8, 1, "ort", 3)
    t = OrtBackend(tlm, intra_op_threads=1)
    want = TargetOnlyDecoder(t).generate([1, 5, 9, 33], max_new_tokens=6).generated_ids
    assert SpecDecoder(t, OrtBackend(out, intra_op_threads=1)).generate([1, 5, 9, 33], max_new_tokens=6
                                                                       ).generated_ids == want
    for flag, value in (("--ctx-len", "256"), ("--prefill-len", "32"), ("--batch-size", "2")):
        capsys.readouterr()
        bad = tmp_path / f"bad{flag}"
        assert cli.main(["import-head", str(DATA / "llama"), "--tlm", str(tlm), flag, value, "-o", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"was compiled with {flag}" in err and "\n" not in err and not bad.exists(), err
