"""``PassContext``: the one argument every pass takes besides the graph."""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from numbers import Real

import onnx
import onnx_graphsurgeon as gs

from ..contract import INTERFACES, MASK_VALUE
from ..detect import Detection
from ..errors import SpecdecError
from ..graph_utils import NotInGraph
from ..model_checks import MIN_OPSET
from ..options import MAX_CTX_LEN, check_options, is_int


class PassArgumentError(SpecdecError, TypeError):
    """A pass called with something other than (an onnx-graphsurgeon graph, a ``PassContext``):
    a ``SpecdecError`` (one line), and a ``TypeError`` for callers that catch one."""


@dataclass(frozen=True)
class PassContext:
    """What a pass may read besides the graph. Frozen: no pass changes it, so
    one context serves a whole pipeline.

    detection     the ``Detection`` of the original graph (names, valid across copies)
    role          "tlm" | "dlm"
    target        "qaic" | "ort" | "openvino"
    k             speculation length (recorded; today no pass's graph depends on it)
    mask_value    the fill for masked scores: large, finite, negative
    source_opset  the exported model's opset (``lower`` reads it; None: the graph's own)
    ctx_len       the context length the artifact is compiled for (``rotary_tables``
                  builds tables of exactly this many rows)
    exposed_layers the decoder layers whose outputs ``expose_hidden_states`` adds as an
                  output (as given: negative from the end; a TLM's --hidden-states, a feature
                  draft's own last layer); None: none. The pass resolves them.
    interface     "default" or "qeff" (QEfficient's: ``batch_index``, ``logits_to_keep``)
    continuous_batching  with "qeff": QEfficient's continuous batching (the input ``batch_index``)
    fuse_rotary   ort: rotate q/k with ONNX Runtime's ``RotaryEmbedding`` kernel (``fuse_rotary``);
                  off by default: the kernel rounds differently (fused multiply-adds), within
                  1e-4 on the fixtures but not on every model (SmolLM2-135M: 4.8e-4)

    A field a pass does not read may stay None; a pass that needs one refuses
    to run without it (``need``). Options for passes to come (a window size,
    an ALiBi slope table) are new fields with defaults.
    """
    detection: Detection | None = None
    role: str | None = None
    target: str | None = None
    k: int | None = None
    mask_value: float = MASK_VALUE
    source_opset: int | None = None
    ctx_len: int | None = None
    exposed_layers: tuple[int, ...] | None = None
    interface: str = "default"
    continuous_batching: bool = False
    fuse_rotary: bool = False

    @classmethod
    def from_options(cls, options, **fields) -> "PassContext":
        """The context of a compile with ``options`` (an ``Options``, checked when it was built:
        trusted here, not checked again) and ``fields`` (detection, source_opset, ...)."""
        ctx = object.__new__(cls)
        given = {"role": options.role, "target": options.target, "k": options.k, "ctx_len": options.ctx_len,
                 "interface": options.interface, "continuous_batching": options.continuous_batching, **fields}
        for f in dataclasses.fields(cls):
            object.__setattr__(ctx, f.name, given.get(f.name, f.default))
        return ctx

    def __post_init__(self):
        check_options(self.role, self.target, self.k, optional=True)
        if self.ctx_len is not None and (not is_int(self.ctx_len) or not 1 <= self.ctx_len <= MAX_CTX_LEN):
            raise SpecdecError(f"ctx_len must be an integer >= 1 and <= {MAX_CTX_LEN}, got {self.ctx_len!r}")
        if self.detection is not None and not isinstance(self.detection, Detection):
            raise SpecdecError(f"PassContext.detection must be a Detection, got {type(self.detection).__name__}")
        self._check_fields()

    def _check_fields(self) -> None:
        """The fields besides role, target, k, ctx_len and detection (a context built by hand)."""
        mv = self.mask_value
        if not isinstance(mv, Real) or isinstance(mv, bool) or math.isnan(mv) or mv >= 0:
            # -inf passes (drop_nan_guards then keeps the export's NaN guards); NaN or >= 0 would unmask
            raise SpecdecError(f"PassContext.mask_value must be a negative number, got {mv!r}")
        newest = onnx.defs.onnx_opset_version()
        if self.source_opset is not None and (not is_int(self.source_opset)
                                              or not MIN_OPSET <= self.source_opset <= newest):
            raise SpecdecError(f"PassContext.source_opset must be an opset from {MIN_OPSET} to {newest} "
                               f"(None: the graph's own), got {self.source_opset!r}")
        layers = self.exposed_layers
        if layers is not None:
            if not isinstance(layers, (tuple, list)) or not layers or not all(is_int(v) for v in layers):
                raise SpecdecError(f"PassContext.exposed_layers must be a non-empty tuple of layer indices "
                                   f"(integers; None: none), got {layers!r}")
            object.__setattr__(self, "exposed_layers", tuple(layers))
        if self.interface not in INTERFACES:
            raise SpecdecError(f"unknown interface {self.interface!r} (choose from {', '.join(INTERFACES)})")
        for name in ("continuous_batching", "fuse_rotary"):
            if not isinstance(getattr(self, name), bool):
                raise SpecdecError(f"PassContext.{name} must be True or False, got {getattr(self, name)!r}")
        if self.continuous_batching and self.interface != "qeff":
            raise SpecdecError("PassContext.continuous_batching is QEfficient's: it needs interface='qeff'")
        if self.interface == "qeff" and self.target == "openvino":
            raise SpecdecError("interface 'qeff' is for target qaic or ort; openvino has the default interface only")


