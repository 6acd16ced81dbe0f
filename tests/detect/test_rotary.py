"""Finder: Cos/Sin computed on the device from position_ids (rotary angles)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from detect_helpers import graph, input_named

from specdec_compile.detect import detect
from specdec_compile.detect.rotary import find_rotary
from specdec_compile.graph_utils import topo_nodes, tensor_by_name


def _sites(g, pos="position_ids"):
    return find_rotary(g, topo_nodes(g), input_named(g, pos))


@pytest.mark.parametrize("name", ["llama_gqa", "qwen2", "mistral", "phi3", "gpt_neox", "llama3_rope",
                                  "qwen2_yarn", "llama_dynamo"])
def test_finds_one_cos_and_one_sin_of_the_positions(fixture_path, name):
    g = graph(fixture_path(name))
    sites = _sites(g)
    assert sorted(s.op for s in sites) == ["Cos", "Sin"]
    for s in sites:
        trig = next(n for n in g.nodes if n.name == s.node)
        assert trig.op == s.op and trig.inputs[0].name == s.angle
        users = tensor_by_name(g, s.table).outputs
        assert len(users) != 1 or users[0].op != "Cast", "the chain ends after the last Cast"


def test_the_table_tensor_follows_cast_and_constant_scale(fixture_path):
    """Llama: Cos -> Mul(attention_scaling) -> Cast(model dtype): the table is the Cast's output."""
    g = graph(fixture_path("llama_gqa"))
    cos = next(s for s in _sites(g) if s.op == "Cos")
    producer = tensor_by_name(g, cos.table).inputs[0]
    assert producer.op == "Cast" and producer.inputs[0].inputs[0].op == "Mul"


@pytest.mark.parametrize("name", ["gpt2", "opt", "gptj", "codegen"])
def test_no_site_without_on_device_angles(fixture_path, name):
    """Learned positions (GPT-2, OPT) and sin/cos gathered from a constant table (GPT-J, CodeGen)."""
    assert _sites(graph(fixture_path(name))) == []


def test_a_cos_of_a_constant_is_not_a_site():
    pos = gs.Variable("position_ids", np.int64, ["b", "s"])
    c = gs.Constant("c", np.ones(4, np.float32))
    y = gs.Variable("y", np.float32, [4])
    z = gs.Variable("z", np.float32, ["b", "s"])
    f = gs.Variable("f", np.float32, ["b", "s"])
    g = gs.Graph(nodes=[gs.Node("Cos", name="const_cos", inputs=[c], outputs=[y]),
                        gs.Node("Cast", name="cast", attrs={"to": 1}, inputs=[pos], outputs=[f]),
                        gs.Node("Sin", name="pos_sin", inputs=[f], outputs=[z])],
                 inputs=[pos], outputs=[y, z], opset=17)
    sites = _sites(g)
    assert [s.node for s in sites] == ["pos_sin"] and sites[0].table == "z"
    assert find_rotary(g, topo_nodes(g), None) == []


def test_detect_records_the_sites(fixture_path):
    assert len(detect(graph(fixture_path("llama_gqa"))).rotary) == 2
    assert detect(graph(fixture_path("gpt2"))).rotary == ()
