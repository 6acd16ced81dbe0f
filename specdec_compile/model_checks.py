"""Checks of a model before any pass, detector or ONNX Runtime reads it.

A compiler takes models from wherever users got them: each check here turns a
broken or hostile graph into one ``SpecdecError`` line naming the problem,
where it would otherwise reach a pass as an internal error, hang, or be
written into an artifact ONNX Runtime then refuses to load.

    check_model_input(model, what)   all of the below (``io.load_model`` and
                                     ``io.read_any`` call it on every model read)

Refused: an IR version or opset this onnx does not know, no opset for the ONNX
domain, an opset below 13 (*); a graph input or output declared twice, a tensor two
nodes produce, a node input nothing defines, a cycle; an op of a domain neither
ONNX Runtime nor the model (its functions) defines (*), or one its opset_import does
not declare; a graph input or output dim
below 0 or above ``MAX_DIM``; an initializer or Constant tensor of an unknown
dtype, with a dim below 0, or whose inline data is not as long as its dims and
dtype say. (External data is checked against its files by ``io.check_external_data``.)
(*): the compiler's own limits, not applied with ``compiler=False`` (``diff`` reads any valid model).

    check_position_table(graph, ctx_len)   the imported graph (``pipeline.prepare`` calls it):
                                     a --ctx-len longer than a learned position table
    refuse_compiled(model, what)     a model that is already compiled (``AlreadyCompiledError``):
                                     the compiler's input is a stock export, never its own output
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .contract import POSITION_IDS, ROLE_KEY
from .errors import SpecdecError

#: the largest static dim a graph input or output may declare
MAX_DIM = 2 ** 31 - 1
#: the oldest opset the passes rewrite (``passes.lower`` says the same)
MIN_OPSET = 13
#: domains ONNX Runtime implements (and the one this compiler's own qaic graphs use)
KNOWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.qualcomm.cloud"})

_T = onnx.TensorProto
_FOUR_BIT = {getattr(_T, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(_T, n)}
_DTYPES = {v for _, v in _T.DataType.items()} - {_T.UNDEFINED}


def check_model_input(model: onnx.ModelProto, what: str, *, compiler: bool = True) -> None:
    """One-line SpecdecError (prefixed ``what``) for the first problem found, else None.
    ``compiler=False`` (a reader that only compares graphs, such as ``diff``): any opset and any
    domain the model declares are taken; the compiler's own limits (an opset from ``MIN_OPSET``,
    domains ONNX Runtime implements) are not applied. Every other check is."""
    bad = _not_utf8(model)
    if bad is not None:
        raise SpecdecError(f"{what}: a {bad} is not valid UTF-8 text (a corrupt or hostile file)")
    _check_versions(model, what, compiler)
    _check_graph_names(model.graph, what)
    _check_domains(model, what, compiler)
    _check_dims(model.graph, what)
    for t, where in tensors(model):
        check_tensor(t, f"{what}: {where}")


def _not_utf8(msg) -> str | None:
    """The name of the first string field holding bytes that are not UTF-8 (protobuf then hands
    bytes, not str, to every reader), else None."""
    for fd, value in msg.ListFields():
        if fd.type not in (fd.TYPE_STRING, fd.TYPE_MESSAGE):
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        for v in (value if repeated else [value]):
            if fd.type == fd.TYPE_STRING:
                if isinstance(v, bytes):
                    return f"{msg.DESCRIPTOR.name}.{fd.name}"
            else:
                found = _not_utf8(v)
                if found is not None:
                    return found
    return None


def _check_versions(model: onnx.ModelProto, what: str, compiler: bool) -> None:
    if model.ir_version > onnx.IR_VERSION:
        raise SpecdecError(f"{what}: IR version {model.ir_version} is newer than this onnx {onnx.__version__} "
                           f"knows (at most {onnx.IR_VERSION})")
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not default:
        raise SpecdecError(f"{what}: declares no opset for the ONNX domain (opset_import lacks it)")
    newest = onnx.defs.onnx_opset_version()
    if default[0] > newest:
        raise SpecdecError(f"{what}: opset {default[0]} is newer than this onnx {onnx.__version__} knows "
                           f"(at most {newest})")
    if compiler and default[0] < MIN_OPSET:
        raise SpecdecError(f"{what}: source opset {default[0]} is older than {MIN_OPSET}; re-export with "
                           f"opset >= {MIN_OPSET}")


def _twice(names, what: str, kind: str) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise SpecdecError(f"{what}: {kind} {n!r} is declared twice")
        seen.add(n)


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph's nodes read that it does not define itself (outer-scope reads)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    reads = set()
    for n in graph.node:
        reads.update(i for i in n.input if i)
        reads.update(_subgraph_reads(n))
        defined.update(n.output)
    return reads - defined


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    found = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            found |= _outer_reads(g)
    return found


def _check_graph_names(graph: onnx.GraphProto, what: str) -> None:
    """Duplicate inputs/outputs/producers, undefined node inputs and cycles (the top graph)."""
    _twice([i.name for i in graph.input], what, "graph input")
    _twice([o.name for o in graph.output], what, "graph output")
    sources = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    made_by: dict[str, str] = {}
    for i, n in enumerate(graph.node):
        for o in n.output:
            if not o:
                continue
            if o in made_by or o in sources:
                first = made_by.get(o, "a graph input or initializer")
                raise SpecdecError(f"{what}: tensor {o!r} is produced twice (by {first} and by node "
                                   f"{n.name or n.op_type + '#' + str(i)!r})")
            made_by[o] = repr(n.name or f"{n.op_type}#{i}")
    needs = []
    for i, n in enumerate(graph.node):
        wanted = {x for x in n.input if x} | _subgraph_reads(n)
        for x in sorted(wanted):
            if x not in sources and x not in made_by:
                raise SpecdecError(f"{what}: node {n.name or n.op_type + '#' + str(i)!r} reads {x!r}, which no "
                                   f"node, graph input or initializer defines")
        needs.append({x for x in wanted if x in made_by})
    for o in graph.output:
        if o.name not in sources and o.name not in made_by:
            raise SpecdecError(f"{what}: graph output {o.name!r} is not computed by any node")
    _check_acyclic(graph, needs, made_by, what)


def _check_acyclic(graph: onnx.GraphProto, needs: list[set[str]], made_by: dict, what: str) -> None:
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output if o}
    users: dict[int, list[int]] = {}
    indegree = []
    for i, wanted in enumerate(needs):
        deps = {producer[x] for x in wanted}
        indegree.append(len(deps))
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for u in users.get(i, ()):
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    if done != len(graph.node):
        stuck = next(i for i, d in enumerate(indegree) if d > 0)
        n = graph.node[stuck]
        raise SpecdecError(f"{what}: the graph has a cycle (node {n.name or n.op_type!r} depends on its own output)")


def _check_domains(model: onnx.ModelProto, what: str, compiler: bool) -> None:
    local = {f.domain for f in model.functions}
    imported = {o.domain for o in model.opset_import}
    for n in _all_nodes(model.graph):
        d = n.domain
        if compiler and d not in KNOWN_DOMAINS and d not in local:
            raise SpecdecError(f"{what}: node {n.name or n.op_type!r} is op {n.op_type} of domain {d!r}, which "
                               f"neither ONNX Runtime nor the model's functions define")
        if d not in ("", "ai.onnx") and d not in imported:
            raise SpecdecError(f"{what}: node {n.name or n.op_type!r} uses domain {d!r}, which the model's "
                               f"opset_import does not declare")


def _all_nodes(graph: onnx.GraphProto):
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _all_nodes(g)


def _check_dims(graph: onnx.GraphProto, what: str) -> None:
    for kind, vis in (("input", graph.input), ("output", graph.output)):
        for vi in vis:
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and not 0 <= d.dim_value <= MAX_DIM:
                    raise SpecdecError(f"{what}: graph {kind} {vi.name!r} declares dim {axis} = {d.dim_value} "
                                       f"(allowed: 0 to {MAX_DIM})")


def tensors(model: onnx.ModelProto):
    """(tensor, "initializer 'x'" | "the tensor of node 'n'") of the top graph."""
    for t in model.graph.initializer:
        yield t, f"initializer {t.name!r}"
    for n in model.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t, f"the {a.name} tensor of node {n.name or n.op_type!r}"


def tensor_bytes(t: onnx.TensorProto) -> int | None:
    """The bytes the data of ``t`` takes by its dims and dtype (None: not a fixed-size dtype)."""
    n = math.prod(t.dims)
    if t.data_type in _FOUR_BIT:
        return (n + 1) // 2
    if t.data_type == _T.STRING:
        return None
    return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def _field_count(t: onnx.TensorProto) -> tuple[str, int] | None:
    """(field, values it must hold) of a tensor stored in a typed field, None where not checked."""
    n = math.prod(t.dims)
    if t.data_type in _FOUR_BIT:
        return "int32_data", (n + 1) // 2
    if t.data_type in (_T.COMPLEX64, _T.COMPLEX128):
        return onnx.helper.tensor_dtype_to_field(t.data_type), 2 * n
    return onnx.helper.tensor_dtype_to_field(t.data_type), n


def check_tensor(t: onnx.TensorProto, where: str) -> None:
    """dtype known, dims >= 0, inline data exactly as long as dims and dtype say."""
    if t.data_type not in _DTYPES:
        raise SpecdecError(f"{where}: unknown dtype {t.data_type}")
    if any(d < 0 for d in t.dims):
        raise SpecdecError(f"{where}: dims {list(t.dims)} (a dim below 0)")
    if t.data_location == _T.EXTERNAL:
        return
    if t.data_type == _T.STRING:
        return
    name = _T.DataType.Name(t.data_type)
    if t.HasField("raw_data"):
        size = tensor_bytes(t)
        if len(t.raw_data) != size:
            raise SpecdecError(f"{where}: holds {len(t.raw_data)} bytes of data, its dims {list(t.dims)} and "
                               f"dtype {name} need {size}")
        return
    field, count = _field_count(t)
    got = len(getattr(t, field))
    if got != count:
        raise SpecdecError(f"{where}: holds {got} values, its dims {list(t.dims)} and dtype {name} need {count}")


# --------------------------------------------------------------------------- already compiled


class AlreadyCompiledError(SpecdecError):
    """The model given to the compiler is already a retained-state graph (``compiled_marker``);
    ``what`` and ``marker`` let a caller say it in its own terms (``diff --passes``)."""

    def __init__(self, what: str, marker: str):
        self.what, self.marker = what, marker
        super().__init__(f"{what} is already compiled ({marker}): the compiler rewrites a stock export (optimum "
                         f"or torch dynamo), not its own output; give the export it was compiled from")


def compiled_marker(model: onnx.ModelProto) -> str | None:
    """What shows ``model`` is already a retained-state graph: this compiler's ``specdec.role``
    metadata, or a ``*_RetainedState`` output (the contract's, or a QEfficient export's); None: neither."""
    role = next((p.value for p in model.metadata_props if p.key == ROLE_KEY), None)
    if role is not None:
        return f"its metadata {ROLE_KEY} is {role[:40]!r}"
    retained = next((o.name for o in model.graph.output if o.name.endswith("_RetainedState")), None)
    if retained is not None:
        return f"it has the retained-state output {retained[:80]!r}"
    return None


def refuse_compiled(model: onnx.ModelProto, what: str) -> None:
    """``AlreadyCompiledError`` (a one-line ``SpecdecError``) for a model that is already compiled."""
    marker = compiled_marker(model)
    if marker is not None:
        raise AlreadyCompiledError(what, marker)


# --------------------------------------------------------------------------- learned position tables


#: ops a position index passes through unchanged on its way to a learned position table
_POSITION_PASSTHROUGH = ("Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Max", "Clip")


def _position_offset(value) -> int | None:
    """The constant a position index ``value`` adds to ``position_ids`` (OPT's table starts at 2),
    following ``_POSITION_PASSTHROUGH`` ops and Adds of a constant scalar; None: not position_ids."""
    offset = 0
    for _ in range(8):
        if not value.inputs:
            return offset if value.name == POSITION_IDS else None
        node = value.inputs[0]
        if node.op == "Add" and len(node.inputs) == 2:
            const = [(x, c) for x in node.inputs if (c := _scalar(x)) is not None]
            if len(const) != 1:
                return None
            offset += const[0][1]
            value = next(x for x in node.inputs if x is not const[0][0])
        elif node.op in _POSITION_PASSTHROUGH and node.inputs:
            value = node.inputs[0]
        else:
            return None
    return None


def _scalar(value) -> int | None:
    """The integer a one-element constant (an initializer or a Constant node's output) holds."""
    if not isinstance(value, gs.Constant) and len(value.inputs) == 1 and value.inputs[0].op == "Constant":
        value = value.inputs[0].attrs.get("value")
    if isinstance(value, gs.Constant) and isinstance(value.values, np.ndarray) and value.values.size == 1 \
            and np.issubdtype(value.values.dtype, np.integer):
        return int(value.values.reshape(-1)[0])
    return None


def check_position_table(graph: gs.Graph, ctx_len: int) -> None:
    """(Of the imported graph, before any pass.) Refuse a context longer than a learned position embedding (a Gather from a constant table
    at ``position_ids``, GPT-2's wpe, OPT's embed_positions): its positions past the table would
    index rows that do not exist."""
    for node in graph.nodes:
        if (node.op != "Gather" or len(node.inputs) != 2 or not isinstance(node.inputs[0], gs.Constant)
                or node.attrs.get("axis", 0) != 0 or len(node.inputs[0].shape) != 2):
            continue
        offset = _position_offset(node.inputs[1])
        rows = int(node.inputs[0].shape[0])
        if offset is not None and ctx_len - 1 + offset >= rows:
            raise SpecdecError(f"--ctx-len {ctx_len} is longer than the model's learned position table "
                               f"({node.name}: {rows} rows{f', positions offset by {offset}' if offset else ''}): "
                               f"use --ctx-len {rows - offset} or less")
