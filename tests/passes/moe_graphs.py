"""A small hand-built MoE block shaped like the optimum export of Hugging Face's
sparse MoE (per expert: torch.where on the one-hot TopK mask -> NonZero ->
gather tokens -> MLP -> * gathered routing weight -> index_add), with knobs
that break one thing at a time, for tests/passes/test_dense_experts.py."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

T_DIM, H, E, K, F = "tokens", 8, 4, 2, 6


class _B:
    def __init__(self):
        self.nodes, self.n = [], 0

    def op(self, op, inputs, attrs=None, n_out=1, dtype=None):
        self.n += 1
        outs = [gs.Variable(f"{op.lower()}{self.n}_{j}", dtype=dtype) for j in range(n_out)]
        ins = [x if isinstance(x, gs.Tensor) else gs.Constant(f"c{self.n}_{i}", np.asarray(x))
               for i, x in enumerate(inputs)]
        self.nodes.append(gs.Node(op, name=f"{op}_{self.n}", attrs=attrs or {}, inputs=ins, outputs=outs))
        return outs if n_out > 1 else outs[0]


def _expert(b, x, rng, e, mix_rows, huge):
    w = [gs.Constant(f"w{e}_{i}", rng.standard_normal(s).astype(np.float32) * 0.5)
         for i, s in enumerate([(H, F), (H, F), (F, H)])]
    if huge:  # finite weights whose products overflow float32
        w[2] = gs.Constant(f"w{e}_2", np.sign(w[2].values) * np.float32(3e38))
    gate = b.op("MatMul", [x, w[0]])
    act = b.op("Mul", [gate, b.op("Sigmoid", [gate])])
    hidden = b.op("Mul", [act, b.op("MatMul", [x, w[1]])])
    if mix_rows:  # a token-mixing op inside the expert: dense would change the chosen rows
        hidden = b.op("Add", [hidden, b.op("ReduceSum", [hidden, np.array([0])], {"keepdims": 1})])
    return b.op("MatMul", [hidden, w[2]])


def _route(b, hot, rw, x3, acc, e, rng, perm, mix_rows, leak_scaled, huge):
    mask = b.op("Gather", [b.op("Transpose", [hot], {"perm": perm}), np.array(e, dtype=np.int64)], {"axis": 0})
    nz = b.op("NonZero", [b.op("Cast", [mask], {"to": onnx.TensorProto.BOOL})])
    parts = b.op("Split", [b.op("Transpose", [nz], {"perm": [1, 0]}), np.array([1, 1])], {"axis": 1}, n_out=2)
    i0, i1 = (b.op("Squeeze", [p, np.array([1])]) for p in parts)
    token, slot = (i1, i0) if perm == [2, 1, 0] else (i0, i1)
    rows = b.op("Reshape", [b.op("Gather", [x3, token], {"axis": 1}), np.array([-1, H])])
    y = _expert(b, rows, rng, e, mix_rows, huge)
    rw3 = b.op("Unsqueeze", [rw, np.array([2])])
    stride = b.op("Gather", [b.op("Shape", [rw3]), np.array(1)], {"axis": 0})
    index = b.op("Add", [slot, b.op("Mul", [token, stride])])
    picked = b.op("Gather", [b.op("Flatten", [rw3], {"axis": 2}), index], {"axis": 0})
    weight = b.op("Reshape", [picked, np.array([-1, 1])])
    scaled = b.op("Mul", [y, weight])
    upd = b.op("Expand", [scaled, np.array([1, H])])
    idx = b.op("Expand", [b.op("Unsqueeze", [token, np.array([1])]), b.op("Shape", [upd])])
    zeros = b.op("ConstantOfShape", [b.op("Shape", [acc])],
                 {"value": gs.Constant("zero", np.zeros(1, np.float32))})
    added = b.op("Add", [acc, b.op("ScatterElements", [zeros, idx, upd], {"axis": 0})])
    return added, (scaled if leak_scaled else None)


def moe_block(*, perm=(2, 1, 0), on_off=(0, 1), mix_rows=False, leak_scaled=False, overflow=False,
              seed=0) -> gs.Graph:
    """x [tokens, H] -> the MoE output [tokens, H] (and, with ``leak_scaled``, expert 2's
    scaled rows, one per chosen pair, as a second output). With ``overflow``, expert 3's output
    overflows to inf on most tokens (the sparse form computes it only where chosen)."""
    rng = np.random.default_rng(seed)
    b = _B()
    x = gs.Variable("x", np.float32, [T_DIM, H])
    gate = gs.Constant("router", rng.standard_normal((H, E)).astype(np.float32))
    probs = b.op("Softmax", [b.op("MatMul", [x, gate])], {"axis": 1})
    top_w, top_i = b.op("TopK", [probs, np.array([K])], {"axis": -1}, n_out=2)
    hot = b.op("OneHot", [top_i, np.array(E), np.array(list(on_off))], {"axis": -1})
    x3 = b.op("Unsqueeze", [x, np.array([0])])
    acc = b.op("ConstantOfShape", [b.op("Shape", [x])], {"value": gs.Constant("z", np.zeros(1, np.float32))})
    leaks = []
    for e in range(E):
        acc, leak = _route(b, hot, top_w, x3, acc, e, rng, list(perm), mix_rows and e == 1, leak_scaled and e == 2,
                           overflow and e == 3)
        leaks += [leak] if leak is not None else []
    acc.dtype, acc.shape = np.float32, [T_DIM, H]
    for t in leaks:
        t.dtype = np.float32
    return gs.Graph(nodes=b.nodes, inputs=[x], outputs=[acc, *leaks], opset=17)


def reference(x: np.ndarray, graph: gs.Graph) -> np.ndarray:
    """The block computed directly in numpy (float64), from the graph's own weights."""
    c = {t.name: t.values for t in graph.tensors().values() if isinstance(t, gs.Constant)}
    logits = x.astype(np.float64) @ c["router"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    out = np.zeros_like(x, dtype=np.float64)
    for t in range(x.shape[0]):
        for e in np.argsort(-probs[t])[:K]:
            gate, up = x[t] @ c[f"w{e}_0"], x[t] @ c[f"w{e}_1"]
            out[t] += ((gate / (1 + np.exp(-gate))) * up) @ c[f"w{e}_2"] * probs[t, e]
    return out
