"""Finder: the decoder layers' outputs (the residual stream between layers).

The residual stream is found by dominance, not by names or op lists. Over the
tensors whose *values* depend on the token inputs (``input_ids``, and a
feature draft's float feature input) and that the logits depend on, a
*dominator* is a tensor every such path to the logits passes through. Inside a
decoder with residual connections the only dominators between two layers are
residual stream tensors: the skip connection goes around everything else (the
norms, attention, the MLP, a MoE router). A *residual Add* is a dominator made
by an ``Add`` whose two inputs both depend on the tokens (a bias or a scale is
a constant, a learned position embedding depends on the positions, not the
tokens).

Layer i's residual Adds are those its attention (the key cache Concat) reaches
before layer i+1's attention does; its output is the last of them, or the
Cast / Reshape of it the next layer reads (Llama:
the attention Add, then the MLP Add; GPT-J, Falcon, Phi, Cohere: one Add of
attention and MLP). Checked, else refused: every layer has one; each residual
Add adds into the one before it (that tensor is a leaf of its tree of Adds),
so a stream normalized between layers (post-norm) is refused, not taken for the
stream; the last layer's output is the last residual Add before the logits:
the input of the final norm.

Dominance test: in a topological order of these tensors, t dominates the
logits iff no edge jumps over t (from before t to after it).
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ..graph_utils import SHAPE_ONLY_OPS, const_value, is_const, producer, value_dependence


@dataclass(frozen=True, eq=False)
class LayerOutputs:
    """``outputs[i]``: the residual stream after decoder layer i; ``width``:
    its last dim (the hidden size)."""
    outputs: tuple[gs.Tensor, ...]
    width: int


def _on_path(graph: gs.Graph, nodes: list[gs.Node], sources: list[gs.Tensor], sink: gs.Tensor) -> set[int]:
    """ids of tensors whose values depend on ``sources`` and that ``sink``'s values depend on."""
    fwd = value_dependence(graph, sources, nodes)
    back = {id(sink)}
    for node in reversed(nodes):
        if node.op in SHAPE_ONLY_OPS or not any(id(t) in back for t in node.outputs):
            continue
        back.update(id(t) for t in node.inputs)
    return fwd & back


def _dominators(nodes: list[gs.Node], sources: list[gs.Tensor], keep: set[int]) -> list[gs.Tensor]:
    """The tensors in ``keep`` that every path from ``sources`` to the sink
    passes through, in order (``keep``: the tensors on such paths)."""
    order: list[gs.Tensor] = []
    pos: dict[int, int] = {}
    for t in sources:
        if id(t) in keep and id(t) not in pos:
            pos[id(t)] = len(order)
            order.append(t)
    edges = []
    for node in nodes:
        if node.op in SHAPE_ONLY_OPS:
            continue
        outs = [t for t in node.outputs if id(t) in keep]
        ins = [t for t in node.inputs if id(t) in keep]
        for t in outs:
            if id(t) not in pos:
                pos[id(t)] = len(order)
                order.append(t)
        edges += [(pos[id(a)], pos[id(b)]) for a in ins for b in outs]
    # a virtual source before every input: paths may start at any of them
    edges += [(-1, pos[id(t)]) for t in sources if id(t) in pos]
    cover = [0] * (len(order) + 2)
    for a, b in edges:
        if b - a > 1:
            cover[a + 2] += 1
            cover[b + 1] -= 1
    doms, run = [], 0
    for i, t in enumerate(order):
        run += cover[i + 1]
        if run == 0:
            doms.append(t)
    return doms


def _descendants(start: gs.Tensor, keep: set[int]) -> set[int]:
    seen, todo = {id(start)}, [start]
    while todo:
        t = todo.pop()
        for node in t.outputs:
            if node.op in SHAPE_ONLY_OPS:
                continue
            for o in node.outputs:
                if id(o) in keep and id(o) not in seen:
                    seen.add(id(o))
                    todo.append(o)
    return seen


#: ops that pass the stream on unchanged in value (a float32 -> float32 Cast the exporter kept,
#: OPT's flattening of the stream to [batch * seq, hidden] around its MLP and back)
_SAME = ("Cast", "Identity", "Reshape")


def _add_leaves(t: gs.Tensor, doms: set[int], keep: set[int]) -> list[gs.Tensor]:
    """The operands of the tree of token-dependent Adds that makes ``t``,
    stopping at anything not an Add; a leaf made by Cast / Identity of a
    dominator is that dominator (the stream, re-typed)."""
    leaves, todo = [], [x for x in producer(t).inputs]
    while todo:
        x = todo.pop()
        p = producer(x)
        if id(x) not in doms and id(x) in keep and p is not None and p.op == "Add":
            todo += list(p.inputs)
            continue
        while p is not None and p.op in _SAME and id(p.inputs[0]) in doms:
            x = p.inputs[0]
            p = producer(x)
        leaves.append(x)
    return leaves


#: elementwise ops: the last dim of a constant operand wider than 1, else that of the other operand
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Cast", "Identity")


