"""Pass ``rotary_tables``: rotary cos/sin gathered from constant tables.

Exports compute ``Cos``/``Sin`` of ``Cast(position_ids) x inv_freq`` on the
device. Under ``-convert-to-fp16`` that product runs in float16, whose spacing
above position 2048 is 2 radians: the high-frequency rotary dims are noise at
long contexts. This pass replaces each rotary site (``detect.rotary``: the
trig output, followed through Cast and constant scaling) by
``Gather(table, Max(position_ids, 0))`` with a constant table of exactly
``ctx_len`` rows, so no Cos/Sin depends on the positions any more.

The tables are not re-derived from a rope formula: the export's own
frequency subgraph (everything the site's values depend on) is cut out,
promoted to float64 (float casts and float constants become double) and
evaluated at compile time at positions ``0..ctx_len-1``. So every variant the
export computes (partial rotary, interleaved layouts, llama3/yarn scaling,
attention factors) is tabulated as it is. A table is stored in the dtype the
site had (the model dtype).

A qaic pass; ``fuse_rotary`` (ort, opt-in) calls it with an ort context, and its tables become
ONNX Runtime's ``RotaryEmbedding`` ``cos_cache``/``sin_cache``. For ort they are evaluated as the export
computes them at run time: in its own dtypes, by ONNX Runtime's own kernels (its float32
``Cos``/``Sin`` differ from numpy's in the last bit on about 5% of SmolLM2's angles). The
contract compares with that export at 1e-4, and SmolLM2-135M amplifies last-bit differences
of cos/sin past it: its logits moved by 2.2e-4 with float64 tables and by 3.5e-4 with numpy's
float32 ones (the `fill` scenario, positions up to 255); with ONNX Runtime's they are the
export's bits. On qaic the float64 tables are the point (``-convert-to-fp16``).

Refused (one line, naming the node), never guessed: a site whose values
depend on any graph input other than the positions (beyond its shape), a
frequency constant stored as external data, or a site that is not a
per-token function of the position (checked numerically: a second
evaluation at other positions, batch size and free dims must equal the table
rows). Padding (position -1) reads row 0: its values are unspecified anyway,
and no device gathers a negative row. Positions >= ctx_len cannot occur
(the contract pads them to -1).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..contract import POSITION_IDS
from ..errors import SpecdecError, UnsupportedPatternError
from ..graph_utils import Builder, copy_graph, graph_input, toposort, is_external, replace_uses, tensor_by_name, value_dependence
from ._context import PassContext, need, graph_pass

_FLOAT = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
          onnx.TensorProto.BFLOAT16)
_ATOL = 1e-9
#: the per-token check of tables computed in the export's dtypes (float32: an ulp is 6e-8 at 1)
_ATOL_OWN = 1e-6


def _subgraph(graph: gs.Graph, pos_name: str, table_names: list[str]) -> gs.Graph:
    """The part of ``graph`` the table tensors are computed from (a copy)."""
    sub = copy_graph(graph)
    sub.outputs = [tensor_by_name(sub, n) for n in table_names]
    sub.cleanup(remove_unused_graph_inputs=True)
    toposort(sub)
    others = [t for t in sub.inputs if t.name != pos_name]
    dep = value_dependence(sub, others)
    for name, out in zip(table_names, sub.outputs):
        if id(out) in dep:
            used = ", ".join(t.name for t in others)
            raise UnsupportedPatternError(
                f"rotary tensor {name!r} depends on the values of inputs other than {pos_name!r} "
                f"({used}); cannot tabulate it by position")
    for t in sub.tensors().values():
        if isinstance(t, gs.Constant) and is_external(t):
            raise UnsupportedPatternError(
                f"rotary frequency constant {t.name!r} is stored as external data; cannot evaluate "
                f"the rotary tables at compile time")
    return sub


def _as_float64(sub: gs.Graph) -> gs.Graph:
    """``sub`` computing in float64: float casts and float constants become double."""
    sub = copy_graph(sub)
    for node in sub.nodes:
        if node.op == "Cast" and node.attrs.get("to") in _FLOAT:
            node.attrs["to"] = onnx.TensorProto.DOUBLE
        value = node.attrs.get("value")
        if isinstance(value, gs.Constant) and np.asarray(value.values).dtype.kind == "f":
            node.attrs["value"] = gs.Constant(value.name, np.asarray(value.values, dtype=np.float64))
        for key in ("value_float", "value_floats"):
            if key in node.attrs:  # a Constant node's float attribute
                node.attrs["value"] = gs.Constant(f"{node.name}_f64", np.asarray(node.attrs.pop(key),
                                                                                 dtype=np.float64))
    wide: dict[int, gs.Constant] = {}
    for node in sub.nodes:
        for j, t in enumerate(node.inputs):
            if isinstance(t, gs.Constant) and np.asarray(t.values).dtype.kind == "f":
                if id(t) not in wide:
                    wide[id(t)] = gs.Constant(t.name, np.asarray(t.values, dtype=np.float64))
                node.inputs[j] = wide[id(t)]
    for t in sub.tensors().values():
        if isinstance(t, gs.Variable) and t not in sub.inputs:
            t.dtype, t.shape = None, None
    return sub


def _feeds(sub: gs.Graph, pos_name: str, positions: np.ndarray, free: int) -> dict:
    """Inputs for one evaluation: the positions, and zeros of the right shape for
    inputs read only through their shape (dims named like a position dim are
    bound to it, other symbolic dims to ``free``)."""
    pos = next(t for t in sub.inputs if t.name == pos_name)
    bound = {d: n for d, n in zip(pos.shape or [], positions.shape) if isinstance(d, str)}
    feeds = {pos_name: positions.astype(pos.dtype)}
    for t in sub.inputs:
        if t.name != pos_name:
            dims = [d if isinstance(d, int) else bound.get(d, free) for d in (t.shape or [])]
            feeds[t.name] = np.zeros(dims, dtype=t.dtype)
    return feeds


def _run(sub: gs.Graph, feeds: dict, what: str, runtime: bool = False) -> list[np.ndarray]:
    """``sub`` evaluated on ``feeds``: onnx's reference evaluator, or (``runtime``) ONNX
    Runtime's CPU kernels, one thread: the very ``Cos``/``Sin`` the ort target would run."""
    try:
        model = gs.export_onnx(sub, do_type_check=False)
        if runtime:
            import onnxruntime as ort
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.log_severity_level = 1, 3
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            return [np.asarray(x) for x in sess.run(None, feeds)]
        from onnx.reference import ReferenceEvaluator
        return [np.asarray(x) for x in ReferenceEvaluator(model).run(None, feeds)]
    except Exception as e:
        raise UnsupportedPatternError(
            f"cannot evaluate the rotary frequency subgraph of {what} at compile time: "
            f"{' '.join(str(e).split())[:200]}") from None


