"""The compile pipeline: detection, then the passes, in order.

The passes and their order come from ``specdec_compile.passes.REGISTRY``
(``passes.select(role, target)``); ``PASS_ORDER`` is every registered name, in
order, derived from it.

Public API (stable; the CLI, artifact writer, diff --explain and runtime use it):

    rewrite(model_or_path, options, *, record=False, source=None, fuse_rotary=False) -> CompileResult
    compile_model(model_or_path, options, *, source=None, fuse_rotary=False) -> the model, as given
    prepare(model_or_path, options, *, source=None, fuse_rotary=False) -> Prepared   (pass by pass:
            .graph, .ctx, .passes, .run(graph), .finish(graph) -> CompileResult)
    import_and_detect(original, source=None, source_dir=None) -> (graph, Detection)

``options``: an ``Options`` (``specdec_compile.options``), checked once where it is built.

``model_or_path``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``;
``CompileResult.as_given()`` and ``compile_model`` return the rewrite in the kind given
(an ir model for an ir model, else a proto). Progress is logged (``logging``, INFO,
logger ``specdec_compile.pipeline``): detection, each pass, the checks.

CompileResult fields:
    model        onnx.ModelProto, the rewritten graph; external weights are still
                 references relative to ``source_dir`` (never loaded)
    info         ModelInfo (num_layers, num_heads, num_kv_heads, head_dim,
                 vocab_size, dtype, family, exporter)
    detection    the Detection of the original graph
    role         "tlm" | "dlm";  target "qaic" | "ort"
    passes       names of the passes applied, in order (``passes.select(role, target)``)
    ctx_len      the context length the graph is for (qaic rotary tables hold this many
                 rows; an artifact must not be written for a longer context)
    source       Path of the source .onnx (None when given a ModelProto without ``source``)
    source_dir   directory external data locations are relative to (or None)
    snapshots    with record=True: [("original", proto), (pass_name, proto), ...]
    input_kind   what was given: "path" | "proto" | "ir" (``as_given()`` converts back)
    hidden_states   TLM --hidden-states: the layers as given (negative from the end); None: none
    feature_layers  feature draft --feature-layers: the target layers it reads; None: not one
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from . import __version__
from . import hidden_features as _features
from . import passes as _passes
from .contract import CTX_LEN_KEY, INTERFACE_KEY, PASSES_KEY, ROLE_KEY, SPECDEC_DOMAIN, TARGET_KEY, TARGET_OPSET
from .detect import Detection, ModelInfo, detect
from .errors import SpecdecError, UnsupportedPatternError
from .graph_utils import UnnamedAttributesKept, name_unnamed_nodes
from .model_io import as_kind, read_any, read_json
from .options import Options
from .graph_checks import check_model, input_blamed, input_problem, interface_problems
from .model_checks import check_position_table, refuse_compiled

_log = logging.getLogger(__name__)

#: every registered pass, in order (the registry is the one place the order is written)
PASS_ORDER: tuple[str, ...] = _passes.names()


@dataclass
class CompileResult:
    model: onnx.ModelProto
    info: ModelInfo
    detection: Detection
    role: str
    target: str
    passes: list[str]
    ctx_len: int | None = None
    source: Path | None = None
    source_dir: Path | None = None
    snapshots: list[tuple[str, onnx.ModelProto]] | None = field(default=None, repr=False)
    hidden_states: tuple[int, ...] | None = None   # as given (Options.hidden_states); None: none
    feature_layers: tuple[int, ...] | None = None
    interface: str = "default"
    input_kind: str = "proto"        # what rewrite was given: "path" | "proto" | "ir"

    def as_given(self):
        """The rewritten model in the kind rewrite was given: an ``onnx_ir.Model`` (its
        external tensors read from ``source_dir``) for one, else the ``onnx.ModelProto``."""
        return as_kind(self.model, self.input_kind, self.source_dir)


def config_family(source_dir: Path | None, model: onnx.ModelProto) -> str | None:
    """model_type from the exporter's config.json next to the model, if any (it selects the
    detection hints: a config.json that is there but unreadable is refused, not ignored)."""
    if source_dir is None or not (source_dir / "config.json").exists():
        return None
    path = source_dir / "config.json"
    cfg = read_json(path, "the export's config.json")
    if not isinstance(cfg, dict):
        raise SpecdecError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    family = cfg.get("model_type")
    if family is not None and not isinstance(family, str):
        raise SpecdecError(f"{path}: model_type is {str(family)[:80]!r}, expected a string")
    return family


def _export(graph: gs.Graph, like: onnx.ModelProto) -> onnx.ModelProto:
    model = gs.export_onnx(graph, do_type_check=False)
    default = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    model.ir_version = max(onnx.helper.find_min_ir_version_for(default, ignore_unknown=True), 8)
    model.producer_name = "specdec-compile"
    model.producer_version = __version__
    del model.metadata_props[:]
    for p in like.metadata_props:
        model.metadata_props.add(key=p.key, value=p.value)
    return model


#: the context length a rewrite is for when none is given (the CLI's --ctx-len default)
DEFAULT_CTX_LEN = 256


@dataclass
class Prepared:
    """A model loaded, imported and detected, with the one ``PassContext`` every pass
    takes: the pass-by-pass API. ``graph`` (onnx-graphsurgeon, unnamed nodes named) is
    the original; ``passes`` are the registry's for the role and target, in order;
    ``finish(graph)`` exports a graph the passes made and checks it, as ``rewrite`` does."""
    graph: gs.Graph
    ctx: _passes.PassContext
    passes: list
    original: onnx.ModelProto
    source: Path | None
    source_dir: Path | None
    kind: str                                   # what was given: "path" | "proto" | "ir"
    options: Options

    @property
    def detection(self) -> Detection:
        return self.ctx.detection

    def run(self, graph: gs.Graph | None = None, record: bool = False):
        """Every pass in order from ``graph`` (default the original); (graph, snapshots)."""
        graph = self.graph if graph is None else graph
        snapshots = [("original", self.original)] if record else None
        with UnnamedAttributesKept(self.original):
            for i, p in enumerate(self.passes, 1):
                t = time.perf_counter()
                with input_blamed(self.original, self.source):
                    graph = p.run(graph, self.ctx)
                _log.info("pass %d/%d %s: %d nodes (%.2f s)", i, len(self.passes), p.name, len(graph.nodes),
                          time.perf_counter() - t)
                if record:
                    snapshots.append((p.name, _export(graph, self.original)))
        return graph, snapshots

    def finish(self, graph: gs.Graph, snapshots=None) -> CompileResult:
        """The CompileResult of ``graph`` (the passes' output): exported, recorded, checked."""
        with UnnamedAttributesKept(self.original):
            return _finish(self, graph, snapshots)


def _options(options) -> Options:
    """``options``, an ``Options`` (checked when it was built, so trusted here)."""
    if not isinstance(options, Options):
        raise SpecdecError(f"options= must be a specdec_compile.options.Options (e.g. Options(role=\"tlm\", k=3)), "
                           f"got {type(options).__name__}")
    return options


def prepare(model_or_path, options: Options, *, source=None, fuse_rotary: bool = False) -> Prepared:
    """Load (a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``), import and detect, and
    build the pass context once from ``options`` (the same ``Options`` the CLI builds: role,
    target, k, ctx_len, hidden_states, feature_layers, interface). See ``Prepared``."""
    options = _options(options)
    if not isinstance(fuse_rotary, bool):
        raise SpecdecError(f"fuse_rotary= must be True or False, got {fuse_rotary!r}")
    if fuse_rotary and options.target != "ort":
        raise SpecdecError(f"fuse_rotary=True is for target 'ort' (ONNX Runtime's RotaryEmbedding kernel), "
                           f"not {options.target!r}")
    original, source, source_dir, kind = read_any(model_or_path, source)
    refuse_compiled(original, str(source) if source is not None else "the model")
    graph, det = import_and_detect(original, source, source_dir)
    check_position_table(graph, options.ctx_len)
    exposed = _features.check(det, options.role, options.hidden_states or None, options.feature_layers or None)
    ctx = _passes.PassContext.from_options(options, detection=det, source_opset=graph.opset,
                                           exposed_layers=exposed, fuse_rotary=fuse_rotary)
    return Prepared(graph, ctx, list(_passes.applicable(options.role, options.target, options.interface)), original,
                    source, source_dir, kind, options)


def import_and_detect(original: onnx.ModelProto, source=None, source_dir: Path | None = None):
    """(graph, detection) of ``original``: imported (onnx-graphsurgeon), unnamed nodes named,
    the decoder's patterns detected (a bad input blamed on ``source``); the one place the
    pipeline and ``verify`` read a model's structure from."""
    if not isinstance(original, onnx.ModelProto):
        raise SpecdecError(f"import_and_detect takes an onnx.ModelProto (prepare and rewrite also read paths "
                           f"and onnx_ir models), got {type(original).__name__}")
    with UnnamedAttributesKept(original):
        return _import_and_detect(original, source, source_dir)


def _import_and_detect(original: onnx.ModelProto, source, source_dir: Path | None):
    try:
        graph = gs.import_onnx(original)
    except Exception as e:
        raise SpecdecError(f"cannot import the graph: {' '.join(str(e).split())[:300]}") from None
    # onnx-graphsurgeon keeps the model's own opset list, and an export adds the domains the passes
    # use (ai.specdec) to it: the caller's model changed under it. The graph gets a copy.
    graph.import_domains = [onnx.helper.make_opsetid(o.domain, o.version) for o in original.opset_import]
    name_unnamed_nodes(graph)
    exporter = " ".join(x for x in (original.producer_name, original.producer_version) if x) or None
    _log.info("detecting the decoder's patterns (%d nodes)", len(graph.nodes))
    family = config_family(source_dir, original)
    with input_blamed(original, source):
        det = detect(graph, family=family, exporter=exporter)
    i = det.info
    _log.info("detected %s: %d layers, %d KV heads, head_dim %s, vocab %s", i.family or "a decoder", i.num_layers,
              i.num_kv_heads, i.head_dim, i.vocab_size)
    return graph, det


def rewrite(model_or_path, options: Options, *, record: bool = False, source=None,
            fuse_rotary: bool = False) -> CompileResult:
    """Rewrite a stock decoder-LM export into the contract's retained-state graph.

    ``model_or_path``: a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``
    (``result.as_given()`` is the rewrite in the same kind). ``options``: an ``Options``
    (the one the CLI builds; checked when built): role, target, k, ``ctx_len`` (the context
    the graph is compiled for: the qaic rotary tables hold exactly this many rows),
    ``hidden_states`` (TLM: layers whose outputs become the ``hidden_states`` output),
    ``feature_layers`` (DLM: the model is a feature draft reading these layers of its
    target), ``interface`` ("default", or "qeff" for QEfficient's, contract section 7).
    ``source``: the file a model in memory was read from (its directory holds the external
    data and config.json), so a caller that already loaded the model does not parse it
    again. ``fuse_rotary`` (ort): q/k rotations as ONNX Runtime's ``RotaryEmbedding`` kernel
    (fewer kernels per step; its rounding differs from the export's, see ``passes.fuse_rotary``)."""
    prep = prepare(model_or_path, options, source=source, fuse_rotary=fuse_rotary)
    graph, snapshots = prep.run(record=record)
    return prep.finish(graph, snapshots)


def _finished_graph(graph) -> None:
    """Refuse what ``finish`` cannot export: not a graph, or one with the internal cache writes
    left (``lower`` not run after ``retained_kv``)."""
    if not isinstance(graph, gs.Graph):
        raise SpecdecError(f"finish(graph) takes the onnx-graphsurgeon graph the passes returned, "
                           f"got {type(graph).__name__}")
    internal = [n.name for n in graph.nodes if n.domain == SPECDEC_DOMAIN]
    if internal:
        raise SpecdecError(f"the graph still has the compiler's internal ops ({internal[0]}: {SPECDEC_DOMAIN}); "
                           f"pass lower must run after retained_kv (run prep.passes in order)")


def _finish(prep: Prepared, graph: gs.Graph, snapshots) -> CompileResult:
    ctx, original, det = prep.ctx, prep.original, prep.ctx.detection
    _finished_graph(graph)
    role, target, interface = ctx.role, ctx.target, ctx.interface
    hidden_states, feature_layers = prep.options.hidden_states or None, prep.options.feature_layers or None
    applied = [p.name for p in prep.passes]
    model = _export(graph, original)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset != TARGET_OPSET[target]:
        raise SpecdecError(f"the graph is at opset {opset}, not the {target} target's {TARGET_OPSET[target]}: "
                           f"pass lower has not run on it (run prep.passes in order)")
    model.metadata_props.add(key=ROLE_KEY, value=role)
    model.metadata_props.add(key=TARGET_KEY, value=target)
    model.metadata_props.add(key=PASSES_KEY, value=",".join(applied))
    if interface != "default":
        model.metadata_props.add(key=INTERFACE_KEY, value=interface)
    _features.record(model, hidden_states, feature_layers)
    if target == "qaic" or ctx.fuse_rotary:  # fixed on the device / the rotary tables hold this many rows
        model.metadata_props.add(key=CTX_LEN_KEY, value=str(ctx.ctx_len))
    _log.info("checking the rewritten graph (onnx.checker, shape inference, the contract's interface)")
    inferred = _checked(model, original, prep.source)
    info = dataclasses.replace(det.info, num_heads=_num_heads(inferred, det))
    problems = interface_problems(model, role, info.num_layers, info.num_kv_heads, info.head_dim,
                                  info.vocab_size, value_head_dim=info.value_head_dim,
                                  **_features.widths(det, hidden_states, feature_layers), qeff=interface == "qeff",
                                  batch_index=prep.options.continuous_batching)
    if problems:
        raise UnsupportedPatternError("rewritten interface does not match the contract: " + "; ".join(problems))
    return CompileResult(model=model, info=info, detection=det, role=role, target=target,
                         passes=applied, ctx_len=ctx.ctx_len, source=prep.source, source_dir=prep.source_dir,
                         snapshots=snapshots, hidden_states=hidden_states, feature_layers=feature_layers,
                         interface=interface, input_kind=prep.kind)


def _checked(model: onnx.ModelProto, original: onnx.ModelProto, source) -> onnx.ModelProto:
    """``check_model`` of the rewrite; when it fails, and the input fails the same checks, the
    input is named as the invalid model (not the rewrite)."""
    try:
        return check_model(model)
    except SpecdecError as e:
        problem = input_problem(original, source)
        raise (problem or e) from None


def _num_heads(inferred: onnx.ModelProto, det: Detection) -> int | None:
    """Query heads: dim 1 of the first Softmax's input, when inference knows it."""
    shapes = {vi.name: vi for vi in inferred.graph.value_info}
    for node in inferred.graph.node:
        if node.name == det.layers[0].softmax and node.input[0] in shapes:
            dims = shapes[node.input[0]].type.tensor_type.shape.dim
            if len(dims) == 4 and dims[1].HasField("dim_value"):
                return int(dims[1].dim_value)
    return None


def compile_model(model_or_path, options: Options, *, source=None, fuse_rotary: bool = False):
    """The rewritten model (weights untouched, still external refs), in the kind given: an
    ``onnx_ir.Model`` for one, else an ``onnx.ModelProto``."""
    return rewrite(model_or_path, options, source=source, fuse_rotary=fuse_rotary).as_given()


__all__ = ["rewrite", "compile_model", "prepare", "import_and_detect", "Prepared", "CompileResult", "PASS_ORDER",
           "DEFAULT_CTX_LEN"]
