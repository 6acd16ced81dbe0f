"""Pass fp16_safe: no embedded constant outside float16's range."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from specdec_compile import passes
from specdec_compile.contract import FP16_MAX
from specdec_compile.passes import PassContext


def _const_graph(values):
    c = gs.Constant("fill", np.asarray(values, np.float32))
    x = gs.Variable("x", dtype=np.float32, shape=[len(values)])
    y = gs.Variable("y", dtype=np.float32, shape=[len(values)])
    return gs.Graph(nodes=[gs.Node("Add", inputs=[x, c], outputs=[y])], inputs=[x], outputs=[y], opset=17)


def test_fp16_safe_clamps_fills_and_keeps_nan():
    g = _const_graph([np.finfo(np.float32).min, -np.inf, 3.0, np.nan, 1e9])
    out = passes.fp16_safe(g, PassContext())
    vals = out.tensors()["fill"].values
    assert vals[0] == -FP16_MAX and vals[1] == -FP16_MAX and vals[2] == 3.0 and np.isnan(vals[3])
    assert vals[4] == FP16_MAX
    assert g.tensors()["fill"].values[0] == np.finfo(np.float32).min, "input graph untouched"
    assert np.all(np.abs(vals[~np.isnan(vals)]) <= FP16_MAX)
    with np.errstate(over="ignore"):
        assert np.all(np.isfinite(vals[~np.isnan(vals)].astype(np.float16)))
