"""Pass synth_positions: an export without position_ids gets one, feeding every position it derived."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from families import tiny_config
from models import export_spec
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes


def _gemma():
    return export_spec("cov-gemma", {"kind": "gemma", "exporter": "optimum", "config": tiny_config("gemma")})


def test_no_op_on_an_export_with_position_ids(fixture_path):
    g, det = load(fixture_path("llama_gqa"))
    assert passes.synth_positions(g, ctx(det)) is g


@pytest.mark.slow
def test_positions_come_from_the_new_input():
    """On the original graph: position_ids = past..past+seq-1 gives the
    export's own logits; other positions give other logits (they are used)."""
    path = _gemma()
    g, det = load(path)
    before = serialized(g)
    out = passes.synth_positions(g, ctx(det))
    assert serialized(g) == before, "a pass must not modify its input graph"
    assert "position_ids" in [t.name for t in out.inputs] and "position_ids" not in [t.name for t in g.inputs]
    rng = np.random.default_rng(0)
    past, s = 4, 3
    feeds = {"input_ids": rng.integers(0, 211, (1, s)), "attention_mask": np.ones((1, past + s), np.int64)}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((1, 2, past, 16)).astype(np.float32)
    want = session(onnx.load(str(path))).run(["logits"], feeds)[0]
    new = session(out)
    got = new.run(["logits"], {**feeds, "position_ids": np.arange(past, past + s)[None]})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    other = new.run(["logits"], {**feeds, "position_ids": np.arange(past + 5, past + 5 + s)[None]})[0]
    assert np.max(np.abs(other - want)) > 1e-3
