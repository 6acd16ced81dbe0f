"""The compile pipeline: detection, then the passes, in order.

The passes and their order come from ``specdec_compile.passes.REGISTRY``
(``passes.select(role, target)``); ``PASS_ORDER`` is every registered name, in
order, derived from it.

Public API (stable; the CLI, artifact writer, diff --explain and runtime use it):

    rewrite(model_or_path, *, role, target="qaic", k=None, record=False, ctx_len=256, source=None,
            hidden_states=None, feature_layers=None) -> CompileResult
    compile_model(model_or_path, *, role, target="qaic", k=None, ctx_len=256) -> onnx.ModelProto

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
    hidden_layers   TLM --hidden-states: the layers as given (negative from the end); None: none
    feature_layers  feature draft --feature-layers: the target layers it reads; None: not one
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from . import __version__
from . import features as _features
from . import passes as _passes
from .contract import CTX_LEN_KEY, INTERFACE_KEY, INTERFACES, TARGET_OPSET
from .detect import Detection, ModelInfo, detect
from .errors import SpecdecError, UnsupportedPatternError
from .graph_utils import name_unnamed_nodes
from .io import load_model
from .validate import check_model, interface_problems

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
    hidden_layers: tuple[int, ...] | None = None
    feature_layers: tuple[int, ...] | None = None
    interface: str = "default"


def _family(source_dir: Path | None, model: onnx.ModelProto) -> str | None:
    """model_type from the exporter's config.json next to the model, if any."""
    if source_dir is not None and (source_dir / "config.json").is_file():
        try:
            return json.loads((source_dir / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            return None
    return None


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


def validate_options(role: str, target: str, k: int | None) -> None:
    _passes.check_options(role, target, k)


#: the context length a rewrite is for when none is given (the CLI's --ctx-len default)
DEFAULT_CTX_LEN = 256


def rewrite(model_or_path, *, role: str, target: str = "qaic", k: int | None = None,
            record: bool = False, ctx_len: int = DEFAULT_CTX_LEN, source=None,
            hidden_states: tuple[int, ...] | None = None,
            feature_layers: tuple[int, ...] | None = None, interface: str = "default") -> CompileResult:
    """Rewrite a stock decoder-LM export into the contract's retained-state graph.

    ``ctx_len``: the context length the graph is compiled for (the qaic rotary
    tables hold exactly this many rows). ``source``: the file a ModelProto given
    as ``model_or_path`` was read from (its directory holds the external data and
    config.json), so a caller that already loaded the model does not parse it again.
    ``hidden_states`` (TLM): layers whose outputs become the ``hidden_states``
    output. ``feature_layers`` (DLM): the model is a feature draft reading these
    layers of its target. ``interface``: "default", or "qeff" for QEfficient's (contract
    section 7: ``batch_index``, a TLM's ``num_logits_to_keep``)."""
    validate_options(role, target, k)
    if interface not in INTERFACES:
        raise SpecdecError(f"--interface {interface!r} is not one of {', '.join(INTERFACES)}")
    if isinstance(model_or_path, onnx.ModelProto):
        original = model_or_path
        source = Path(source) if source is not None else None
        source_dir = source.resolve().parent if source is not None else None
    else:
        source = Path(model_or_path)
        original = load_model(source)
        source_dir = source.resolve().parent
    try:
        graph = gs.import_onnx(original)
    except Exception as e:
        raise SpecdecError(f"cannot import the graph: {' '.join(str(e).split())[:300]}") from None
    source_opset = graph.opset
    name_unnamed_nodes(graph)
    exporter = " ".join(x for x in (original.producer_name, original.producer_version) if x) or None
    det = detect(graph, family=_family(source_dir, original), exporter=exporter)

    hidden_layers = _features.check(det, role, hidden_states, feature_layers)
    ctx = _passes.PassContext(detection=det, role=role, target=target, k=k, source_opset=source_opset,
                              ctx_len=ctx_len, hidden_layers=hidden_layers, interface=interface)
    selected = _passes.select(role, target, interface)
    applied = [p.name for p in selected]
    snapshots = [("original", original)] if record else None
    for p in selected:
        graph = p.run(graph, ctx)
        if record:
            snapshots.append((p.name, _export(graph, original)))
    model = _export(graph, original)
    model.metadata_props.add(key="specdec.role", value=role)
    model.metadata_props.add(key="specdec.target", value=target)
    model.metadata_props.add(key="specdec.passes", value=",".join(applied))
    if interface != "default":
        model.metadata_props.add(key=INTERFACE_KEY, value=interface)
    _features.record(model, hidden_states, feature_layers)
    if target == "qaic":  # fixed on the device, and the rotary tables hold exactly this many rows
        model.metadata_props.add(key=CTX_LEN_KEY, value=str(ctx_len))
    info = det.info
    inferred = check_model(model)
    info = dataclasses.replace(info, num_heads=_num_heads(inferred, det))
    problems = interface_problems(model, role, info.num_layers, info.num_kv_heads, info.head_dim,
                                  info.vocab_size, value_head_dim=info.value_head_dim,
                                  **_features.widths(det, hidden_states, feature_layers), qeff=interface == "qeff")
    if problems:
        raise UnsupportedPatternError("rewritten interface does not match the contract: " + "; ".join(problems))
    assert model.opset_import[0].version == TARGET_OPSET[target]
    return CompileResult(model=model, info=info, detection=det, role=role, target=target,
                         passes=applied, ctx_len=ctx_len, source=source, source_dir=source_dir,
                         snapshots=snapshots, hidden_layers=hidden_states, feature_layers=feature_layers,
                         interface=interface)


def _num_heads(inferred: onnx.ModelProto, det: Detection) -> int | None:
    """Query heads: dim 1 of the first Softmax's input, when inference knows it."""
    shapes = {vi.name: vi for vi in inferred.graph.value_info}
    for node in inferred.graph.node:
        if node.name == det.layers[0].softmax and node.input[0] in shapes:
            dims = shapes[node.input[0]].type.tensor_type.shape.dim
            if len(dims) == 4 and dims[1].HasField("dim_value"):
                return int(dims[1].dim_value)
    return None


def compile_model(model_or_path, *, role: str, target: str = "qaic", k: int | None = None,
                  ctx_len: int = DEFAULT_CTX_LEN, **features) -> onnx.ModelProto:
    """The rewritten ``onnx.ModelProto`` (weights untouched, still external refs)."""
    return rewrite(model_or_path, role=role, target=target, k=k, ctx_len=ctx_len, **features).model


__all__ = ["rewrite", "compile_model", "CompileResult", "PASS_ORDER", "DEFAULT_CTX_LEN", "validate_options"]
