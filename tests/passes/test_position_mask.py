"""Pass position_mask: the attention mask derived from position_ids alone."""
from __future__ import annotations

import numpy as np
import onnx
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes


def _feeds(past_len, s, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, 211, (1, s)),
             "position_ids": np.arange(past_len, past_len + s)[None]}
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = rng.standard_normal((1, 2, past_len, 16)).astype(np.float32)
    return feeds


def test_position_mask_alone_matches_the_original(fixture_path):
    """On the original (concatenating) graph, the position-derived mask equals
    the exporter's mask for an unpadded history: same logits, no attention_mask."""
    path = fixture_path("llama_gqa")
    g, det = load(path)
    masked = passes.position_mask(g, ctx(det))
    assert "attention_mask" not in [t.name for t in masked.inputs]
    assert "attention_mask" in [t.name for t in g.inputs]
    past_len, s = 5, 3
    feeds = _feeds(past_len, s)
    want = session(onnx.load(str(path)))
    ref = want.run(["logits"], {**feeds, "attention_mask": np.ones((1, past_len + s), np.int64)})[0]
    got = session(masked).run(["logits"], feeds)[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_position_mask_uses_the_context_mask_value(fixture_path):
    """The fill comes from ctx.mask_value, not from a constant inside the pass."""
    g, det = load(fixture_path("llama_gqa"))
    before = serialized(g)
    out = passes.position_mask(g, ctx(det, mask_value=-12345.0))
    assert serialized(g) == before, "a pass must not modify its input graph"
    fill = [n for n in out.nodes if n.op == "Where" and n.name.startswith("specdec/mask/additive_float32")]
    assert len(fill) == 1 and float(fill[0].inputs[2].values) == -12345.0


def test_mask_uses_only_ops_with_device_precedent(fixture_path):
    """GreaterOrEqual / Greater / Where: never LessOrEqual, never CastLike (issue 13)."""
    g, det = load(fixture_path("llama_gqa"))
    ops = {n.op for n in passes.position_mask(g, ctx(det)).nodes if n.name.startswith("specdec/mask/")}
    assert "GreaterOrEqual" in ops and "Where" in ops and not ops & {"LessOrEqual", "CastLike"}
