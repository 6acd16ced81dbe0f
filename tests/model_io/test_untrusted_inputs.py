"""Untrusted inputs: data files linked out of the model's directory, per-call
activation quantization. One line, exit 2, nothing written."""
from __future__ import annotations

import os
import shutil

import pytest

from specdec_compile import cli
from specdec_compile.errors import SpecdecError
from specdec_compile.model_io import load_model
from test_bad_inputs import _external, _one_line


def _linked_out(fixture_path, tmp_path, link_dir: bool):
    """A model whose data file (or the directory holding it) is a symbolic link
    to a file outside the model's directory."""
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "ext" / "model.onnx.data"
    shutil.move(data, elsewhere / "model.onnx.data")
    if link_dir:  # move the model into a subdirectory whose data location goes through a link
        import onnx
        m = onnx.load(str(model), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = "weights/model.onnx.data"
        onnx.save(m, str(model))
        os.symlink(elsewhere, tmp_path / "ext" / "weights")
    else:
        os.symlink(elsewhere / "model.onnx.data", data)
    return model


@pytest.mark.parametrize("link_dir", [False, True], ids=["file-link", "dir-link"])
def test_external_data_linked_out_is_refused(fixture_path, tmp_path, capsys, link_dir):
    model = _linked_out(fixture_path, tmp_path, link_dir)
    with pytest.raises(SpecdecError, match="outside the model's directory"):
        load_model(model)
    out = tmp_path / "out"
    code = cli.main([str(model), "--role", "tlm", "--k", "3", "--target", "ort", "-o", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "symbolic link" in line and "outside the model's directory" in line
    assert not out.exists()


def test_link_inside_the_directory_is_accepted(fixture_path, tmp_path):
    model = _external(fixture_path("llama_gqa"), tmp_path / "ext")
    data = tmp_path / "ext" / "model.onnx.data"
    shutil.move(data, tmp_path / "ext" / "real.data")
    os.symlink("real.data", data)
    assert load_model(model).graph.node


def test_dynamic_activation_quantization_is_refused(fixture_path, tmp_path, capsys):
    quantization = pytest.importorskip("onnxruntime.quantization")
    src = tmp_path / "q" / "model.onnx"
    src.parent.mkdir()
    quantization.quantize_dynamic(str(fixture_path("llama_gqa")), str(src),
                                  weight_type=quantization.QuantType.QInt8)
    import onnx
    assert any(n.op_type == "DynamicQuantizeLinear" for n in onnx.load(str(src)).graph.node)
    out = tmp_path / "out"
    code = cli.main([str(src), "--role", "tlm", "--k", "3", "--target", "ort", "-o", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and "dynamic activation quantization" in line and "DynamicQuantizeLinear" in line
    assert not out.exists()
