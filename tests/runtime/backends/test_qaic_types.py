"""The Cloud AI 100 backend's buffer types (against the FAKE qaicrt of test_qaic.py): the types
QEfficient's QAICInferenceSession maps, bfloat16 read and written bit-exactly (not as float16),
int32 id bindings, quantized types refused where values are read or written."""
from __future__ import annotations

import numpy as np
import pytest
from test_qaic import (BFLOAT16_TYPE, INT8_Q_TYPE, INT16_Q_TYPE, INT32_I_TYPE, IDS, CL, PL, backend, fake_aicapi,
                       write_fake_qpc)

from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import OrtBackend, TargetOnlyDecoder
from specdec_compile.runtime.backends.qaic.buffers import buffer_types, from_bfloat16, to_bfloat16


def test_bfloat16_conversion_is_exact_and_rounds_to_nearest_even():
    torch = pytest.importorskip("torch")
    x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38, np.inf, -np.inf, 1e-40, 0.0, -0.0], np.float32)
    bits = to_bfloat16(x)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert bits.tolist() == want.tolist()
    assert bits[0] == 0x3F80 and bits[2] == 0x3F80          # a tie rounds to the even mantissa
    assert np.isnan(from_bfloat16(to_bfloat16(np.array([np.nan], np.float32))))[0]
    r = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert np.array_equal(from_bfloat16(to_bfloat16(r)),
                          torch.from_numpy(r).to(torch.bfloat16).float().numpy())
    # float16 read of the same bits (what mapping bfloat16 to float16 does) is far off
    assert not np.allclose(to_bfloat16(r).view(np.float16).astype(np.float32), r, atol=0.1)


def test_every_type_qeffs_session_maps_is_known():
    types = buffer_types(fake_aicapi())       # the fake module has no BFLOAT16_TYPE: 11, as QEfficient assumes
    assert {t.name for t in types.values()} == {"FLOAT_TYPE", "FLOAT_16_TYPE", "BFLOAT16_TYPE", "INT8_Q_TYPE",
                                                "UINT8_Q_TYPE", "INT16_Q_TYPE", "INT32_Q_TYPE", "INT32_I_TYPE",
                                                "INT64_I_TYPE", "INT8_TYPE"}
    assert types[BFLOAT16_TYPE].name == "BFLOAT16_TYPE" and types[BFLOAT16_TYPE].itemsize == 2


@pytest.fixture(scope="module")
def tlm_dir(fixture_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("qaic_types") / "tlm"
    assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "3", "--target", "qaic",
                             "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(d)]) == 0
    return d


def test_bfloat16_logits_and_int32_ids(tlm_dir):
    ids, pos = np.array([IDS[:PL]]), np.arange(PL)[None]
    want = OrtBackend(tlm_dir).run(ids, pos)
    write_fake_qpc(tlm_dir, types={"logits": BFLOAT16_TYPE, "input_ids": INT32_I_TYPE, "position_ids": INT32_I_TYPE})
    ev = []
    b = backend(tlm_dir, ev)
    got = b.run(ids, pos)
    calls = [e[1] for e in ev if e[0] == "setData"]
    assert not any(e[0] == "error" for e in ev)
    # the device's logits, rounded to bfloat16, read back exactly
    assert np.abs(got - want).max() <= np.abs(want).max() * 2 ** -8
    assert np.array_equal(got, from_bfloat16(to_bfloat16(got)))
    assert np.abs(got - want).max() > 0           # really bfloat16 on the device
    assert calls and b.dims[b.index["input_ids"]] == (4, [1, PL])     # int32 ids: 4-byte items
    # greedy decoding through int32 id buffers equals ONNX Runtime's (to bfloat16-sized logit ties)
    out = TargetOnlyDecoder(b).generate(IDS, max_new_tokens=8).generated_ids
    ref = TargetOnlyDecoder(OrtBackend(tlm_dir)).generate(IDS, max_new_tokens=8).generated_ids
    assert out == ref


def test_quantized_types_refused_where_values_are_read(tlm_dir):
    write_fake_qpc(tlm_dir, types={"logits": INT8_Q_TYPE})
    with pytest.raises(SpecdecError, match="binding logits is INT8_Q_TYPE .a quantized type"):
        backend(tlm_dir, [])
    write_fake_qpc(tlm_dir, types={"input_ids": INT16_Q_TYPE})
    with pytest.raises(SpecdecError, match="binding input_ids is INT16_Q_TYPE"):
        backend(tlm_dir, [])
    # retained state of a quantized type: kept on the device, skipped by the runtime (only its size matters)
    write_fake_qpc(tlm_dir, types={"past_key.0": INT16_Q_TYPE, "past_key.0_RetainedState": INT16_Q_TYPE})
    b = backend(tlm_dir, [])
    assert b.dims[b.index["past_key.0"]] == (2, [0])
    write_fake_qpc(tlm_dir)
