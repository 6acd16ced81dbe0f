"""Evaluate the position/mask part of a graph for one probe input, without weights.

Some facts are easier to read off what a subgraph *computes* than off its op
pattern: the window a layer's mask encodes (an exporter builds it from a
constant, a Trilu over a buffer, a Sub and a Greater, ...), or that a tensor
holds the query positions. ``Probe`` evaluates the *cone* of given tensors
(every node their values depend on) for a concrete input: batch 1, ``seq``
new tokens after ``past`` cached ones, ``attention_mask`` all ones and
``position_ids`` = past..past+seq-1.

No weight is read: the cone stops at ``Shape`` nodes over float activations
(their static shape for the probe comes from ONNX shape inference on a copy of
the model whose inputs have the probe's static dims), and a cone that needs an
activation's *values* (a MatMul, a float graph input) is refused with
``ProbeError``."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph_utils import const_value, producer

#: ops whose output values depend on learned weights or activations: a mask never needs them
_ACTIVATION_OPS = {"MatMul", "Gemm", "Conv", "Softmax", "LayerNormalization", "ReduceMean", "Pow", "Sqrt",
                   "Erf", "Tanh", "Sigmoid", "Exp", "Log"}
#: of those, the elementwise ones: they read no weight themselves (``Probe(..., elementwise=True)``
#: evaluates them, for a cone already known not to depend on the activations)
ELEMENTWISE_OPS = frozenset({"Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Exp", "Log"})


class ProbeError(Exception):
    """The cone cannot be evaluated without activations (message: why)."""


class InvalidGraphError(ProbeError):
    """ONNX Runtime cannot load the graph at all: it is not valid ONNX, whatever its mask."""


def _is_float_tensor(t: gs.Tensor, types: dict[str, int]) -> bool:
    elem = types.get(t.name)
    if elem is None and t.dtype is not None:
        try:
            return np.dtype(t.dtype).kind == "f"
        except TypeError:
            return True
    return elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                    onnx.TensorProto.DOUBLE)


class Probe:
    """``Probe(graph, dims).values([tensor, ...])``: their values for the probe.

    ``dims``: graph input name -> static shape for the probe (every input the
    graph has). ``feeds``: input name -> value for the integer inputs the cones
    may read (attention_mask, position_ids). ``elementwise``: evaluate ``ELEMENTWISE_OPS`` too."""

    def __init__(self, graph: gs.Graph, dims: dict[str, list[int]], feeds: dict[str, np.ndarray],
                 elementwise: bool = False):
        self.graph = graph
        self.feeds = feeds
        self.dims = dims
        self.refused = _ACTIVATION_OPS - ELEMENTWISE_OPS if elementwise else _ACTIVATION_OPS
        self.shapes, self.types = _static_shapes(graph, dims)

    def dtype(self, name: str) -> int | None:
        """The ONNX element type of tensor ``name`` as inference found it."""
        return self.types.get(name)

    def values_each(self, targets: list[gs.Tensor]) -> list:
        """``values``, one tensor at a time when the batch fails: each a value or the ``ProbeError``
        that tensor gave."""
        try:
            return self.values(targets)
        except ProbeError:
            out = []
            for t in targets:
                try:
                    out.append(self.values([t])[0])
                except ProbeError as e:
                    out.append(e)
            return out

    def values(self, targets: list[gs.Tensor]) -> list[np.ndarray]:
        g = self.graph.copy()
        tensors = g.tensors()
        outs = [tensors[t.name] for t in targets]
        _cut_shapes(g, outs, self.shapes, self.types, self.refused)
        used = _cone_inputs(g, outs)
        for t in outs:
            if t.dtype is None and self.types.get(t.name) is not None:
                t.dtype = onnx.helper.tensor_dtype_to_np_dtype(self.types[t.name])
        g.inputs = [t for t in g.inputs if t.name in used]
        g.outputs = outs
        g.cleanup(remove_unused_graph_inputs=True)
        feeds = {}
        for t in g.inputs:   # integer inputs as probed; float inputs (read for their shape): zeros
            if t.name in self.feeds:
                feeds[t.name] = self.feeds[t.name]
            elif t.name in self.dims:
                elem = self.types.get(t.name) or onnx.TensorProto.FLOAT
                feeds[t.name] = np.zeros(self.dims[t.name], onnx.helper.tensor_dtype_to_np_dtype(elem))
            else:
                raise ProbeError(f"the values depend on graph input {t.name!r}")
        model = gs.export_onnx(g, do_type_check=False)
        return _run(model, feeds, [t.name for t in outs])


_LIGHT: dict[int, tuple] = {}


def _light_model(graph: gs.Graph) -> onnx.ModelProto:
    """The graph as a model proto without value_info and output shapes (cached
    per graph object, for the probes of one detection)."""
    hit = _LIGHT.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    model = gs.export_onnx(graph, do_type_check=False)
    del model.graph.value_info[:]
    for o in model.graph.output:
        o.type.tensor_type.ClearField("shape")
    _LIGHT.clear()
    _LIGHT[id(graph)] = (graph, model)
    return model


def _static_shapes(graph: gs.Graph, dims: dict[str, list[int]]) -> tuple[dict, dict]:
    """name -> static shape (list of ints, or None) and name -> elem type, by
    shape inference on a weightless copy of the model with static input dims."""
    model = onnx.ModelProto()
    model.CopyFrom(_light_model(graph))
    for vi in model.graph.input:
        if vi.name in dims:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in dims[vi.name]:
                shape.dim.add().dim_value = int(d)
    keep, moved = [], []
    for init in model.graph.initializer:   # weights become typed inputs: no data is read
        if init.data_location == onnx.TensorProto.EXTERNAL or init.ByteSize() > 4096:
            moved.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    model.graph.input.extend(moved)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as e:  # pragma: no cover - inference crashes are reported, not raised
        raise ProbeError(f"shape inference failed: {' '.join(str(e).split())[:200]}") from None
    shapes, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        ds = tt.shape.dim if tt.HasField("shape") else None
        shapes[vi.name] = ([d.dim_value if d.HasField("dim_value") else None for d in ds]
                           if ds is not None else None)
    for init in inferred.graph.initializer:
        types[init.name] = init.data_type
        shapes[init.name] = list(init.dims)
    return shapes, types


def _cut_shapes(g: gs.Graph, outs: list[gs.Tensor], shapes: dict, types: dict,
                refused: set[str] = frozenset(_ACTIVATION_OPS)) -> None:
    """Replace each Shape in the cone of ``outs`` whose input has a static
    shape by its value. The values themselves must not need activations
    (refused); behind a Shape whose input's shape inference could not fix,
    the cone is evaluated for its shape only, with weights of zeros."""
    seen, stack = set(), [(t, False) for t in outs]
    while stack:
        t, shape_only = stack.pop()
        if shape_only and isinstance(t, gs.Constant) and t.values.nbytes > (1 << 16):
            _zeros_like(g, t)
        n = producer(t)
        if n is None or (id(n), shape_only) in seen or (id(n), True) in seen:
            continue
        seen.add((id(n), shape_only))
        value = _static_value(n, shapes)
        if value is not None:
            out = n.outputs[0]
            n.outputs.clear()          # the tensor is now a constant with no producer
            out.to_constant(value)
            continue
        if not shape_only and n.op in refused:
            raise ProbeError(f"the values depend on activations ({n.op} node {n.name!r})")
        for sub in n.attrs.values():
            if isinstance(sub, gs.Graph):
                raise ProbeError(f"control flow ({n.op} node {n.name!r}) on the way")
        for x in n.inputs:
            if not shape_only and x in g.inputs and _is_float_tensor(x, types):
                raise ProbeError(f"the values depend on float graph input {x.name!r}")
            stack.append((x, shape_only or n.op == "Shape"))


def _zeros_like(g: gs.Graph, c: gs.Constant) -> None:
    """Make constant ``c`` (a weight read only for its shape) a ConstantOfShape of zeros."""
    shape, dtype = np.asarray(c.shape, dtype=np.int64), c.dtype
    out = gs.Variable(c.name + "__zeros", dtype=dtype, shape=list(c.shape))
    for node in list(c.outputs):
        for i, x in enumerate(node.inputs):
            if x is c:
                node.inputs[i] = out
    g.nodes.append(gs.Node("ConstantOfShape", inputs=[gs.Constant(c.name + "__shape", shape)], outputs=[out],
                           attrs={"value": gs.Constant(c.name + "__zero", np.zeros(1, dtype=dtype))}))


def _shape_of(n: gs.Node, shapes: dict) -> list | None:
    """The (possibly partial) static output of Shape node ``n``."""
    shape = shapes.get(n.inputs[0].name)
    if shape is None:
        return None
    start, end = int(n.attrs.get("start", 0)), n.attrs.get("end")
    return shape[start:None if end is None else int(end)]


def _static_value(n: gs.Node, shapes: dict) -> np.ndarray | None:
    """The probe value of a Shape node's output, or of a Gather of known dims
    from a partially known shape; None when not static."""
    if n.op == "Shape":
        shape = _shape_of(n, shapes)
        if shape is not None and all(d is not None for d in shape):
            return np.asarray(shape, dtype=np.int64)
    src = producer(n.inputs[0]) if n.op == "Gather" and n.inputs else None
    if src is not None and src.op == "Shape" and int(n.attrs.get("axis", 0)) == 0:
        shape, idx = _shape_of(src, shapes), const_value(n.inputs[1])
        if shape is not None and idx is not None:
            picked = np.asarray(shape, dtype=object)[idx.astype(np.int64)]
            if all(d is not None for d in np.asarray(picked).reshape(-1)):
                return np.asarray(picked, dtype=np.int64)
    return None


def _cone_inputs(g: gs.Graph, outs: list[gs.Tensor]) -> set[str]:
    names, seen, stack = set(), set(), list(outs)
    inputs = {id(t) for t in g.inputs}
    while stack:
        t = stack.pop()
        if id(t) in inputs:
            names.add(t.name)
        n = producer(t)
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack += list(n.inputs)
    return names


def _run(model: onnx.ModelProto, feeds: dict, names: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4   # failures are reported once, as our own line
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # the graph itself is invalid (a node's types, attributes or schema)
        raise InvalidGraphError(f"ONNX Runtime refuses it: {' '.join(str(e).split())[:300]}") from None
    try:
        return sess.run(names, feeds)
    except Exception as e:
        raise ProbeError(f"evaluation failed: {' '.join(str(e).split())[:200]}") from None


def probe_inputs(graph: gs.Graph, past: int, seq: int, int_inputs: dict[str, gs.Tensor | None],
                 past_inputs: list[gs.Tensor]) -> tuple[dict, dict]:
    """(dims, feeds) of the probe: batch 1, ``seq`` tokens after ``past``.
    ``int_inputs``: role -> input (input_ids, position_ids, attention_mask)."""
    dims, feeds = {}, {}
    ids, pos, am = (int_inputs.get(k) for k in ("input_ids", "position_ids", "attention_mask"))
    dims[ids.name] = [1, seq]
    feeds[ids.name] = np.zeros((1, seq), dtype=_np_type(ids))
    if pos is not None:
        dims[pos.name] = [1, seq]
        feeds[pos.name] = np.arange(past, past + seq, dtype=_np_type(pos))[None]
    if am is not None:
        dims[am.name] = [1, past + seq]
        feeds[am.name] = np.ones((1, past + seq), dtype=_np_type(am))
    for t in past_inputs:
        shape = list(t.shape or [])
        if len(shape) != 4 or not all(isinstance(d, int) for d in (shape[1], shape[3])):
            raise ProbeError(f"past input {t.name!r} has shape {t.shape}")
        dims[t.name] = [1, shape[1], past, shape[3]]
    return dims, feeds


def _np_type(t: gs.Tensor):
    try:
        return np.dtype(t.dtype) if t.dtype is not None else np.int64
    except TypeError:
        return np.int64