def _same_values(doms: list[gs.Tensor], j: int) -> int:
    """The last of the dominators from ``j`` on that only re-type or re-shape
    ``doms[j]`` (OPT: the MLP's residual Add is [batch * seq, hidden], the
    stream the next layer reads is its Reshape back to [batch, seq, hidden])."""
    while j + 1 < len(doms):
        p = producer(doms[j + 1])
        if p is None or p.op not in _SAME or p.inputs[0] is not doms[j]:
            break
        j += 1
    return j


def _width_of(t: gs.Tensor, depth: int = 8) -> int | None:
    """The static last dim of ``t``: its stated shape, else that of the
    constant weight of the MatMul / Gemm / Gather that makes it (through
    Reshape to a constant last dim and elementwise ops)."""
    if t.shape and isinstance(t.shape[-1], int) and t.shape[-1] > 0:
        return int(t.shape[-1])
    p = producer(t)
    if p is None or depth == 0:
        return None
    if p.op in _ELEMENTWISE:
        wide = [int(x.shape[-1]) for x in p.inputs if is_const(x) and x.shape and isinstance(x.shape[-1], int)
                and x.shape[-1] > 1]
        if wide:
            return wide[0]
        data = [x for x in p.inputs if not is_const(x)]
        return _width_of(data[0], depth - 1) if len(data) == 1 else None
    if len(p.inputs) < 2:
        return None
    if p.op == "MatMul" and is_const(p.inputs[1]) and len(p.inputs[1].shape or ()) == 2:
        return int(p.inputs[1].shape[1])
    if p.op == "Gemm" and is_const(p.inputs[1]) and len(p.inputs[1].shape or ()) == 2:
        return int(p.inputs[1].shape[0 if p.attrs.get("transB", 0) else 1])
    if p.op == "Gather" and is_const(p.inputs[0]) and len(p.inputs[0].shape or ()) == 2:
        return int(p.inputs[0].shape[1])
    if p.op == "Reshape":
        shape = const_value(p.inputs[1])
        sp = producer(p.inputs[1])
        if shape is None and sp is not None and sp.op == "Concat":
            shape = const_value(sp.inputs[-1])
        if shape is not None and shape.size and int(shape.reshape(-1)[-1]) > 0:
            return int(shape.reshape(-1)[-1])
        return _width_of(p.inputs[0], depth - 1)
    return None


def find_layer_outputs(graph: gs.Graph, nodes: list[gs.Node], sources: list[gs.Tensor], logits: gs.Tensor,
                       key_concats: list[gs.Node]) -> LayerOutputs:
    """The residual stream after each layer (``key_concats[i]``: layer i's key
    cache Concat), or ``UnsupportedPatternError`` saying why it is not found."""
    keep = _on_path(graph, nodes, sources, logits)
    doms = _dominators(nodes, sources, keep)
    dom_ids = {id(t) for t in doms}
    adds = [i for i, t in enumerate(doms)
            if producer(t) is not None and producer(t).op == "Add"
            and sum(id(x) in keep for x in producer(t).inputs) == 2]
    if not adds:
        raise UnsupportedPatternError("no residual stream found: no Add of two token-dependent tensors that "
                                      "every path to the logits passes through")
    firsts = []
    for i, concat in enumerate(key_concats):
        reach = _descendants(concat.outputs[0], keep)
        hit = [j for j, t in enumerate(doms) if id(t) in reach]
        if not hit:
            raise UnsupportedPatternError(f"layer {i}: its attention reaches no tensor of the residual stream")
        firsts.append(hit[0])
    if firsts != sorted(firsts) or len(set(firsts)) != len(firsts):
        raise UnsupportedPatternError("the layers' attention blocks do not follow one another along the "
                                      "residual stream")
    bounds = firsts[1:] + [len(doms)]
    outputs, chain = [], [j for j in adds if j >= firsts[0]]
    for i, (lo, hi) in enumerate(zip(firsts, bounds)):
        mine = [j for j in chain if lo <= j < hi]
        if not mine:
            raise UnsupportedPatternError(f"layer {i}: no residual Add after its attention "
                                          f"(before {'layer ' + str(i + 1) if i + 1 < len(firsts) else 'the logits'})")
        outputs.append(doms[_same_values(doms, mine[-1])])
    for prev, cur in zip(chain, chain[1:]):
        leaves = _add_leaves(doms[cur], dom_ids, keep)
        if not any(x is doms[prev] for x in leaves):
            raise UnsupportedPatternError(
                f"residual Add {producer(doms[cur]).name!r} does not add into the stream {doms[prev].name!r} "
                f"(a stream normalized between layers, post-norm?)")
    widths = {w for j in chain for x in [doms[j], *_add_leaves(doms[j], dom_ids, keep)]
              if (w := _width_of(x)) is not None}
    if len(widths) != 1:
        raise UnsupportedPatternError(f"cannot tell the hidden size of the residual stream "
                                      f"(found {sorted(widths) or 'none'})")
    return LayerOutputs(outputs=tuple(outputs), width=widths.pop())
