"""External weights are referenced, never loaded or re-serialized."""
from __future__ import annotations

import os

import onnx
import pytest

from specdec_compile import cli
from specdec_compile import model_io as io
from specdec_compile.pipeline import rewrite
from specdec_compile.verify import verify
from test_bad_inputs import _external
from specdec_compile.options import Options


def test_rewrite_references_the_same_weights(fixture_path, tmp_path, monkeypatch):
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    # any attempt to load external data into memory fails the test
    import onnx.external_data_helper as edh
    monkeypatch.setattr(edh, "load_external_data_for_model",
                        lambda *a, **k: pytest.fail("external data was loaded"))
    res = rewrite(model, Options(role="tlm", target="ort", k=3))
    ext = list(io.external_tensors(res.model))
    assert ext and all(t.data_location == onnx.TensorProto.EXTERNAL for t in ext)
    assert io.external_data_files(res.model) == ["model.onnx.data"]


def test_artifact_copies_the_data_file_so_onnx_load_reads_it(fixture_path, tmp_path):
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    out = tmp_path / "art"
    assert cli.main([str(model), "--role", "dlm", "--target", "qaic", "--ctx-len", "96", "--prefill-len", "16",
                     "-o", str(out)]) == 0
    src, dst = tmp_path / "ext" / "model.onnx.data", out / "model.onnx.data"
    assert dst.exists() and os.stat(src).st_ino != os.stat(dst).st_ino, "a copy, not a hard link"
    assert dst.read_bytes() == src.read_bytes()
    loaded = onnx.load(str(out / "model.onnx"))          # onnx >= 1.23 refuses hard-linked data
    assert any(t.raw_data for t in loaded.graph.initializer)
    assert verify(model, out / "model.onnx", k=3, prefill_len=16, ctx_len=96).ok


def test_link_weights_hard_links_the_data_file_and_verifies(fixture_path, tmp_path):
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    out = tmp_path / "art"
    assert cli.main([str(model), "--role", "dlm", "--target", "ort", "--ctx-len", "96", "--prefill-len", "16",
                     "--link-weights", "-o", str(out)]) == 0
    src, dst = tmp_path / "ext" / "model.onnx.data", out / "model.onnx.data"
    assert dst.exists() and os.stat(src).st_ino == os.stat(dst).st_ino, "hard link, not a copy"
    assert verify(model, out / "model.onnx", k=3, prefill_len=16, ctx_len=96).ok


def test_copy_when_links_are_impossible(tmp_path, monkeypatch):
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)

    def no_link(*a, **k):
        raise OSError("cross-device link")
    monkeypatch.setattr(os, "link", no_link)
    io.link_or_copy(src, tmp_path / "b" / "a.bin")
    assert (tmp_path / "b" / "a.bin").read_bytes() == src.read_bytes()
