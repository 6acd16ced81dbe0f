"""Pass rotary_tables: Cos/Sin of the positions become a Gather from constant tables."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import ctx, load, serialized, session

from specdec_compile import passes
from specdec_compile.detect import Detection, ModelInfo
from specdec_compile.detect.rotary import find_rotary
from specdec_compile.errors import SpecdecError, UnsupportedPatternError
from specdec_compile.graph_utils import topo_nodes, value_dependence

ROTARY = ["llama_gqa", "qwen2", "phi3", "gpt_neox", "llama3_rope", "qwen2_yarn", "llama_dynamo"]


def _trig_on_positions(g, pos="position_ids"):
    p = next(t for t in g.inputs if t.name == pos)
    dep = value_dependence(g, [p])
    return [n.name for n in g.nodes if n.op in ("Cos", "Sin") and id(n.inputs[0]) in dep]


def _feeds(det, positions, rng):
    b, s = positions.shape
    feeds = {det.input_ids: rng.integers(0, 211, (b, s)), det.position_ids: positions}
    if det.attention_mask is not None:
        feeds[det.attention_mask] = np.ones((b, s), np.int64)
    for layer in det.layers:
        empty = np.zeros((b, det.info.num_kv_heads, 0, det.info.head_dim), np.float32)
        feeds[layer.key_input] = feeds[layer.value_input] = empty
    return feeds


@pytest.mark.parametrize("name", ROTARY)
def test_tables_replace_the_angles_and_keep_the_logits(fixture_path, name):
    g, det = load(fixture_path(name))
    before = serialized(g)
    out = passes.rotary_tables(g, ctx(det, ctx_len=64))
    assert serialized(g) == before, "the input graph is untouched"
    assert _trig_on_positions(g) and not _trig_on_positions(out)
    tables = [n.inputs[0] for n in out.nodes if n.op == "Gather" and n.name.startswith("specdec/rotary/")]
    assert len(tables) == 2 and all(t.values.shape[0] == 64 for t in tables), "exactly ctx_len rows"
    rows = [n for n in out.nodes if n.name.startswith("specdec/rotary/table_row")]
    assert len(rows) == 1 and rows[0].op == "Max", "one clamped row index, shared"
    positions = np.array([[0, 1, 2, 30, 31], [59, 60, 61, 62, 63]])
    feeds = _feeds(det, positions, np.random.default_rng(0))
    names = [det.logits]
    want = session(onnx.load(str(fixture_path(name)))).run(names, feeds)[0]
    got = session(out).run(names, {k: v for k, v in feeds.items()})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_tables_are_computed_in_float64_from_the_exports_own_frequencies(fixture_path):
    """Llama's cos table equals cos(p * inv_freq) in float64 (inv_freq as the
    export stores it), rounded once to float32; a float32 evaluation would not."""
    g, det = load(fixture_path("llama_gqa"))
    out = passes.rotary_tables(g, ctx(det, ctx_len=4096))
    cos = next(n.inputs[0].values for n in out.nodes if n.name.startswith("specdec/rotary/cos_rows"))
    inv_freq = _inv_freq(g, next(s.node for s in det.rotary if s.op == "Cos"))
    angles = np.arange(4096, dtype=np.float64)[:, None] * inv_freq.reshape(-1).astype(np.float64)
    want = np.cos(np.concatenate([angles, angles], axis=1)).astype(np.float32)
    assert cos.dtype == np.float32 and cos.shape == (4096, 16)
    np.testing.assert_array_equal(cos, want)
    in_f32 = np.cos(np.arange(4096, dtype=np.float32)[:, None] * inv_freq.reshape(-1))
    assert np.abs(in_f32 - want[:, :8]).max() > 1e-5, "float32 angles are already off by then"


def _inv_freq(g, cos_name):
    """The float32 constant with head_dim/2 = 8 values among the angle's ancestors."""
    from specdec_compile.graph_utils import const_value, node_by_name, producer

    stack, seen = list(node_by_name(g, cos_name).inputs), set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        v = const_value(t)
        if v is not None and v.dtype == np.float32 and v.size == 8:
            return v
        if producer(t) is not None:
            stack += list(producer(t).inputs)
    raise AssertionError("no inv_freq constant found")


def test_without_rotary_the_pass_changes_nothing_and_needs_no_ctx_len(fixture_path):
    g, det = load(fixture_path("gpt2"))
    assert passes.rotary_tables(g, ctx(det)) is g


def test_needs_ctx_len_and_detection(fixture_path):
    g, det = load(fixture_path("llama_gqa"))
    with pytest.raises(SpecdecError, match=r"pass rotary_tables needs ctx\.ctx_len"):
        passes.rotary_tables(g, ctx(det))
    with pytest.raises(SpecdecError, match=r"pass rotary_tables needs ctx\.detection"):
        passes.rotary_tables(g, ctx(None, ctx_len=8))


