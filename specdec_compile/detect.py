"""Detection: what is this model? (kept apart from rewriting)

``detect(graph)`` finds, structurally, everything the passes need and returns
one frozen ``Detection`` made of *names* (tensors, nodes, inputs), so it stays
valid across graph copies. Anything not found raises ``DetectionError`` (not a
decoder LM / no KV cache) or ``UnsupportedPatternError`` (a decoder LM with a
pattern we cannot rewrite), naming what is missing and where we looked.

How each piece is found:

* past K/V: rank-4 float graph inputs that are the first operand of a Concat
  along axis 2 (the growing cache). The Concat output is the layer's K or V.
* attention: every Softmax whose input chain (through ``score_ops``) reaches a
  MatMul whose second operand comes (through ``layout_ops``) from a cache
  Concat: that Concat holds the keys. The MatMul that consumes the Softmax
  output (through ``probs_ops``) reads the values.
* mask: on the chain MatMul -> Softmax, the side operand whose values depend
  on ``attention_mask`` (found by dependence, not position: CodeGen adds it
  before a Div, Llama right before Softmax).
* input_ids: the integer input feeding an embedding Gather whose table has as
  many rows as the logits have columns; position_ids: the integer input with
  input_ids' shape; attention_mask: the one that feeds the mask.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import onnx_graphsurgeon as gs

from .errors import DetectionError, UnsupportedPatternError
from .graph_utils import is_const, producer, topo_nodes, value_dependence
from .resources import patches_dir


@dataclass(frozen=True)
class ModelInfo:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: str
    num_heads: int | None = None
    family: str | None = None
    exporter: str | None = None


@dataclass(frozen=True)
class LayerKV:
    index: int
    key_input: str
    value_input: str
    key_concat: str
    value_concat: str
    key_outputs: tuple[str, ...] = ()
    value_outputs: tuple[str, ...] = ()
    softmax: str = ""


@dataclass(frozen=True)
class MaskSite:
    """Input ``input_index`` of node ``node`` is the attention mask of ``layer``.

    kind: "additive" (added to the scores), "visible" (Where condition, true
    keeps the score) or "masked" (Where condition, true drops the score).
    """
    layer: int
    node: str
    input_index: int
    kind: str


@dataclass(frozen=True)
class Detection:
    info: ModelInfo
    input_ids: str
    position_ids: str
    attention_mask: str | None
    logits: str
    layers: tuple[LayerKV, ...]
    mask_sites: tuple[MaskSite, ...] = field(default=())


@lru_cache(maxsize=None)
def _load_hints(family: str | None) -> dict:
    hints = json.loads((patches_dir() / "default.json").read_text())
    if family:
        fam = patches_dir() / f"{family}.json"
        if fam.exists():
            extra = json.loads(fam.read_text())
            for key, value in extra.items():
                if isinstance(value, list) and isinstance(hints.get(key), list):
                    hints[key] = hints[key] + [v for v in value if v not in hints[key]]
                elif isinstance(value, dict) and isinstance(hints.get(key), dict):
                    hints[key] = {**hints[key], **value}
                else:
                    hints[key] = value
    return hints


_INT_DTYPES = (np.int64, np.int32)
_FLOAT_DTYPES = (np.float32, np.float16, np.float64)


def _dtype(t: gs.Tensor):
    try:
        return np.dtype(t.dtype) if t.dtype is not None else None
    except TypeError:  # bfloat16 and other onnx-only types
        return None


def _is_int(t) -> bool:
    return _dtype(t) in [np.dtype(d) for d in _INT_DTYPES]


def _is_float(t) -> bool:
    d = _dtype(t)
    return d is not None and d.kind == "f"


def _rank(t) -> int | None:
    return len(t.shape) if t.shape is not None else None


def _names(ts) -> str:
    return ", ".join(t.name for t in ts) or "none"


def _axis(node: gs.Node, rank: int = 4) -> int:
    a = int(node.attrs.get("axis", 0))
    return a + rank if a < 0 else a


def _walk_back(t: gs.Tensor, ops: set[str], dep: set[int], stop, max_steps: int = 16):
    """Follow ``t`` backwards through ``ops``, at each node taking the one input
    in ``dep``, until ``stop(node)`` is true. Returns that node or None."""
    for _ in range(max_steps):
        n = producer(t)
        if n is None:
            return None
        if stop(n):
            return n
        if n.op not in ops:
            return None
        cands = [x for x in n.inputs if id(x) in dep]
        if len(cands) != 1:
            return None
        t = cands[0]
    return None


def detect(graph: gs.Graph, family: str | None = None, exporter: str | None = None) -> Detection:
    hints = _load_hints(family)
    nodes = topo_nodes(graph)
    order = {id(n): i for i, n in enumerate(nodes)}

    # ---- the growing KV cache -------------------------------------------
    graph_inputs = {id(t): t for t in graph.inputs}
    past_like = [t for t in graph.inputs if _is_float(t) and _rank(t) == 4]
    cache_concats = []
    for n in nodes:
        if (n.op == "Concat" and len(n.inputs) == 2 and id(n.inputs[0]) in graph_inputs
                and _rank(n.inputs[0]) == 4 and _axis(n) == 2):
            cache_concats.append(n)
    if not [t for t in graph.inputs if _is_int(t)]:
        raise DetectionError(
            f"not a decoder LM: no integer token-id input (inputs: {_names(graph.inputs)})")
    if not cache_concats:
        if past_like:
            raise UnsupportedPatternError(
                f"KV cache inputs ({_names(past_like)}) are not grown by a Concat along the sequence axis; "
                f"only concatenating caches are supported")
        raise DetectionError(
            f"decoder exported without a KV cache: no past key/value inputs (inputs: {_names(graph.inputs)}); "
            f"export with --task text-generation-with-past")
    concat_ids = {id(n): n for n in cache_concats}
    cache_dep = value_dependence(graph, [n.outputs[0] for n in cache_concats], nodes)

    # ---- logits -----------------------------------------------------------
    present_like = set()
    for n in cache_concats:
        frontier = [n.outputs[0]]
        while frontier:
            t = frontier.pop()
            present_like.add(id(t))
            frontier += [o for c in t.outputs if c.op in ("Identity", "Cast") for o in c.outputs]
    cand_logits = [t for t in graph.outputs if id(t) not in present_like and _is_float(t) and _rank(t) == 3]
    if len(cand_logits) > 1:
        named = [t for t in cand_logits if t.name in hints["logits_names"]]
        cand_logits = named or cand_logits
    if len(cand_logits) != 1:
        raise DetectionError(
            f"not a decoder LM: expected one rank-3 float logits output, found "
            f"{len(cand_logits)} (outputs: {_names(graph.outputs)})")
    logits = cand_logits[0]
    vocab = logits.shape[-1] if logits.shape is not None else None

    # ---- integer inputs: input_ids, position_ids, attention_mask ----------
    int_inputs = [t for t in graph.inputs if _is_int(t) and _rank(t) == 2]
    roles: dict[str, gs.Tensor] = {}
    for role in ("input_ids", "position_ids", "attention_mask"):
        for t in int_inputs:
            if t.name in hints["input_names"][role] and t not in roles.values():
                roles[role] = t
                break

    def feeds_embedding(t: gs.Tensor) -> int | None:
        """Rows of the embedding table ``t`` indexes (through Cast), or None."""
        frontier = list(t.outputs)
        for _ in range(3):
            nxt = []
            for c in frontier:
                if c.op == "Gather" and len(c.inputs) == 2 and c.inputs[1] is not None:
                    table = c.inputs[0]
                    if (c.inputs[1] is t or producer(c.inputs[1]) is not None) and is_const(table) \
                            and table.shape is not None and len(table.shape) == 2:
                        return int(table.shape[0])
                if c.op in ("Cast", "Identity", "Unsqueeze", "Reshape"):
                    nxt += [x for o in c.outputs for x in o.outputs]
            frontier = nxt
        return None

    if "input_ids" not in roles:
        emb = [(t, feeds_embedding(t)) for t in int_inputs]
        emb = [(t, rows) for t, rows in emb if rows is not None]
        if vocab is not None and len(emb) > 1:
            emb = [(t, rows) for t, rows in emb if rows == vocab] or emb
        if len(emb) != 1:
            raise DetectionError(
                f"not a decoder LM: cannot find the token-id input feeding the embedding "
                f"(integer inputs: {_names(int_inputs)})")
        roles["input_ids"] = emb[0][0]
    ids = roles["input_ids"]
    rest = [t for t in int_inputs if t not in roles.values()]
    if "position_ids" not in roles:
        same = [t for t in rest if t.shape is not None and list(t.shape) == list(ids.shape)]
        if len(same) == 1:
            roles["position_ids"] = same[0]
            rest.remove(same[0])
    if "position_ids" not in roles:
        raise UnsupportedPatternError(
            f"no position_ids input (integer inputs: {_names(int_inputs)}); export the model "
            f"with explicit position_ids")
    if "attention_mask" not in roles and len(rest) == 1:
        roles["attention_mask"] = rest.pop()
    amask = roles.get("attention_mask")
    known = {id(t) for t in roles.values()} | {id(n.inputs[0]) for n in cache_concats}
    extra = [t for t in graph.inputs if id(t) not in known]
    if extra:
        raise UnsupportedPatternError(f"unexpected graph inputs: {_names(extra)}")

    am_dep = value_dependence(graph, [amask], nodes) if amask is not None else set()

    # ---- attention layers ---------------------------------------------------
    score_ops = set(hints["score_ops"])
    layout_ops = set(hints["layout_ops"])
    probs_ops = set(hints["probs_ops"])
    found = []  # (key concat, value concat, softmax, sites)
    for sm in (n for n in nodes if n.op == "Softmax"):
        t = sm.inputs[0]
        sites = []
        qk = None
        for _ in range(16):
            n = producer(t)
            if n is None:
                break
            if n.op == "MatMul":
                qk = n
                break
            if n.op not in score_ops:
                break
            chain = [j for j, x in enumerate(n.inputs) if id(x) in cache_dep]
            if len(chain) != 1:
                break
            for j, x in enumerate(n.inputs):
                if j != chain[0] and id(x) in am_dep:
                    if n.op == "Add":
                        kind = "additive"
                    elif n.op == "Where" and j == 0:
                        kind = "visible" if chain[0] == 1 else "masked"
                    else:
                        raise UnsupportedPatternError(
                            f"attention mask enters the scores through {n.op} node {n.name!r} "
                            f"(input {j}); only additive masks and Where conditions are supported")
                    sites.append((n, j, kind))
            t = n.inputs[chain[0]]
        if qk is None:
            continue
        key = _walk_back(qk.inputs[1], layout_ops, cache_dep, lambda n: id(n) in concat_ids)
        if key is None:
            continue
        # values: Softmax -> (Cast/Dropout) -> MatMul(probs, V)
        pv = None
        frontier = [sm.outputs[0]]
        for _ in range(4):
            nxt = []
            for x in frontier:
                for c in x.outputs:
                    if c.op == "MatMul" and c.inputs[0] is x:
                        pv = c
                    elif c.op in probs_ops:
                        nxt += list(c.outputs)
            if pv is not None or not nxt:
                break
            frontier = nxt
        value = None
        if pv is not None:
            value = _walk_back(pv.inputs[1], layout_ops, cache_dep, lambda n: id(n) in concat_ids)
        if value is None:
            raise UnsupportedPatternError(
                f"attention at Softmax {sm.name!r}: keys come from cache Concat {key.name!r} but the "
                f"values' cache Concat was not found behind the MatMul that reads the probabilities")
        if amask is not None and not sites:
            raise UnsupportedPatternError(
                f"attention at Softmax {sm.name!r}: no operand depending on {amask.name!r} on the "
                f"scores path from MatMul {qk.name!r}; cannot find the attention mask")
        found.append((key, value, sm, sites))

    if not found:
        raise UnsupportedPatternError(
            f"found {len(cache_concats)} cache Concat nodes but no attention (Softmax over "
            f"MatMul(Q, K) with K from a cache) uses them; fused attention ops are not supported")
    used = [id(k) for k, _, _, _ in found] + [id(v) for _, v, _, _ in found]
    if len(set(used)) != len(used):
        raise UnsupportedPatternError("two attention layers share one cache Concat")
    unused = [n for n in cache_concats if id(n) not in set(used)]
    if unused:
        raise UnsupportedPatternError(
            f"cache Concat nodes not read by any attention: {', '.join(n.name for n in unused)}")

    found.sort(key=lambda f: order[id(f[0])])
    layers, sites = [], []
    out_ids = {id(t) for t in graph.outputs}

    def present_outputs(concat: gs.Node) -> tuple[str, ...]:
        res, frontier = [], [concat.outputs[0]]
        while frontier:
            x = frontier.pop()
            if id(x) in out_ids:
                res.append(x.name)
            frontier += [o for c in x.outputs if c.op in ("Identity", "Cast") for o in c.outputs]
        return tuple(sorted(res))

    for i, (k, v, sm, layer_sites) in enumerate(found):
        layers.append(LayerKV(index=i, key_input=k.inputs[0].name, value_input=v.inputs[0].name,
                              key_concat=k.name, value_concat=v.name,
                              key_outputs=present_outputs(k), value_outputs=present_outputs(v),
                              softmax=sm.name))
        sites += [MaskSite(layer=i, node=n.name, input_index=j, kind=kind) for n, j, kind in layer_sites]

    past0 = found[0][0].inputs[0]
    shape = past0.shape
    if shape is None or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise UnsupportedPatternError(
            f"past input {past0.name!r} has shape {shape}; heads and head_dim must be static")
    for k, v, _, _ in found:
        for c in (k, v):
            s = c.inputs[0].shape
            if s is None or s[1] != shape[1] or s[3] != shape[3]:
                raise UnsupportedPatternError(
                    f"past input {c.inputs[0].name!r} has shape {s}, unlike {past0.name!r} {shape}")
    if not isinstance(vocab, int):
        emb_rows = feeds_embedding(ids)
        vocab = emb_rows
    if not isinstance(vocab, int):
        raise UnsupportedPatternError(f"logits output {logits.name!r} has no static vocabulary dim")
    info = ModelInfo(num_layers=len(layers), num_kv_heads=int(shape[1]), head_dim=int(shape[3]),
                     vocab_size=int(vocab), dtype=_dtype(past0).name, family=family, exporter=exporter)
    return Detection(info=info, input_ids=ids.name, position_ids=roles["position_ids"].name,
                     attention_mask=amask.name if amask is not None else None, logits=logits.name,
                     layers=tuple(layers), mask_sites=tuple(sites))
