"""Pass drop_nan_guards (qaic): Where(IsNaN(softmax), 0, softmax) removed behind a finite mask."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from pass_helpers import serialized
from qaic_helpers import assert_same_outputs, pipeline_until

from specdec_compile import passes
from specdec_compile.errors import SpecdecError


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "gpt_neox", "phi3"])
def test_guards_behind_the_finite_mask_are_removed(fixture_path, name):
    g, ctx = pipeline_until(fixture_path(name), "drop_nan_guards")
    assert sum(n.op == "IsNaN" for n in g.nodes) == 2
    before = serialized(g)
    out = passes.drop_nan_guards(g, ctx)
    assert serialized(g) == before
    assert not any(n.op == "IsNaN" for n in out.nodes)
    assert_same_outputs(g, out)


def test_an_infinite_mask_keeps_the_guards(fixture_path):
    g, ctx = pipeline_until(fixture_path("llama_gqa"), "drop_nan_guards")
    out = passes.drop_nan_guards(g, dataclasses.replace(ctx, mask_value=float("-inf")))
    assert sum(n.op == "IsNaN" for n in out.nodes) == 2


def test_a_guard_on_another_softmax_is_kept(fixture_path):
    """Only the Softmax of a detected attention layer is known to see a finite mask."""
    g, ctx = pipeline_until(fixture_path("llama_gqa"), "drop_nan_guards")
    x = g.outputs[0]
    p, nan, y = gs.Variable("p"), gs.Variable("nan"), gs.Variable("y", np.float32)
    g.nodes += [gs.Node("Softmax", name="other_softmax", attrs={"axis": -1}, inputs=[x], outputs=[p]),
                gs.Node("IsNaN", name="other_isnan", inputs=[p], outputs=[nan]),
                gs.Node("Where", name="other_where", inputs=[nan, gs.Constant("zero", np.zeros(1, np.float32)), p],
                        outputs=[y])]
    g.outputs.append(y)
    out = passes.drop_nan_guards(g, ctx)
    assert [n.name for n in out.nodes if n.op == "IsNaN"] == ["other_isnan"]


def test_needs_the_detection(fixture_path):
    g, ctx = pipeline_until(fixture_path("gpt2"), "drop_nan_guards")
    with pytest.raises(SpecdecError, match=r"pass drop_nan_guards needs ctx\.detection"):
        passes.drop_nan_guards(g, dataclasses.replace(ctx, detection=None))