def _toy_ctx(g):
    """A context for a hand-made graph: its rotary sites, ctx_len 32."""
    pos = next(t for t in g.inputs if t.name == "position_ids")
    sites = tuple(find_rotary(g, topo_nodes(g), pos))
    info = ModelInfo(num_layers=1, num_kv_heads=1, head_dim=2, vocab_size=3, dtype="float32")
    det = Detection(info=info, input_ids="x", position_ids="position_ids", attention_mask=None,
                    logits="y", layers=(), rotary=sites)
    return ctx(det, ctx_len=32)


def test_a_table_in_float16_for_a_float16_model():
    pos = gs.Variable("position_ids", np.int64, ["b", "s"])
    f, c = gs.Variable("f"), gs.Variable("c")
    y = gs.Variable("y", np.float16, ["b", "s"])
    g = gs.Graph(nodes=[gs.Node("Cast", name="cast", attrs={"to": 1}, inputs=[pos], outputs=[f]),
                        gs.Node("Cos", name="cos", inputs=[f], outputs=[c]),
                        gs.Node("Cast", name="to_f16", attrs={"to": 10}, inputs=[c], outputs=[y])],
                 inputs=[pos], outputs=[y], opset=17)
    out = passes.rotary_tables(g, _toy_ctx(g))
    table = next(n.inputs[0].values for n in out.nodes if n.op == "Gather")
    assert table.dtype == np.float16 and table.shape == (32,)
    np.testing.assert_array_equal(table, np.cos(np.arange(32, dtype=np.float64)).astype(np.float16))
    got = session(out).run(None, {"position_ids": np.array([[5, -1, 31]])})[0]
    np.testing.assert_array_equal(got, table[[5, 0, 31]][None])  # padding (-1) reads row 0


def test_refuses_angles_that_mix_tokens():
    """cos(p * max(p)) is not a function of each token's own position: no table."""
    pos = gs.Variable("position_ids", np.int64, ["b", "s"])
    f, top, angle, y = (gs.Variable(n) for n in ("f", "top", "angle", "y"))
    g = gs.Graph(nodes=[gs.Node("Cast", name="cast", attrs={"to": 1}, inputs=[pos], outputs=[f]),
                        gs.Node("ReduceMax", name="max", attrs={"keepdims": 1}, inputs=[f], outputs=[top]),
                        gs.Node("Mul", name="mul", inputs=[f, top], outputs=[angle]),
                        gs.Node("Cos", name="cos", inputs=[angle], outputs=[y])],
                 inputs=[pos], outputs=[y], opset=17)
    with pytest.raises(UnsupportedPatternError, match="not a function of each token's own position"):
        passes.rotary_tables(g, _toy_ctx(g))


def test_refuses_angles_that_read_another_inputs_values():
    pos = gs.Variable("position_ids", np.int64, ["b", "s"])
    x = gs.Variable("x", np.float32, ["b", "s"])
    f, angle, y = (gs.Variable(n) for n in ("f", "angle", "y"))
    g = gs.Graph(nodes=[gs.Node("Cast", name="cast", attrs={"to": 1}, inputs=[pos], outputs=[f]),
                        gs.Node("Add", name="add", inputs=[f, x], outputs=[angle]),
                        gs.Node("Cos", name="cos", inputs=[angle], outputs=[y])],
                 inputs=[pos, x], outputs=[y], opset=17)
    with pytest.raises(UnsupportedPatternError, match="depends on the values of inputs other than"):
        passes.rotary_tables(g, _toy_ctx(g))


def test_the_rotary_finder_finds_no_site_left(fixture_path):
    g, det = load(fixture_path("qwen2_yarn"))
    out = passes.rotary_tables(g, ctx(det, ctx_len=16))
    pos = next(t for t in out.inputs if t.name == "position_ids")
    assert find_rotary(out, topo_nodes(out), pos) == []


@pytest.mark.parametrize("name", ["llama_gqa", "llama_dynamo", "phi3", "qwen2_yarn"])
def test_for_ort_the_tables_hold_the_exports_own_bits(fixture_path, name):
    """With an ort context (fuse_rotary's use) the tables are evaluated as the export computes
    them (its dtypes, ONNX Runtime's kernels): the ort rewrite with them is bit for bit the one
    computing Cos/Sin per call, at valid positions."""
    from qaic_helpers import assert_same_outputs
    g0, det = load(fixture_path(name))
    c = ctx(det, role="tlm", target="ort", k=3, source_opset=g0.opset, ctx_len=64)
    graphs = []
    for tables in (True, False):
        g = g0
        for p in passes.REGISTRY:
            if p.applies("tlm", "ort") or (tables and p.name == "rotary_tables"):
                g = p.run(g, c)
        graphs.append(g)
    assert not any(n.op in ("Cos", "Sin") for n in graphs[0].nodes)
    assert any(n.op in ("Cos", "Sin") for n in graphs[1].nodes)
    assert_same_outputs(graphs[1], graphs[0], padded_logits=False, atol=0.0)  # padding: unspecified
