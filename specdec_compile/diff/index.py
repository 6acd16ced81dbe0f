"""The graph index a diff works on: producers, consumers, layers, a topological order,
and the digests and descriptions of node attributes and value types."""
from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict

import onnx
from onnx import AttributeProto, TensorProto

from ..value_types import dim, dims, dtype_name
from .hashing import TensorHasher, short_digest
from .subgraphs import graph_digest, node_domain, node_outer_names, subgraphs, topo_order

_LAYER_PATTERNS = [
    re.compile(r"(?:^|[/._:\s\-])layers?[._/](\d+)(?=$|[/._:\s\-])"),
    re.compile(r"(?:^|[/._])L(\d+)(?=$|[/._])"),
    re.compile(r"(?:^|[/.])(?:h|blocks?|decoder_layers?)\.(\d+)(?=$|[/.])"),
]


def layer_of_name(name: str) -> int | None:
    """The transformer layer index a node or value name refers to, or None."""
    if not name:
        return None
    for pat in _LAYER_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def node_layer(node: onnx.NodeProto) -> int | None:
    """Layer of a node: from its name, its exporter scope metadata, then its outputs."""
    lay = layer_of_name(node.name)
    if lay is not None:
        return lay
    for p in node.metadata_props:
        if p.key in ("pkg.torch.onnx.name_scopes", "namespace"):
            lay = layer_of_name(p.value)
            if lay is not None:
                return lay
    for o in node.output:
        lay = layer_of_name(o)
        if lay is not None:
            return lay
    return None


# --------------------------------------------------------------------------- value types


def type_desc(tp: onnx.TypeProto) -> tuple[str, list | None]:
    """(dtype, shape) of a value; shape entries are ints, dim names, or '?'. A sequence, optional or
    map shows its element type (``sequence(float32)``) and the shape of its tensor elements."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return dtype_name(tp.tensor_type.elem_type), dims(tp)
    if kind == "sparse_tensor_type":
        st = tp.sparse_tensor_type
        shape = [dim(d) for d in st.shape.dim] if st.HasField("shape") else None
        return f"sparse_tensor({dtype_name(st.elem_type)})", shape
    if kind in ("sequence_type", "optional_type"):
        inner, shape = type_desc(getattr(tp, kind).elem_type)
        return f"{kind[:-5]}({inner})", shape
    if kind == "map_type":
        inner, shape = type_desc(tp.map_type.value_type)
        return f"map({dtype_name(tp.map_type.key_type)}, {inner})", shape
    if kind is None:
        return "?", None
    return kind.replace("_type", ""), None


def fmt_shape(shape) -> str:
    if shape is None:
        return "[?]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


# --------------------------------------------------------------------------- graph index


class GraphIndex:
    """One model's nodes, producers, consumers, layers and topological order, for diffing.

    ``base_dir`` is where its external data lives; ``hasher`` hashes its tensors.
    """

    def __init__(self, model: onnx.ModelProto, base_dir, hasher: TensorHasher):
        self.model = model
        g = model.graph
        self.base_dir = base_dir
        self.hasher = hasher
        self.nodes = list(g.node)
        self.inits = {t.name: t for t in g.initializer}
        # an initializer also listed in graph.input (IR-3 exports list them all; later IRs make it an
        # overridable default) is an initializer, compared by content, not a runtime input; that it
        # is listed is one of its properties (``listed``), shown when it changes
        self.inputs = {v.name: v for v in g.input if v.name not in self.inits}
        self.input_order = [v.name for v in g.input if v.name not in self.inits]
        self.listed = {v.name for v in g.input if v.name in self.inits}
        self.outputs = {v.name: v for v in g.output}
        self.output_order = [v.name for v in g.output]
        self.producer: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, n in enumerate(self.nodes):
            for k, o in enumerate(n.output):
                if o:
                    self.producer[o] = (i, k)
            for s, x in enumerate(n.input):
                if x:
                    self.consumers[x].append((i, s))
        # the tensors of this graph that a node's subgraphs read (If/Loop/Scan): wiring, like its inputs
        self.outer = [node_outer_names(n) if n.attribute else [] for n in self.nodes]
        self.layers = [node_layer(n) for n in self.nodes]
        self.order = self._topo_order()
        self.pos = {i: p for p, i in enumerate(self.order)}
        self._attr_digest: dict[int, str] = {}

    def _topo_order(self) -> list[int]:
        return topo_order(self.nodes, [list(n.input) + self.outer[i] for i, n in enumerate(self.nodes)])

    def attr_digest(self, i: int) -> str:
        d = self._attr_digest.get(i)
        if d is None:
            n = self.nodes[i]
            parts = [f"{a.name}={attr_value_digest(a, self)}" for a in sorted(n.attribute, key=lambda a: a.name)]
            if n.overload:
                parts.append(f"(overload)={n.overload}")
            d = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()
            self._attr_digest[i] = d
        return d

    def content_key(self, i: int) -> tuple:
        n = self.nodes[i]
        return (node_domain(n), n.op_type, self.attr_digest(i), len(n.input), len(n.output))

    def outer_digest(self, i: int, resolve) -> str:
        """Node i's subgraphs with each tensor they read from this graph as ``resolve(name)``."""
        return ",".join(graph_digest(sg, resolve, lambda a: attr_value_digest(a, self), _value_token,
                                     lambda t: _tensor_token(t, self)) for sg in subgraphs(self.nodes[i]))


# --------------------------------------------------------------------------- attributes


def attr_value_digest(a: AttributeProto, g: GraphIndex) -> str:
    if a.ref_attr_name:
        return f"@{a.ref_attr_name}"
    if a.type == AttributeProto.TENSOR:
        return _tensor_token(a.t, g)
    if a.type == AttributeProto.TENSORS:
        return "[" + ",".join(_tensor_token(t, g) for t in a.tensors) + "]"
    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        # the structure, without names or node order; which outer tensors it reads is wiring
        return subgraph_attr_digest(a, lambda x: "outer", lambda t: _tensor_token(t, g),
                                    lambda b: attr_value_digest(b, g))
    return repr(onnx.helper.get_attribute_value(a))


def subgraph_attr_digest(a: AttributeProto, resolve, tensor, leaf) -> str:
    graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
    return "[" + ",".join(graph_digest(x, resolve, leaf, _value_token, tensor) for x in graphs) + "]"


def _value_token(v: onnx.ValueInfoProto) -> str:
    return repr(type_desc(v.type))


def _tensor_token(t: TensorProto, g: GraphIndex) -> str:
    return f"{dtype_name(t.data_type)}{list(t.dims)}{g.hasher.digest(t, g.base_dir)}"


def attr_display(a: AttributeProto | None, g: GraphIndex) -> str | None:
    """An attribute's value as the report shows it (tensors and graphs by short digest)."""
    if a is None:
        return None
    if a.ref_attr_name:
        return f"@{a.ref_attr_name}"
    if a.type == AttributeProto.TENSOR:
        t = a.t
        return f"tensor {dtype_name(t.data_type)} {fmt_shape(list(t.dims))} {short_digest(g.hasher.digest(t, g.base_dir))}"
    if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.TENSORS):
        return f"{AttributeProto.AttributeType.Name(a.type).lower()} " + short_digest("sha256:" + hashlib.sha256(
            attr_value_digest(a, g).encode()).hexdigest())
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    elif isinstance(v, list):
        v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
    return json.dumps(v)


def op_key(n: onnx.NodeProto) -> str:
    """``Op`` for the default domain, ``domain::Op`` otherwise."""
    d = node_domain(n)
    return n.op_type if d == "" else f"{d}::{n.op_type}"