def need(pass_name: str, ctx, *fields: str) -> PassContext:
    """``ctx``, checked: a ``PassContext`` with every field in ``fields`` set."""
    if not isinstance(ctx, PassContext):
        raise PassArgumentError(f"pass {pass_name} is called as {pass_name}(graph, ctx) with ctx a "
                        f"specdec_compile.passes.PassContext, got {type(ctx).__name__}")
    missing = [f"ctx.{f}" for f in fields if getattr(ctx, f) is None]
    if missing:
        raise SpecdecError(f"pass {pass_name} needs {', '.join(missing)}")
    return ctx


def distinct_node_names(pass_name: str, graph: gs.Graph) -> None:
    """Refuse a graph where two nodes share a name (or several have none), for the passes that find
    the nodes the detection names by name: they would rewrite the wrong node."""
    seen: set[str] = set()
    for node in graph.nodes:
        if node.name in seen:
            what = f"two nodes are named {node.name!r}" if node.name else "several nodes have no name"
            raise SpecdecError(f"pass {pass_name}: {what}, and the passes find nodes by name: give every node "
                               f"a name of its own (graph_utils.name_unnamed_nodes names the unnamed ones)")
        seen.add(node.name)


def graph_pass(fn):
    """``fn(graph, ctx)``, a pass, refusing a ``graph`` that is not an onnx-graphsurgeon graph
    (a path, a ``ModelProto``, None) in one line, and naming itself when a node or tensor
    the detection names is not in the graph (the detection of another graph, or the graph
    already rewritten there: a pass run twice or out of the registry's order)."""
    name = fn.__name__

    @functools.wraps(fn)
    def run(graph, ctx):
        need(name, ctx)   # the context first, as each pass checks it
        if not isinstance(graph, gs.Graph):
            raise PassArgumentError(
                f"pass {name} is called as {name}(graph, ctx) with graph an onnx_graphsurgeon.Graph "
                f"(gs.import_onnx(onnx.load(path, load_external_data=False))), got {type(graph).__name__}")
        try:
            return fn(graph, ctx)
        except NotInGraph as e:
            raise SpecdecError(
                f"pass {name}: {e}, which ctx.detection names: the detection is of another graph, or this "
                f"part was already rewritten (run each pass once, in registry order: passes.select)") from None
    return run
