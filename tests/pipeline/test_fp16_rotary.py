"""Rotary under float16 compute at long context (issue 13, item 2).

``qaic-exec -convert-to-fp16`` runs the graph in float16. With the angles
computed on the device (``Cast(position) x inv_freq``), the angle is a float16
number whose spacing above position 2048 is 2 radians, so the keys written at
position 4000 are noise in their high-frequency dims, while every float32
check passes. With ``rotary_tables`` the cos/sin come from exact tables and
the float16 error no longer depends on the position.

Measured: the keys a 32-token call writes into the cache (every layer), at
positions 100.. and 4000.., float16 (emulated: ``fp16_emulation.py``) against
float32, RMS over all written values. "No worse" allows 10%: that is the
spread of float16 rounding noise between two such samples; without the tables
the ratio is 60x here.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from fp16_emulation import emulate_fp16, round16
from specdec_compile import passes, pipeline
from specdec_compile.options import Options

CTX_LEN, SEQ = 4096, 32
NEAR, FAR = 100, 4000


def _rewrite(path, with_tables: bool, monkeypatch):
    if not with_tables:
        monkeypatch.setattr(passes, "REGISTRY", tuple(p for p in passes.REGISTRY if p.name != "rotary_tables"))
    model = pipeline.rewrite(str(path), Options(role="tlm", target="qaic", k=7, ctx_len=CTX_LEN)).model
    monkeypatch.undo()
    return model


def _session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def fp16_key_error(model, positions=(NEAR, FAR)) -> dict[int, float]:
    """RMS |keys(fp16) - keys(fp32)| written by SEQ tokens at each start position."""
    s32, s16 = _session(model), _session(emulate_fp16(model))
    names = [o.name for o in s32.get_outputs()]
    ids = np.random.default_rng(0).integers(0, 211, (1, SEQ))
    errors = {}
    for p in positions:
        feeds = {"input_ids": ids, "position_ids": np.arange(p, p + SEQ)[None]}
        for i in s32.get_inputs():
            if i.name.startswith("past_"):
                feeds[i.name] = np.zeros((1, i.shape[1], CTX_LEN, i.shape[3]), np.float32)
        a = dict(zip(names, s32.run(names, feeds)))
        b = dict(zip(names, s16.run(names, {k: round16(v) for k, v in feeds.items()})))
        diff = np.concatenate([(a[n] - b[n])[:, :, p:p + SEQ].ravel() for n in names if n.startswith("past_key")])
        errors[p] = float(np.sqrt(np.mean(diff ** 2)))
    return errors


@pytest.mark.parametrize("name", ["llama_gqa", "gpt_neox", "qwen2_yarn"])
def test_fp16_error_at_position_4000_is_no_worse_than_at_100(fixture_path, monkeypatch, name):
    err = fp16_key_error(_rewrite(fixture_path(name), True, monkeypatch))
    assert err[FAR] <= 1.10 * err[NEAR], err


def test_without_the_tables_the_same_check_fails(fixture_path, monkeypatch):
    """The check can fail: angles computed on the device lose the keys at 4000."""
    before = fp16_key_error(_rewrite(fixture_path("llama_gqa"), False, monkeypatch))
    after = fp16_key_error(_rewrite(fixture_path("llama_gqa"), True, monkeypatch))
    assert before[FAR] > 10 * before[NEAR], before
    assert before[FAR] > 100 * after[FAR] and before[NEAR] > 2 * after[NEAR], (before, after)


def test_emulation_rounds_every_float_tensor_to_float16():
    """fp16_emulation itself: x * (1 + 2^-12) is exact in float32, 1.0 in float16."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Mul", ["x", "c"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                          [helper.make_tensor("c", TensorProto.FLOAT, [1], [1 + 2 ** -12])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.ones(1, np.float32)
    assert _session(m).run(None, {"x": x})[0][0] == np.float32(1 + 2 ** -12)
    assert _session(emulate_fp16(m)).run(None, {"x": x})[0][0] == 1.0
    onnx.checker.check_model(emulate_fp16(m))
