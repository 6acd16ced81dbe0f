"""A draft's LM head over a subset of the vocabulary, as an edit of its ONNX export.

The tied 49152 x 576 head of SmolLM2 is the cost floor of any draft that
emits full-vocabulary logits: a 1-layer draft spends most of its step in it.
A draft that proposes only from N token ids needs only N rows.
``truncate_head`` keeps those columns of the head's MatMul weight and, with
``pad=True``, spreads the N logits back over the full vocabulary with a large
finite negative value elsewhere (a Pad for the first N ids; for any other set
a Gather from [the N logits, the pad value]): the graph keeps the interface
every runtime accepts today (logits ``[batch, seq, V]``), and softmax gives
the other ids probability exactly 0, so the speculative sampling rule stays
exact (q is precisely the distribution the draft sampled from). With
``pad=False`` (first N ids only) the logits are ``[batch, seq, N]``, for a
runtime that accepts a draft emitting the first N ids (q = 0 elsewhere).

Byte-level BPE ids are roughly in merge order, so the first ids are frequent
ones, but SmolLM2's answers use only 87% ids below 8192; the N ids the target
used most in its distillation answers cover about 97-98% with 8192 rows.
"""
from __future__ import annotations

from pathlib import Path

PAD_LOGIT = -1.0e4      # finite (no NaN from -inf - -inf), below any real logit; exp() underflows to 0


def truncate_head(src: Path, dst: Path, keep, *, pad: bool = True) -> dict:
    """Rewrite the export ``src`` (logits = MatMul(hidden, W) or MatMul(hidden, Transpose(E)))
    into ``dst`` with a head over the token ids ``keep`` (an int N: the first N ids; or a
    sorted list of ids). With ``pad`` the logits stay full-vocabulary: the first N ids by a
    Pad, an arbitrary set by a Gather from [logits of ``keep``, PAD_LOGIT]. Returns what changed."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    prod = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    outs = [o for o in g.output if o.name == "logits"]
    if not outs or "logits" not in prod or prod["logits"].op_type != "MatMul":
        raise SystemExit(f"{src}: the logits are not a MatMul with the LM head; cannot truncate the head")
    head = prod["logits"]
    w = head.input[1]
    if w in inits:
        full = numpy_helper.to_array(inits[w])                        # [H, V]
    elif w in prod and prod[w].op_type == "Transpose" and prod[w].input[0] in inits:
        full = numpy_helper.to_array(inits[prod[w].input[0]]).T       # [V, H] stored
    else:
        raise SystemExit(f"{src}: the LM head weight is not a constant; cannot truncate the head")
    V = int(full.shape[1])
    ids = list(range(keep)) if isinstance(keep, int) else [int(i) for i in keep]
    n_keep = len(ids)
    if not 0 < n_keep <= V or ids != sorted(set(ids)) or ids[0] < 0 or ids[-1] >= V:
        raise SystemExit(f"head ids must be a non-empty ascending set of distinct ids in [0, {V})")
    first_n = ids == list(range(n_keep))
    W = full[:, ids]
    name = "draft_head.weight"
    g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(W, dtype=W.dtype), name))
    head.input[1] = name
    dim = outs[0].type.tensor_type.shape.dim[2]
    if not first_n and not pad:
        raise SystemExit("a head over an arbitrary id set needs pad=True (logits over the full vocabulary)")
    if pad and n_keep < V:
        head.output[0] = "draft_head.logits"
        g.initializer.append(numpy_helper.from_array(np.array(PAD_LOGIT, W.dtype), "draft_head.fill"))
        pads = [0, 0, 0, 0, 0, V - n_keep] if first_n else [0, 0, 0, 0, 0, 1]
        g.initializer.append(numpy_helper.from_array(np.array(pads, np.int64), "draft_head.pads"))
        padded = "logits" if first_n else "draft_head.padded"
        g.node.append(helper.make_node("Pad", ["draft_head.logits", "draft_head.pads", "draft_head.fill"],
                                       [padded], mode="constant", name="draft_head/Pad"))
        if not first_n:
            # column of each vocabulary id in [logits of ids..., PAD_LOGIT]
            where = np.full(V, n_keep, np.int64)
            where[ids] = np.arange(n_keep)
            g.initializer.append(numpy_helper.from_array(where, "draft_head.columns"))
            g.node.append(helper.make_node("Gather", [padded, "draft_head.columns"], ["logits"], axis=2,
                                           name="draft_head/Gather"))
        dim.dim_value = V
    else:
        dim.dim_value = n_keep
    # the old weight (or the Transpose of the tied embedding) may now be dead
    used = {i for n in g.node for i in n.input}
    if w in prod and prod[w].output[0] not in used:
        g.node.remove(prod[w])
        used = {i for n in g.node for i in n.input}
    for init in list(g.initializer):
        if init.name not in used:
            g.initializer.remove(init)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst))
    return {"vocab": V, "head_rows": n_keep, "first_ids": first_n, "padded_to_vocab": bool(pad and n_keep < V)}
