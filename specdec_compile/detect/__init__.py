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
    attention       attention layers (key/value Concats, Softmax) and mask sites
    model_info      ModelInfo: layers, KV heads, head_dim, vocabulary, dtype
    hints           patches/default.json + patches/<family>.json (op lists, name tie-breakers)
    rotary          Cos/Sin computed on the device from position_ids (rotary angles)

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
from ._records import Detection, LayerKV, MaskSite, ModelInfo, RotarySite
from .attention import Attention, find_attention
from .cache_concats import find_cache_concats, present_outputs
from .hints import load_hints
from .integer_inputs import find_integer_inputs, require_integer_input
from .logits import find_logits, vocab_dim
from .model_info import find_model_info
from .rotary import find_rotary


def _named(graph: gs.Graph, layers: list[Attention]) -> tuple[tuple[LayerKV, ...], tuple[MaskSite, ...]]:
    kvs, sites = [], []
    for i, a in enumerate(layers):
        kvs.append(LayerKV(index=i, key_input=a.key.inputs[0].name, value_input=a.value.inputs[0].name,
                           key_concat=a.key.name, value_concat=a.value.name,
                           key_outputs=present_outputs(graph, a.key),
                           value_outputs=present_outputs(graph, a.value), softmax=a.softmax.name))
        sites += [MaskSite(layer=i, node=n.name, input_index=j, kind=kind) for n, j, kind in a.sites]
    return tuple(kvs), tuple(sites)


def detect(graph: gs.Graph, family: str | None = None, exporter: str | None = None) -> Detection:
    """The ``Detection`` of ``graph`` (not modified). ``family``: the config's
    ``model_type``, selecting ``patches/<family>.json``; ``exporter``: recorded
    in ``ModelInfo``."""
    hints = load_hints(family)
    nodes = topo_nodes(graph)
    require_integer_input(graph)
    concats = find_cache_concats(graph, nodes)
    logits = find_logits(graph, concats, hints)
    inputs = find_integer_inputs(graph, hints, concats, vocab=vocab_dim(logits))
    attention = find_attention(graph, nodes, hints, concats, inputs.attention_mask)
    info = find_model_info(attention, logits, inputs.input_ids, family=family, exporter=exporter)
    layers, sites = _named(graph, attention)
    amask = inputs.attention_mask
    rotary = tuple(find_rotary(graph, nodes, inputs.position_ids))
    return Detection(info=info, input_ids=inputs.input_ids.name, position_ids=inputs.position_ids.name,
                     attention_mask=amask.name if amask is not None else None, logits=logits.name,
                     layers=layers, mask_sites=sites, rotary=rotary)


__all__ = ["detect", "Detection", "ModelInfo", "LayerKV", "MaskSite", "RotarySite", "load_hints"]
