"""Defects found hunting the OpenVINO backend (docs/runtime.md, *OpenVINO*), each checked against
ONNX Runtime and the copy path on the same artifact."""
from __future__ import annotations

import numpy as np
import pytest

from specdec_compile import cli as compile_cli
from specdec_compile.errors import SpecdecError
from specdec_compile.runtime import OrtBackend

ov = pytest.importorskip("openvino")
from specdec_compile.runtime import OpenVinoBackend  # noqa: E402
from specdec_compile.runtime.backends.openvino.fused import STALE, Cursor  # noqa: E402

PL, CL = 8, 64
PROMPT = [1, 5, 9, 33, 7, 100, 42, 17]


@pytest.fixture(scope="module")
def art(fixture_path, tmp_path_factory):
    """art(target) -> the llama_gqa TLM (k 4, PL 8, CL 64) compiled for ``target``, once."""
    root = tmp_path_factory.mktemp("ov_hunt")
    made = {}

    def get(target="openvino"):
        if target not in made:
            out = root / target
            assert compile_cli.main([str(fixture_path("llama_gqa")), "--role", "tlm", "--k", "4", "--target", target,
                                     "--prefill-len", str(PL), "--ctx-len", str(CL), "-o", str(out), "--quiet"]) == 0
            made[target] = out
        return made[target]

    return get


def test_a_call_of_padding_only_runs_on_the_fused_cache_as_on_the_fixed_one(art):
    """A call whose row is all padding (positions -1) is a call the contract allows (backends/base.py):
    ONNX Runtime and the copy path run it, write nothing and the next call's logits are unchanged.
    The fused cache refused it, saying the call "starts at -1" and must start "at or before the
    cache's end" (which -1 is)."""
    path = art()
    fused = OpenVinoBackend(path, precision="f32", threads=1)
    trimmed = OpenVinoBackend(path, precision="f32", threads=1, stale_limit=0)
    copy = OpenVinoBackend(path, precision="f32", threads=1, cache="copy")
    ref = OrtBackend(art("ort"))
    assert fused.cache_kind == trimmed.cache_kind == "fused"
    nxt, npos = np.array([[3, 4, 5, 6]]), np.arange(8, 12)[None]
    for b in (fused, trimmed, copy, ref):
        b.run([PROMPT], [list(range(8))])
        b.run(np.zeros((1, 4), np.int64), np.full((1, 4), -1))     # padding only: nothing written
    want = ref.run(nxt, npos)
    for b in (fused, trimmed, copy):
        np.testing.assert_allclose(b.run(nxt, npos), want, atol=1e-5)
    assert fused._cursor.valid == trimmed._cursor.valid == 12
    assert trimmed._cursor.length == 12 and trimmed._cursor.compactions == 1    # the padded slots trimmed
    # on a fresh cache too, and the slots padding took stay hidden
    fused.reset()
    fused.run(np.zeros((1, 4), np.int64), np.full((1, 4), -1))
    assert fused._cursor.valid == 0 and np.all(fused._cursor.slots == STALE)
    ref.reset()
    np.testing.assert_allclose(fused.run([PROMPT], [list(range(8))]), ref.run([PROMPT], [list(range(8))]),
                               atol=1e-5)


def test_a_call_past_an_empty_fused_cache_names_no_range_backwards():
    """A call past the end of an empty fused cache is refused in one line that says the cache holds
    nothing (it said "holds positions 0..-1")."""
    cur = Cursor(["k"], "tlm", stale_limit=4)
    with pytest.raises(SpecdecError) as e:
        cur.feeds(None, np.array([[3, 4]]))
    msg = str(e.value)
    assert "0..-1" not in msg and "holds no positions" in msg and "starts at 3" in msg and "\n" not in msg
