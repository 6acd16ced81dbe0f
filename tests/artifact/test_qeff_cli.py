"""specdec-compile --interface qeff, --mxint8-kv-cache and --qaic-flag, end to end on the llama_gqa
fixture: the artifact, compile.sh and --compile (a FAKE compiler that records its argv), the
manifest's optional keys, and every bad input as one line with exit 2, nothing written."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_writer import _fake_compiler

from specdec_compile.artifact.manifest import Manifest

QEFF = ["--full-batch-size", "4", "--prefill-len", "8", "--ctx-len", "32"]
#: QEfficient's plain SpD interface: no batch_index
QEFF_PLAIN = ["--interface", "qeff", "--batch-size", "2", "--prefill-len", "8", "--ctx-len", "32"]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "specdec_compile", *map(str, args)], capture_output=True,
                          text=True, env=env)


def test_qeff_artifact_with_flags_compiles_with_them(fixture_path, tmp_path):
    out = tmp_path / "tlm"
    r = _cli(fixture_path("llama_gqa"), "--role", "tlm", "--k", "3", "--k-list", "0", *QEFF, "--mxint8-kv-cache",
             "--qaic-flag", "-aic-enable-depth-first", "--qaic-flag", "-mos=1", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["compile_command"][-2:] == ["-aic-enable-depth-first", "-mos=1"]
    m = Manifest.read(out)
    assert m.batch_size == 4 and list(m.specializations) == [8, 1, 4]
    assert m.qeff["num_speculative_tokens"] == [0, 3] and m.qeff["batch_index"] == "batch_index"
    assert m.compile_options == {"mxint8_kv_cache": True, "qaic_flags": ["-aic-enable-depth-first", "-mos=1"]}
    assert "Precision: mxint8" in (out / "custom_io.yaml").read_text()
    assert "Precision: float16" not in (out / "custom_io.yaml").read_text()
    _fake_compiler(tmp_path / "bin", "qaic-compile")  # FAKE: records argv, compiles nothing
    log = tmp_path / "argv.txt"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_QAIC_LOG": str(log)}
    done = subprocess.run(["bash", str(out / "compile.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv = log.read_text().splitlines()[1:]
    assert argv[-2:] == ["-aic-enable-depth-first", "-mos=1"]
    assert "-network-specialization-config=specializations.json" in argv


def test_default_interface_manifest_has_no_new_keys(fixture_path, tmp_path):
    r = _cli(fixture_path("llama_gqa"), "--role", "dlm", "-o", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert "qeff" not in data and "compile_options" not in data


BAD = [
    (["--role", "tlm", "--k", "8", *QEFF], "num_logits_to_keep 9, more than --prefill-len 8"),
    (["--role", "tlm", "--k", "3", "--k-list", "9", *QEFF], "k=9 needs num_logits_to_keep 10"),
    (["--role", "tlm", "--k", "3", "--hidden-states", "-1", *QEFF], "--interface qeff has no hidden-state"),
    (["--role", "tlm", "--k", "3", "--interface", "other"], "invalid choice: 'other'"),
    (["--role", "dlm", "--mxint8-kv-cache", "--target", "ort"], "--mxint8-kv-cache is an option of the Cloud AI 100"),
    (["--role", "dlm", "--qaic-flag", "-mos=1", "--target", "ort"], "--qaic-flag is an option of the Cloud AI 100"),
    (["--role", "dlm", "--mxint8-kv-cache", "--kv-dtype", "float32"], "drop --kv-dtype float32"),
    (["--role", "dlm", "--qaic-flag", "-aic-num-cores=4"], "-aic-num-cores is set by --num-cores"),
    (["--role", "dlm", "--qaic-flag", "-mxfp6-matmul"], "set by --precision mx6"),
    (["--role", "dlm", "--qaic-flag", "-aic-hw-version=2.0"], "set by --hw-version"),
    (["--role", "dlm", "--qaic-flag", "-onnx-define-symbol=ctx_len,512"], "set by the specializations"),
    (["--role", "dlm", "--qaic-flag", "-quantization-precision=Int8"], "set by --precision (the artifact compiles"),
    (["--role", "dlm", "--qaic-flag", "-mos=1;rm -rf x"], "expected one compiler flag"),
    (["--role", "dlm", "--qaic-flag", "mos=1"], "expected one compiler flag"),
    (["--role", "dlm", "--qaic-flag", "-mos=1", "--qaic-flag", "-mos=2"], "mos given twice"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_line_exit_2(fixture_path, tmp_path, args, message):
    r = _cli(fixture_path("llama_gqa"), *args, "-o", tmp_path / "o")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "o").exists()



@pytest.mark.parametrize("role,target,shape", [("tlm", "ort", QEFF), ("dlm", "qaic", QEFF),
                                               ("tlm", "qaic", QEFF_PLAIN), ("dlm", "ort", QEFF_PLAIN)])
def test_verify_checks_a_qeff_graph_against_the_export(fixture_path, tmp_path, role, target, shape):
    """verify feeds a qeff graph batch_index 0..B-1 and num_logits_to_keep = the call's width: the
    default interface's calls, so its report compares with the export as for any artifact."""
    src = fixture_path("llama_gqa")
    k = ["--k", "3"] if role == "tlm" else []
    assert shape[-2] == "--ctx-len"      # verify's scenario needs a context of 64
    r = _cli(src, "--role", role, *k, "--target", target, *shape[:-2], "--ctx-len", "64", "-o", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    v = _cli("verify", src, tmp_path / "a" / "model.onnx")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "PASS" in v.stdout