def _probes(ctx_len: int) -> list[tuple[np.ndarray, int]]:
    """Positions (and a binding for free dims) for the per-token check: one
    batch within the first half of the table, one reaching both ends of it."""
    rng = np.random.default_rng(0)
    low = rng.integers(0, max(ctx_len // 2, 1), size=(2, 5))
    wide = rng.integers(0, ctx_len, size=(3, 4))
    wide[0, 0], wide[-1, -1] = 0, ctx_len - 1
    return [(low, 3), (wide, 2)]


def tabulate(graph: gs.Graph, pos_name: str, table_names: list[str], ctx_len: int,
             wide: bool = True) -> list[np.ndarray]:
    """One table per tensor in ``table_names``: ``[ctx_len, ...]``, row p = its
    value for a token at position p, computed in float64 (``wide``, onnx's reference evaluator)
    or as the export computes it (its own dtypes, ONNX Runtime's kernels), stored in the
    tensor's dtype."""
    sub = _subgraph(graph, pos_name, table_names)
    atol, rt = (_ATOL, False) if wide else (_ATOL_OWN, True)
    wide = _as_float64(sub) if wide else sub
    what = ", ".join(repr(n) for n in table_names)
    full = _run(wide, _feeds(wide, pos_name, np.arange(ctx_len)[None], 1), what, rt)
    probes = [(positions, _run(wide, _feeds(wide, pos_name, positions, free), what, rt))
              for positions, free in _probes(ctx_len)]
    first = probes[0][0]
    dtypes = [x.dtype for x in _run(sub, _feeds(sub, pos_name, first, 3), what, rt)]
    tables = []
    for i, (name, f, dtype) in enumerate(zip(table_names, full, dtypes)):
        rows = f[0] if f.ndim >= 2 and f.shape[:2] == (1, ctx_len) else None
        if rows is None or not all(out[i].shape == p.shape + rows.shape[1:] and np.allclose(
                out[i], rows[p], rtol=0, atol=atol) for p, out in probes):
            raise UnsupportedPatternError(
                f"rotary tensor {name!r} is not a function of each token's own position "
                f"(shape {list(f.shape)} at positions 0..{ctx_len - 1}); cannot replace it by a table")
        if dtype.kind != "f":
            raise UnsupportedPatternError(f"rotary tensor {name!r} has dtype {dtype}, expected a float")
        tables.append(rows.astype(dtype))
    return tables


def _check_no_trig_on_positions(graph: gs.Graph, pos: gs.Tensor) -> None:
    dep = value_dependence(graph, [pos])
    left = [n.name for n in graph.nodes if n.op in ("Cos", "Sin") and id(n.inputs[0]) in dep]
    if left:
        raise UnsupportedPatternError(f"Cos/Sin nodes still depend on the positions: {', '.join(left)}")


@graph_pass
def rotary_tables(graph: gs.Graph, ctx: PassContext) -> gs.Graph:
    det = need("rotary_tables", ctx, "detection").detection
    if not det.rotary:
        return graph
    if ctx.ctx_len is None:
        raise SpecdecError("pass rotary_tables needs ctx.ctx_len (its tables hold one row per slot)")
    if any(n.name.startswith("specdec/rotary/") for n in graph.nodes):
        raise SpecdecError("pass rotary_tables has already run on this graph (it reads rotary tables): "
                           "run each pass once")
    # the contract's name once canonical_dims has run, the export's before
    pos_name = POSITION_IDS if graph_input(graph, POSITION_IDS) is not None else det.position_ids
    names = list(dict.fromkeys(site.table for site in det.rotary))
    tables = tabulate(graph, pos_name, names, ctx.ctx_len, wide=ctx.target != "ort")
    graph = copy_graph(graph)
    b = Builder(graph, "rotary")
    pos = tensor_by_name(graph, pos_name)
    row = b.op("Max", [pos, b.const(0, pos.dtype, hint="first_row")], hint="table_row",
               dtype=pos.dtype, shape=pos.shape)
    shared: dict[tuple, gs.Constant] = {}
    ops = {site.table: site.op.lower() for site in det.rotary}
    for name, table in zip(names, tables):
        key = (table.dtype.str, table.shape, table.tobytes())
        if key not in shared:
            shared[key] = b.const(table, hint=f"{ops[name]}_table")
        rows = b.op("Gather", [shared[key], row], attrs={"axis": 0}, hint=f"{ops[name]}_rows",
                    dtype=table.dtype)
        replace_uses(graph, tensor_by_name(graph, name), rows)
    graph.cleanup(remove_unused_graph_inputs=False)
    _check_no_trig_on_positions(graph, pos)
    return graph
