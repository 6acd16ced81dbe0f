"""Detection: what is this model? (kept apart from rewriting)

``detect(graph)`` finds, structurally, everything the passes need and returns
one frozen ``Detection`` made of *names* (tensors, nodes, inputs), so it stays
valid across graph copies. Anything not found raises ``DetectionError`` (not a
decoder LM / no KV cache) or ``UnsupportedPatternError`` (a decoder LM with a
pattern we cannot rewrite), in one line naming what was found and where it
looked.

One finder per thing found, each a module of this package with its own tests
(``tests/detect/test_<module>.py``):

    cache_concats   the growing KV cache: Concat(past, new, axis=2) per K and V
    logits          the logits output
    integer_inputs  input_ids, position_ids, attention_mask
    positions       where positions come from without a position_ids input (a Range
                    over the past length), and ALiBi key positions (a CumSum of
                    attention_mask)
    attention       attention layers (key/value Concats, Softmax) and mask sites
    windows         each layer's sliding window, read off what its mask computes
    model_info      ModelInfo: layers, KV heads, head_dim (keys and values), vocabulary, dtype
    hints           patches/default.json + patches/<family>.json (op lists, name tie-breakers)
    rotary          Cos/Sin computed on the device from position_ids (rotary angles)
    feature_input   a feature draft's float input (the target's hidden states), if any
    key_length_uses values computed from the cache's key length (a Shape of the cache) must mean
                    the same for the rewrite's ctx_len long cache (shapes, masks, ALiBi) or
                    the graph is refused (Qwen-1's logn[K-S:K] query scale is not)
    layers          the residual stream after each decoder layer (by dominance); a model
                    where it is not found still compiles: the reason is recorded and a
                    compile that asks for hidden states is refused with it

How they compose: ``detect`` calls the finders in dependency order, handing
each exactly the graph objects it needs from the ones before (so each finder
is testable alone), and turns the graph objects into names only at the end.
The order is also the order of the errors: a graph with no integer input is
"not a decoder LM" before it is "without a KV cache". A new finder (position
sources, sliding windows, ALiBi) is a new module here, one call in ``detect``
placed after the finders it reads, and a new ``Detection`` field with a
default, so existing code that builds or reads a ``Detection`` is unaffected.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph_utils import topo_nodes
from ..errors import SpecdecError, UnsupportedPatternError
from ._records import Detection, LayerKV, MaskSite, ModelInfo, PositionSource, RotarySite
from ._tensors import is_bfloat16
from .attention import Attention, find_attention
from .cache_concats import find_cache_concats, present_outputs
from .feature_input import find_feature_input
from .hints import load_hints
from .integer_inputs import find_integer_inputs, require_integer_input
from .key_length_uses import check_key_length_uses
from .layers import find_layer_outputs
from .logits import find_logits, vocab_dim
from .model_info import find_model_info
from .positions import PositionSources, check_key_uses, check_query_uses, find_position_sources
from .rotary import find_rotary
from .windows import find_windows

#: the name of the position input the rewrite adds when the export has none
POSITION_IDS = "position_ids"
BF16_REFUSAL = "bfloat16 exports are not supported; export in float32 or float16"
DYNAMIC_QUANT_REFUSAL = ("per-call dynamic activation quantization ({n} DynamicQuantizeLinear nodes, "
                         "first {first!r}) is not supported: its scale would span the padded positions "
                         "of each call; quantize weights only (e.g. MatMulNBits) or export in float")


def _named(graph: gs.Graph, layers: list[Attention], windows: list[int | None], dtypes: dict[str, str]
           ) -> tuple[tuple[LayerKV, ...], tuple[MaskSite, ...]]:
    kvs, sites = [], []
    for i, a in enumerate(layers):
        kvs.append(LayerKV(index=i, key_input=a.key.inputs[0].name, value_input=a.value.inputs[0].name,
                           key_concat=a.key.name, value_concat=a.value.name,
                           key_outputs=present_outputs(graph, a.key),
                           value_outputs=present_outputs(graph, a.value), softmax=a.softmax.name,
                           window=windows[i]))
        sites += [MaskSite(layer=i, node=n.name, input_index=j, kind=kind, dtype=dtypes.get(n.inputs[j].name))
                  for n, j, kind in a.sites]
    return tuple(kvs), tuple(sites)


def detect(graph: gs.Graph, family: str | None = None, exporter: str | None = None) -> Detection:
    """The ``Detection`` of ``graph`` (not modified). ``family``: the config's
    ``model_type``, selecting ``patches/<family>.json``; ``exporter``: recorded
    in ``ModelInfo``."""
    hints = load_hints(family)
    nodes = topo_nodes(graph)
    require_integer_input(graph)
    _refuse_bfloat16(graph)
    _refuse_dynamic_quantization(nodes)
    concats = find_cache_concats(graph, nodes)
    logits = find_logits(graph, concats, hints)
    feature = find_feature_input(graph, concats)
    inputs = find_integer_inputs(graph, hints, concats, vocab=vocab_dim(logits),
                                 other=(feature,) if feature is not None else ())
    sources = find_position_sources(graph, nodes, inputs, concats)
    attention = find_attention(graph, nodes, hints, concats, inputs.attention_mask,
                               mask_sources=_mask_sources(inputs, sources), key_positions=sources.key)
    check_query_uses(sources, [n.inputs[j] for a in attention for n, j, _ in a.sites])
    check_key_uses(graph, nodes, sources, attention)
    windows, dtypes = find_windows(graph, attention, inputs, concats)
    check_key_length_uses(graph, nodes, inputs, concats, sources, attention, windows)
    info = find_model_info(attention, logits, inputs.input_ids, family=family, exporter=exporter)
    layers, sites = _named(graph, attention, windows, dtypes)
    amask = inputs.attention_mask
    synth = inputs.position_ids is None
    if synth and any(t.name == POSITION_IDS for t in graph.tensors().values()):
        raise UnsupportedPatternError(f"no position_ids input, but a tensor is named {POSITION_IDS!r}")
    return Detection(info=info, input_ids=inputs.input_ids.name,
                     position_ids=POSITION_IDS if synth else inputs.position_ids.name,
                     attention_mask=amask.name if amask is not None else None, logits=logits.name,
                     layers=layers, mask_sites=sites, synthesize_position_ids=synth,
                     position_sources=tuple([PositionSource("query", t.name) for t in sources.query]
                                            + [PositionSource("key", t.name, rank=v.ndim, dtype=v.dtype.name)
                                               for t, v in zip(sources.key, sources.key_values)]),
                     rotary=tuple(find_rotary(graph, nodes, _query_positions(inputs, sources))),
                     feature_input=feature.name if feature is not None else None,
                     feature_width=int(feature.shape[-1]) if feature is not None else None,
                     **_layer_outputs(graph, nodes, [inputs.input_ids] + ([feature] if feature else []),
                                      logits, [a.key for a in attention]))


def _layer_outputs(graph, nodes, sources, logits, key_concats) -> dict:
    """The Detection fields of the layers finder: its result, or why it found none
    (recorded, not raised: only a compile that asks for hidden states needs them)."""
    try:
        found = find_layer_outputs(graph, nodes, sources, logits, key_concats)
    except SpecdecError as e:
        return {"layer_outputs_problem": str(e)}
    return {"layer_outputs": tuple(t.name for t in found.outputs), "hidden_size": found.width}


def _mask_sources(inputs, sources: PositionSources) -> list[gs.Tensor]:
    """What an attention mask depends on: attention_mask, else the positions."""
    if inputs.attention_mask is not None:
        return [inputs.attention_mask]
    if inputs.position_ids is not None:
        return [inputs.position_ids]
    return [r.outputs[0] for r in sources.ranges]


def _query_positions(inputs, sources: PositionSources) -> list[gs.Tensor]:
    """What the new tokens' positions are read from: position_ids, else the
    tensors the export derived them into (synth_positions feeds those later)."""
    return [inputs.position_ids] if inputs.position_ids is not None else list(sources.query)


def _refuse_bfloat16(graph: gs.Graph) -> None:
    if any(is_bfloat16(t) for t in list(graph.inputs) + list(graph.outputs)):
        raise UnsupportedPatternError(BF16_REFUSAL)


def _refuse_dynamic_quantization(nodes) -> None:
    dq = [n for n in nodes if n.op == "DynamicQuantizeLinear"]
    if dq:
        raise UnsupportedPatternError(DYNAMIC_QUANT_REFUSAL.format(n=len(dq), first=dq[0].name))


__all__ = ["detect", "Detection", "ModelInfo", "LayerKV", "MaskSite", "PositionSource", "RotarySite",
           "load_hints", "POSITION_IDS", "BF16_REFUSAL",
           "DYNAMIC_QUANT_REFUSAL"]
