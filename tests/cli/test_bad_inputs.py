"""Bad inputs: one line naming the problem, exit code 2, no traceback, nothing written."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from models import mlp_model
from specdec_compile import cli


def _run(argv, capsys):
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, err


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def _external(src: Path, dst_dir: Path) -> Path:
    """A copy of ``src`` with its weights in an external data file."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    m = onnx.load(str(src))
    onnx.save(m, str(dst_dir / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=256)
    return dst_dir / "model.onnx"


@pytest.fixture
def mlp(tmp_path):
    p = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), str(p))
    return p


def test_not_a_decoder(mlp, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = _run([str(mlp), "--role", "tlm", "--k", "3", "-o", str(out)], capsys)
    assert code == 2 and "not a decoder LM" in _one_line(err)
    assert not out.exists()


def test_decoder_without_kv_cache(fixture_path, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = _run([str(fixture_path("llama_nocache")), "--role", "dlm", "-o", str(out)], capsys)
    assert code == 2 and "without a KV cache" in _one_line(err)
    assert not out.exists()


def test_truncated_file(fixture_path, tmp_path, capsys):
    data = fixture_path("gpt2").read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[: len(data) // 3])
    out = tmp_path / "out"
    code, err = _run([str(bad), "--role", "tlm", "--k", "3", "-o", str(out)], capsys)
    line = _one_line(err)
    assert code == 2 and "truncated" in line and str(bad) in line
    assert not out.exists()


def test_missing_and_short_external_data(fixture_path, tmp_path, capsys):
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    data = tmp_path / "ext" / "model.onnx.data"
    out = tmp_path / "out"
    payload = data.read_bytes()
    data.write_bytes(payload[:1000])
    code, err = _run([str(model), "--role", "tlm", "--k", "3", "-o", str(out)], capsys)
    assert code == 2 and "external data file" in _one_line(err) and "truncated" in err
    data.unlink()
    code, err = _run([str(model), "--role", "tlm", "--k", "3", "-o", str(out)], capsys)
    assert code == 2 and "missing external data file" in _one_line(err)
    assert not out.exists()


@pytest.mark.parametrize("content", [b"", b"this is not protobuf \x00\xff\xfe"])
def test_garbage_file(tmp_path, capsys, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    code, err = _run([str(bad), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and str(bad) in _one_line(err)


def test_missing_file_and_directory(tmp_path, capsys):
    code, err = _run([str(tmp_path / "nope.onnx"), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "no such file" in _one_line(err)
    code, err = _run([str(tmp_path), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "not a file" in _one_line(err)


@pytest.mark.parametrize("name, rows, offset", [("gpt2", 512, 0), ("opt", 4098, 2)])
def test_ctx_len_past_a_learned_position_table(name, rows, offset, fixture_path, tmp_path, capsys):
    """GPT-2's wpe and OPT's embed_positions (offset by 2) hold so many positions: a longer
    --ctx-len is refused (it would index rows that do not exist); the longest one fits."""
    model, out = fixture_path(name), tmp_path / "out"
    longest = rows - offset
    code, err = _run([str(model), "--role", "tlm", "--k", "3", "--ctx-len", str(longest + 1), "-o", str(out)],
                     capsys)
    line = _one_line(err)
    assert code == 2 and "learned position table" in line and f"--ctx-len {longest} or less" in line
    assert not out.exists()
    assert cli.main([str(model), "--role", "dlm", "--ctx-len", str(longest), "--target", "ort", "-o", str(out)]) == 0


@pytest.mark.parametrize("where", ["supported_ops", "config", "manifest"])
def test_a_directory_where_a_file_is_read(where, fixture_path, tmp_path, capsys):
    """A directory given (or found) where a small file is read: one line naming it, exit 2, never an
    internal error (os.fdopen refuses a directory that os.open opened)."""
    model, out = fixture_path("llama_gqa"), tmp_path / "out"
    if where == "supported_ops":
        argv = [str(model), "--role", "tlm", "--k", "3", "--supported-ops", str(tmp_path), "-o", str(out)]
    elif where == "config":
        (tmp_path / "export").mkdir()
        shutil.copy(model, tmp_path / "export" / "model.onnx")
        (tmp_path / "export" / "config.json").mkdir()
        argv = [str(tmp_path / "export" / "model.onnx"), "--role", "tlm", "--k", "3", "-o", str(out)]
    else:
        assert cli.main([str(model), "--role", "tlm", "--k", "3", "-o", str(tmp_path / "art")]) == 0
        (tmp_path / "art" / "manifest.json").unlink()
        (tmp_path / "art" / "manifest.json").mkdir()
        capsys.readouterr()
        argv = ["verify", str(model), str(tmp_path / "art")]
    code, err = _run(argv, capsys)
    assert code == 2 and "is a directory" in _one_line(err)
    assert not out.exists()


def test_verify_bad_inputs(fixture_path, mlp, tmp_path, capsys):
    code, err = _run(["verify", str(tmp_path / "missing.onnx"), str(fixture_path("gpt2"))], capsys)
    assert code == 2 and "no such file" in _one_line(err)
    code, err = _run(["verify", str(fixture_path("gpt2")), str(mlp)], capsys)
    assert code == 2 and "not a rewritten graph" in _one_line(err)
    code, err = _run(["verify", str(mlp), str(fixture_path("gpt2"))], capsys)
    assert code == 2 and "not a decoder LM" in _one_line(err)


def test_console_script_has_no_traceback(mlp, tmp_path):
    exe = shutil.which("specdec-compile", path=os.path.dirname(sys.executable)) or "specdec-compile"
    res = subprocess.run([exe, str(mlp), "--role", "tlm", "--k", "2", "-o", str(tmp_path / "o")],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.startswith("specdec-compile: error:") and res.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()
