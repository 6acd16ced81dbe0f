"""The safetensors reader import-head uses (numpy only): round trip, bfloat16/float16 widening, and
a one-line SpecdecError for each malformed file."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from specdec_compile.errors import SpecdecError
from specdec_compile.eagle3.safetensors import read_safetensors, write_safetensors


def _raw(path, header: dict, data: bytes):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_round_trip_and_16_bit_floats(tmp_path):
    f = tmp_path / "a.safetensors"
    t = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([3, -1], np.int64),
         "m": np.array([True, False, True]), "h": np.array([1.5, -2.0], np.float16)}
    write_safetensors(f, t)
    got = read_safetensors(f)
    for k, v in t.items():
        assert np.array_equal(got[k], v), k
    assert got["h"].dtype == np.float32
    bf = np.array([1.0, -3.25], np.float32).view(np.uint32) >> 16      # exact in bfloat16
    _raw(tmp_path / "b.safetensors", {"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                                      "__metadata__": {"format": "pt"}}, bf.astype("<u2").tobytes())
    assert read_safetensors(tmp_path / "b.safetensors")["x"].tolist() == [1.0, -3.25]


@pytest.mark.parametrize("header,data,needle", [
    ({"x": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype 'F33'"),
    ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "4 bytes for F32 [2] (8 expected)"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 4, "outside the 4 data bytes"),
    ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "not a list of non-negative"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "y": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 8, "overlap"),
    # the data bytes must be covered exactly (the format's own library refuses a hole)
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
      "y": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12,
     "data bytes 4..8 belong to no tensor (before 'y')"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "data bytes 0..4 belong to no tensor"),
    ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9,
     "data bytes 4..9 belong to no tensor (after the last one)"),
    ({}, b"\0" * 2, "data bytes 0..2 belong to no tensor"),
    ({"x": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "expected keys dtype, shape, data_offsets"),
    ([1, 2], b"", "not a JSON object"),
    # a dtype of another JSON type, and dimensions numpy cannot hold (no bytes needed): one line, no TypeError
    ({"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, "unknown dtype ['F32']"),
    ({"x": {"dtype": "F32", "shape": [0, 10 ** 30], "data_offsets": [0, 0]}}, b"", "cannot be held"),
    ({"x": {"dtype": "F32", "shape": [0, 1 << 62, 1 << 62], "data_offsets": [0, 0]}}, b"", "cannot be held"),
    ({"__metadata__": {"a": 1}}, b"", "__metadata__ is not an object of strings"),
])
def test_malformed_files_are_one_line_errors(tmp_path, header, data, needle):
    f = tmp_path / "bad.safetensors"
    _raw(f, header, data)
    with pytest.raises(SpecdecError) as e:
        read_safetensors(f)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_short_files(tmp_path):
    f = tmp_path / "short.safetensors"
    f.write_bytes(b"\1\2")
    with pytest.raises(SpecdecError, match="shorter than the 8-byte header length"):
        read_safetensors(f)
    f.write_bytes(struct.pack("<Q", 50) + b"{}")
    with pytest.raises(SpecdecError, match="past the end of the file"):
        read_safetensors(f)
