"""Pass expose_hidden_states: the residual stream after chosen layers as an output."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes
from specdec_compile.errors import SpecdecError


def _feeds(n=5):
    rng = np.random.default_rng(3)
    feeds = {"input_ids": rng.integers(0, 211, (1, n)), "position_ids": np.arange(n)[None],
             "attention_mask": np.ones((1, n), np.int64)}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    return feeds


def test_no_op_without_layers(fixture_path):
    g, det = load(fixture_path("llama_gqa"))
    assert passes.expose_hidden_states(g, ctx(det, role="tlm")) is g


def test_outputs_the_listed_layers_in_order(fixture_path):
    path = fixture_path("llama_gqa")
    g, det = load(path)
    before = serialized(g)
    out = passes.expose_hidden_states(g, ctx(det, role="tlm", exposed_layers=(-1, 0)))
    assert serialized(g) == before, "the input graph is untouched"
    hs = out.outputs[-1]
    assert hs.name == "hidden_states" and hs.shape == ["batch_size", "seq_len", 128]
    # numerically: the export's own tensors, last layer first
    m = onnx.load(str(path))
    m.graph.output.extend([onnx.helper.make_empty_tensor_value_info(n) for n in det.layer_outputs])
    ref = session(m).run(list(det.layer_outputs), _feeds())
    got = session(out).run(["hidden_states"], _feeds())[0]
    assert got.shape == (1, 5, 128)
    np.testing.assert_array_equal(got, np.concatenate([ref[1], ref[0]], axis=-1))


def test_dlm_feature_draft_gets_draft_hidden_states(fixture_path):
    g, det = load(fixture_path("llama_gqa"))
    out = passes.expose_hidden_states(g, ctx(det, role="dlm", exposed_layers=(-1,)))
    assert out.outputs[-1].name == "draft_hidden_states" and out.outputs[-1].shape[-1] == 64


@pytest.mark.parametrize("layers, msg", [((2,), "out of range"), ((-3,), "out of range"), ((1, -1), "twice")])
def test_refuses_bad_layers(fixture_path, layers, msg):
    g, det = load(fixture_path("gpt2"))
    with pytest.raises(SpecdecError, match=msg):
        passes.expose_hidden_states(g, ctx(det, role="tlm", exposed_layers=layers))


def test_refuses_when_the_layers_are_not_found(fixture_path):
    import dataclasses
    g, det = load(fixture_path("gpt2"))
    det = dataclasses.replace(det, layer_outputs=(), layer_outputs_problem="no residual stream found: test")
    with pytest.raises(SpecdecError, match="not found: no residual stream found: test"):
        passes.expose_hidden_states(g, ctx(det, role="tlm", exposed_layers=(0,)))


def test_needs_detection_and_role():
    with pytest.raises(SpecdecError, match="needs ctx.detection, ctx.role"):
        passes.expose_hidden_states(gs.Graph(), passes.PassContext())
