"""The fused cache: each layer's attention rebuilt as OpenVINO's own stateful SDPA pattern.

OpenVINO's CPU plugin keeps a KV cache in place (no per-call copy of the state,
attention in one kernel) only where it finds, in OpenVINO's own graph::

    ReadValue -> Gather(beam_idx) -> Concat(new k) -> ScaledDotProductAttention
                                         \\-> Assign

(``StatefulSDPAFusion`` in its CPU transformations). No ONNX graph we tried
imports into that form (``scripts/ov_kv_fusion.py``), so the backend builds it
after import. ``fuse_cache`` rewrites a ``--target openvino`` graph
read by OpenVINO's ONNX frontend, before it is compiled:

* per layer, from the lowering's own cache write ``ScatterElementsUpdate(past,
  slots, Select(valid, new, old))`` it takes the new keys and values, and from
  the attention that reads the written cache it takes the queries, the scale
  and the attention's output;
* it replaces that attention by ``ScaledDotProductAttention(q, Concat(Gather(
  ReadValue), k_new), ...)`` with an ``Assign`` of the concatenation, the
  grouped KV heads broadcast the way the plugin's pattern expects;
* the mask is the contract's, over the grown cache: a slot holding position j
  is visible to a query at position p when j <= p. The graph reads which
  position each slot holds from one more input (``specdec_slot_positions``,
  kept by ``Cursor``), so a rejected draft is rolled back without touching the
  state: its slots are marked ``STALE`` and hidden, the next call appends
  after them, and once ``STALE_LIMIT`` slots are stale the state is compacted
  (read out and set back without them, ``compact_states``). With a limit of 0
  every rollback is a trim, so every call holds the slots a width-1 decode
  holds (``default_stale_limit`` says where that is the default, and why).

Anything the matcher does not recognise (a softcap, an ALiBi bias, a sliding
window, a batch above 1, a cache write that is not the contract's, views that
are not ``grouped_attention``'s) raises ``NotFusable`` with the reason before
the graph is changed: the backend then runs the copy path (``MakeStateful``),
which runs every lowering as it is.
"""
from __future__ import annotations

import numbers

from dataclasses import dataclass

import numpy as np

from ....errors import SpecdecError

#: the input the fused graph reads the position of each cache slot from ([B, slots] int64)
SLOT_POSITIONS = "specdec_slot_positions"
#: the position a slot holds once rolled back (or written by padding): past every query's position
STALE = np.iinfo(np.int32).max    # the CPU plugin runs int64 tensors as int32
#: stale slots a fused cache keeps (masked) before it is compacted: a compaction reads the state out
#: and sets it back (a few ms, more below f32), a stale slot costs attention over one more key
STALE_LIMIT = 48

#: the names grouped_attention gives the reshapes it adds (the only views allowed on the path)
GQA_PREFIX = "specdec/gqa/"


@dataclass
class FusedCache:
    """What ``fuse_cache`` built: the state variables, keys first, in layer order."""

    key_states: list[str]
    value_states: list[str]
    layers: int


class NotFusable(Exception):
    """The graph's attention is not the form ``fuse_cache`` rebuilds (the message says where)."""


def _type(node) -> str:
    return node.get_type_name()


def _consumers(out) -> list:
    return [t.get_node() for t in out.get_target_inputs()]


def _scalar(value) -> float | None:
    """The value of a single-element Constant (through a Convert), else None."""
    node = value.get_node()
    if _type(node) == "Convert":
        node = node.input_value(0).get_node()
    if _type(node) != "Constant":
        return None
    data = np.asarray(node.get_data() if hasattr(node, "get_data") else node.data)
    return float(data.reshape(-1)[0]) if data.size == 1 else None


def _strip_scale(value, scale: float):
    """Walk up Multiply/Divide by a scalar constant: (the value under them, the scale they apply)."""
    while True:
        node = value.get_node()
        if _type(node) not in ("Multiply", "Divide"):
            return value, scale
        a, b = node.input_value(0), node.input_value(1)
        cb = _scalar(b)
        if cb is None and _type(node) == "Multiply":
            ca = _scalar(a)
            if ca is None:
                return value, scale
            a, cb = b, ca
        if cb is None:
            return value, scale
        scale = scale * cb if _type(node) == "Multiply" else scale / cb
        value = a


def _one_reader(out, kname: str, what: str):
    readers = _consumers(out)
    if len(readers) != 1:
        raise NotFusable(f"{kname}: the {what} fan out")
    return readers[0]


def _ours(node, kname: str) -> None:
    """A Reshape or Unsqueeze on the attention path must be grouped_attention's own view."""
    if not node.get_friendly_name().startswith(GQA_PREFIX):
        raise NotFusable(f"{kname}: {_type(node)} {node.get_friendly_name()} on the attention path")


def _skip(value, kinds=("Convert", "Unsqueeze", "Reshape")):
    while _type(value.get_node()) in kinds:
        value = value.get_node().input_value(0)
    return value


def _plain_mask(mask, kname: str) -> float:
    """The additive mask must be the position_mask pass's causal one, nothing more:
    Select(GreaterEqual(position_ids, Range(0, n, 1)), 0, a large negative), whose value the
    rebuilt mask keeps. A sliding window,
    a bias or anything else on the scores cannot be rebuilt over a grown cache by this module."""
    sel = _skip(mask, ("Convert",)).get_node()
    if _type(sel) != "Select":
        raise NotFusable(f"{kname}: the scores' mask is {_type(sel)}, not the causal position mask")
    cond = sel.input_value(0).get_node()
    zero, low = _scalar(sel.input_value(1)), _scalar(sel.input_value(2))
    if _type(cond) != "GreaterEqual" or zero != 0.0 or low is None or low > -1e4:
        raise NotFusable(f"{kname}: the scores' mask is not the causal position mask")
    query = _skip(cond.input_value(0)).get_node()
    slots = _skip(cond.input_value(1)).get_node()
    if _type(query) != "Parameter" or "position_ids" not in query.output(0).get_names():
        raise NotFusable(f"{kname}: the mask's query side is not the positions (a window?)")
    if _type(slots) != "Range" or _scalar(slots.input_value(0)) != 0 or _scalar(slots.input_value(2)) != 1:
        raise NotFusable(f"{kname}: the mask's slot side is not Range(0, n, 1)")
    return low


def _cache_write(model, name: str):
    """The lowering's ScatterElementsUpdate writing cache ``name`` and the new rows it writes."""
    result = next((o.get_node() for o in model.outputs if name + "_RetainedState" in o.get_names()), None)
    if result is None:
        raise NotFusable(f"{name}: no output {name}_RetainedState")
    scatter = result.input_value(0).get_node()
    if _type(scatter) != "ScatterElementsUpdate":
        raise NotFusable(f"{name}: its cache is written by {_type(scatter)}, not the lowering's ScatterElements")
    # the contract's write, which the grown cache replaces: each valid row at the slot of its position
    if scatter.get_attributes().get("reduction", "none") != "none" or _scalar(scatter.input_value(3)) != 2:
        raise NotFusable(f"{name}: its cache write is not a plain write along the slots")
    slots = _skip(scatter.input_value(1), ("Broadcast", "Unsqueeze", "Convert")).get_node()
    src = _skip(slots.input_value(1), ("Convert",)).get_node() if _type(slots) == "Select" else None
    if src is None or _type(src) != "Parameter" or "position_ids" not in src.output(0).get_names():
        raise NotFusable(f"{name}: its cache write is not at the rows' positions")
    upd = scatter.input_value(2).get_node()
    if _type(upd) != "Select":              # Select(valid, new rows, old rows): padding keeps the old rows
        raise NotFusable(f"{name}: the written rows come from {_type(upd)}, not the lowering's padding Select")
    return result, scatter, upd.input_value(1)


def _keys_to_scores(k_scatter, kname: str):
    """From the written key cache to the scores' MatMul: Transpose(0,1,3,2), scalar scales.
    Returns (the MatMul, the scale on the key side)."""
    k_uses = [n for n in _consumers(k_scatter.output(0)) if _type(n) != "Result"]
    if len(k_uses) != 1:
        raise NotFusable(f"{kname}: the written key cache has {len(k_uses)} readers, not one")
    node, scale = k_uses[0], 1.0
    if _type(node) != "Transpose":
        raise NotFusable(f"{kname}: the key cache is read by {_type(node)}, not a Transpose")
    perm = _scalar_list(node.input_value(1))
    if perm != [0, 1, 3, 2]:
        raise NotFusable(f"{kname}: the key transpose is {perm}")
    out = node.output(0)
    while True:
        node = _one_reader(out, kname, "keys")
        if _type(node) not in ("Multiply", "Divide"):
            break
        c = _scalar(node.input_value(1)) if node.input_value(0) == out else _scalar(node.input_value(0))
        if c is None:
            raise NotFusable(f"{kname}: the keys are multiplied by a tensor")
        scale = scale * c if _type(node) == "Multiply" else scale / c
        out = node.output(0)
    if _type(node) != "MatMul" or node.input_value(1) != out:
        raise NotFusable(f"{kname}: the keys reach {_type(node)}, not the scores' MatMul")
    if node.get_attributes().get("transpose_a") or node.get_attributes().get("transpose_b"):
        raise NotFusable(f"{kname}: a transposed scores MatMul")
    return node, scale


def _scores_to_softmax(scores, kname: str):
    """scores -> [our Reshape] -> Add(the plain mask) -> Softmax: (the Softmax, the mask's value)."""
    out, masked = scores.output(0), None
    while True:
        node = _one_reader(out, kname, "scores")
        t = _type(node)
        if t == "Reshape":
            _ours(node, kname)
        elif t == "Add" and masked is None:
            masked = _plain_mask(node.input_value(1) if node.input_value(0) == out else node.input_value(0), kname)
        elif t == "Softmax":
            break
        else:
            raise NotFusable(f"{kname}: {t} between the scores and the softmax (a softcap or a bias)")
        out = node.output(0)
    if masked is None:
        raise NotFusable(f"{kname}: no additive mask on the scores")
    if node.get_attributes().get("axis") not in (-1, 3):
        raise NotFusable(f"{kname}: softmax over axis {node.get_attributes().get('axis')}")
    return node, masked


def _softmax_to_values(softmax, v_scatter, kname: str, vname: str):
    """Softmax -> [the NaN guard] -> [our Reshape] -> MatMul(., the written value cache): the MatMul."""
    out = softmax.output(0)
    while True:
        readers = _consumers(out)
        guard = [n for n in readers if _type(n) == "IsNaN"]
        rest = [n for n in readers if _type(n) != "IsNaN"]
        if len(rest) != 1 or len(guard) > 1:
            raise NotFusable(f"{kname}: the probabilities fan out")
        node = rest[0]
        t = _type(node)
        if t == "Select" and guard and node.input_value(0) == guard[0].output(0) and node.input_value(2) == out:
            pass                             # the export's NaN guard: softmax of a fully masked row
        elif t == "Reshape":
            _ours(node, kname)
        elif t == "MatMul":
            break
        else:
            raise NotFusable(f"{kname}: {t} between the softmax and the values")
        out = node.output(0)
    if node.input_value(0) != out or any(node.get_attributes().get(a) for a in ("transpose_a", "transpose_b")):
        raise NotFusable(f"{kname}: the probabilities are not the plain left operand of the values' MatMul")
    vin = node.input_value(1)
    if _type(vin.get_node()) == "Unsqueeze":
        _ours(vin.get_node(), kname)
        vin = vin.get_node().input_value(0)
    if vin != v_scatter.output(0):
        raise NotFusable(f"{vname}: the values' MatMul does not read the written value cache")
    return node


def _layer(model, kname: str, vname: str) -> dict:
    """The parts of one layer's attention: queries, scale, new keys/values, the output to replace."""
    k_res, k_scatter, k_new = _cache_write(model, kname)
    v_res, v_scatter, v_new = _cache_write(model, vname)
    if len([n for n in _consumers(v_scatter.output(0)) if _type(n) != "Result"]) != 1:
        raise NotFusable(f"{vname}: the written value cache has other readers than the attention")
    scores, scale = _keys_to_scores(k_scatter, kname)
    q, scale = _strip_scale(scores.input_value(0), scale)
    grouped = _type(q.get_node()) == "Reshape"
    if grouped:                              # grouped_attention: q [B,Hq,S,D] viewed as [B,Hkv,G*S,D]
        _ours(q.get_node(), kname)
        q, scale = _strip_scale(q.get_node().input_value(0), scale)
    softmax, masked = _scores_to_softmax(scores, kname)
    out = _softmax_to_values(softmax, v_scatter, kname, vname).output(0)
    if grouped:
        node = _one_reader(out, kname, "grouped output")
        if _type(node) != "Reshape":
            raise NotFusable(f"{kname}: the grouped output is not reshaped back to heads")
        _ours(node, kname)
        out = node.output(0)
    return dict(q=q, scale=scale, masked=masked, k_new=k_new, v_new=v_new, out=out, results=(k_res, v_res),
                params=(k_scatter.input_value(0).get_node(), v_scatter.input_value(0).get_node()))


def _scalar_list(value) -> list[int] | None:
    node = value.get_node()
    if _type(node) != "Constant":
        return None
    return [int(x) for x in np.asarray(node.get_data()).reshape(-1)]


def _state(op, name: str, new, shape, beam, held=None):
    """One cache variable: ReadValue (empty at first) -> Gather(beam_idx) -> Concat(new rows), and the
    Assign of the concatenation. ``held``: the variable's element type when it is not the rows'
    (the cache's precision below f32), with a Convert on each side, which the plugin's pattern
    takes in: the state is then handed out and back in that type, without a conversion of the
    whole cache per rollback. Returns (the concatenation, the Assign)."""
    import openvino as ov
    from openvino.op.util import Variable, VariableInfo
    b, h, _, d = shape
    rows = new.get_element_type()
    held = held or rows
    info = VariableInfo()
    info.data_shape = ov.PartialShape([b, h, -1, d])
    info.data_type = held
    info.variable_id = name
    var = Variable(info)
    init = op.broadcast(op.convert(op.constant(np.array(0, np.float32)), held),
                        op.constant(np.array([b, h, 0, d], np.int64)))
    past = op.read_value(init, var)
    if held != rows:
        past = op.convert(past, rows)
    cat = op.concat([op.gather(past, beam, op.constant(np.int64(0))), new], 2)
    return cat, op.assign(cat if held == rows else op.convert(cat, held), var)


def _heads(op, cat, h: int, hq: int, batch: int, d: int, kname: str):
    """The grown K or V for ``hq`` query heads: itself, or its KV heads repeated the way the plugin's
    stateful SDPA pattern reads grouped heads (Unsqueeze, Broadcast, Reshape)."""
    if hq % h:
        raise NotFusable(f"{kname}: {hq} query heads over {h} KV heads")
    if hq == h:
        return cat.output(0)
    un = op.unsqueeze(cat, op.constant(np.array([2], np.int64)))
    bc = op.broadcast(un, op.constant(np.array([1, 1, hq // h, 1, 1], np.int64)), broadcast_spec="bidirectional")
    return op.reshape(bc, op.constant(np.array([batch, hq, -1, d], np.int64)), False).output(0)


def _grown_mask(op, pos, slots, layers):
    """One additive mask [B, 1, S, T] for every layer: a slot holding position j (``slots`` [B, T],
    the runtime's ``Cursor.slots``) visible to a query at position p when j <= p, hidden with the
    lowering's own value. A rolled-back or padded slot holds ``STALE``, which no query sees."""
    if len({lay["masked"] for lay in layers}) != 1:
        raise NotFusable("the layers' masks hide slots with different values")
    visible = op.greater_equal(op.unsqueeze(pos, op.constant(np.array([1, 3], np.int64))),
                               op.unsqueeze(slots, op.constant(np.array([1, 2], np.int64))))
    ftype = layers[0]["q"].get_element_type().to_dtype()
    return op.select(visible, op.constant(np.array(0, ftype)), op.constant(np.array(layers[0]["masked"], ftype)))


def fuse_cache(model, kv_names: list[str], shapes: dict, batch: int, precision: str = "f32") -> FusedCache:
    """Rebuild every layer's attention of ``model`` (read from a ``--target openvino`` graph) as
    OpenVINO's stateful SDPA pattern, the state variables held at ``precision`` ("f32", "bf16",
    "f16": the cache's, ``kv_cache_precision``). Raises ``NotFusable`` with the reason and leaves
    ``model`` untouched when any layer is not the form it rebuilds."""
    import openvino as ov
    import openvino.opset13 as op

    if batch != 1:
        raise NotFusable(f"batch {batch}: the fused cache holds one sequence")
    keys = [n for n in kv_names if n.startswith("past_key.")]
    pairs = [(k, "past_value." + k[len("past_key."):]) for k in keys]
    if len(pairs) * 2 != len(kv_names) or any(v not in kv_names for _, v in pairs):
        raise NotFusable("the cache is not key/value pairs")
    layers = [_layer(model, k, v) for k, v in pairs]        # all matched before anything changes
    held = {"f32": ov.Type.f32, "bf16": ov.Type.bf16, "f16": ov.Type.f16}.get(precision)
    if held is None:
        raise NotFusable(f"no cache state at {precision!r} (f32, bf16 or f16)")
    pos = next(p for p in model.get_parameters() if "position_ids" in p.output(0).get_names())
    beam = op.parameter([batch], np.int32, name="beam_idx")
    beam.output(0).set_names({"beam_idx"})
    slots = op.parameter([batch, -1], np.int64, name=SLOT_POSITIONS)
    slots.output(0).set_names({SLOT_POSITIONS})
    sinks = []
    for (kname, vname), lay in zip(pairs, layers):
        hq = lay["out"].get_partial_shape()[1]      # the attention's output [B, Hq, S, D]
        if not hq.is_static:
            raise NotFusable(f"{kname}: the attention's heads are not static")
        lay["kv"] = []
        for name, new in ((kname, lay["k_new"]), (vname, lay["v_new"])):
            cat, assign = _state(op, name, new, shapes[name], beam, held)
            sinks.append(assign)
            _, h, _, d = shapes[name]
            lay["kv"].append(_heads(op, cat, h, hq.get_length(), batch, d, kname))
    mask = _grown_mask(op, pos, slots, layers)
    for lay in layers:
        sdpa = op.scaled_dot_product_attention(
            lay["q"], lay["kv"][0], lay["kv"][1], mask,
            op.constant(np.array(lay["scale"], lay["q"].get_element_type().to_dtype())), causal=False)
        for t in list(lay["out"].get_target_inputs()):
            t.replace_source_output(sdpa.output(0))
    for lay in layers:
        for r in lay["results"]:
            model.remove_result(r)
        for p in lay["params"]:
            model.remove_parameter(p)
    model.add_parameters([beam, slots])
    model.add_sinks(sinks)
    model.validate_nodes_and_infer_types()
    return FusedCache(key_states=keys, value_states=[v for _, v in pairs], layers=len(layers))


def kv_cache_precision(precision: str | None) -> str:
    """The cache's precision for an inference ``precision`` (None: the CPU plugin's pick): the same.
    The plugin's own default quantizes a fused cache to u8, which the copy path never does."""
    if precision is None:
        import openvino as ov
        got = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        precision = got.get_type_name() if hasattr(got, "get_type_name") else str(got)
    return precision


def default_stale_limit(precision: str, threads: int) -> int:
    """The stale slots a fused cache keeps masked by default: 0 (trimmed at every rollback) below
    f32 on one thread, where a trimmed cache kept a position's logits the same bit for bit at
    every call width and a masked one changed them visibly; ``STALE_LIMIT`` elsewhere: at f32 either
    is within float32 rounding, and on more threads the plugin splits attention by the call's
    width, so that neither keeps them (measured: docs/runtime.md, *What a rollback costs*)."""
    return 0 if precision != "f32" and threads == 1 else STALE_LIMIT


def state_array(tensor) -> np.ndarray:
    """A copy of a state tensor's values (a bf16 state, which OpenVINO hands out as float16 bits,
    widened to float32)."""
    import openvino as ov
    data = np.asarray(tensor.data)
    if tensor.element_type == ov.Type.bf16:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.array(data, copy=True)


def check_stale_limit(limit, name, ctx_len: int | None = None) -> int:
    """``limit`` as a fused cache's stale-slot limit: an integer (not a bool) in [0, ``ctx_len``]
    (more would let the state grow past the cache the artifact declares); else one line."""
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral):
        raise SpecdecError(f"{name}: the fused cache's stale-slot limit must be an integer, got {limit!r}")
    if limit < 0:
        raise SpecdecError(f"{name}: the fused cache's stale-slot limit must be >= 0 (got {limit})")
    if ctx_len is not None and limit > ctx_len:
        raise SpecdecError(f"{name}: the fused cache's stale-slot limit {limit} is more than ctx_len {ctx_len}: "
                           f"the state would grow past the cache the artifact declares")
    return int(limit)


class Cursor:
    """Which position each slot of a fused cache holds, call by call (``slots``; ``STALE`` where a
    rejected draft or a padded token wrote). Before a call, ``feeds`` marks the slots at and past
    the call's first position stale (the rollback: the rows stay in the engine, the mask hides
    them), compacts the state once more than ``stale_limit`` slots are stale (``compact_states``:
    the state read out and set back without them; 0 compacts at every rollback, which is a trim),
    and gives the call's ``beam_idx`` and ``specdec_slot_positions``. A call that starts past the
    last valid position written plus one is refused (the fixed cache would show that call the
    slots in between, which a grown cache does not hold as the contract has them), and so is a call
    whose valid positions are not one after another from its first (a gap or a repeat inside it).
    A call of padding only rolls nothing back: the fixed cache writes nothing for it."""

    def __init__(self, states: list[str], name: str, stale_limit: int | None = None):
        self.states, self.name = states, name
        self.stale_limit = STALE_LIMIT if stale_limit is None else check_stale_limit(stale_limit, name)
        self._handles = None     # (request, its cache states' handles, their fixed dims)
        self.slots = np.empty(0, np.int64)
        self.valid = 0           # positions 0..valid-1 are held, each by one slot
        self.compactions = 0     # how often the state was read out and set back (tests read it)

    @property
    def length(self) -> int:
        """Slots the state holds (valid or stale)."""
        return len(self.slots)

    def feeds(self, request, pos) -> dict:
        """The call's extra inputs (``beam_idx``, ``specdec_slot_positions``); the state rolled back
        to the call's first position first."""
        row = pos[0]
        first = int(row[0])
        n = int(np.count_nonzero(row >= 0))
        if first > self.valid:     # past the valid slots: a gap, or slots padding took
            held = f"positions 0..{self.valid - 1}" if self.valid else "no positions"
            raise SpecdecError(f"{self.name}: the fused OpenVINO cache holds {held} and the call starts at "
                               f"{first}; it must start at or before the cache's end (load it with "
                               f"cache='copy' for other calls)")
        if not np.array_equal(row[:n], np.arange(first, first + n)):
            # a slot per token: a gap (or a repeat) would show a query slots the fixed cache does not
            # hold at those positions (or two keys for one), and the logits would differ from it
            raise SpecdecError(f"{self.name}: the fused OpenVINO cache takes a call's positions one after another "
                               f"from its first, got {row.tolist()} (load it with cache='copy' for other calls)")
        if n:               # padding only (first -1) writes nothing in the fixed cache: no rollback
            self.slots[self.slots >= first] = STALE
        if np.count_nonzero(self.slots == STALE) > self.stale_limit:
            live = np.flatnonzero(self.slots != STALE)
            if self._handles is None or self._handles[0] is not request:     # the state handles, once
                handles = [h for h in request.query_state() if h.name in self.states]
                self._handles = (request, handles, [_dims(h.state) for h in handles])
            compact_states(self._handles[1], live, self._handles[2])
            self.slots = self.slots[live]
            self.compactions += 1
        self.slots = np.concatenate([self.slots, np.where(row >= 0, row, STALE).astype(np.int64)])
        self.valid = first + n if n else self.valid
        return {"beam_idx": np.zeros(pos.shape[0], np.int32), SLOT_POSITIONS: self.slots[None]}

    def reset(self) -> None:
        self.slots = np.empty(0, np.int64)
        self.valid = 0

    def contract_view(self, data: np.ndarray, shape, before: np.ndarray | None = None) -> np.ndarray:
        """A state read back ([B, H, slots, D]) in the contract's fixed shape: position p from the
        slot that holds it, for p below ``valid``; past them the fixed cache's stale slots, which a
        grown cache does not hold: ``before`` (the previous view) where given, else zeros."""
        full = np.zeros(shape, data.dtype) if before is None else before.copy()
        held = np.flatnonzero(self.slots[:data.shape[2]] < self.valid)
        full[:, :, self.slots[held]] = data[:, :, held]
        return full


def _dims(tensor) -> tuple[int, int, int]:
    """A state's batch, heads and head size (they never change; its slots do)."""
    b, h, _, d = tensor.shape
    return int(b), int(h), int(d)


def compact_states(handles, live: np.ndarray, dims: list) -> None:
    """Keep only the ``live`` slots of each cache state (``VariableState`` handles, each holding more
    slots than ``live``; ``dims``: each one's batch, heads and head size). A prefix is a view of the
    state set back (GenAI's own trim); slots in between are gathered out. The shapes are not read
    from the states: reading one costs more than making its view."""
    import openvino as ov
    prefix = bool(np.array_equal(live, np.arange(len(live))))
    for h, (b, heads, d) in zip(handles, dims):
        t = h.state
        if prefix:
            h.state = ov.Tensor(t, [0, 0, 0, 0], [b, heads, len(live), d])
        else:                               # the raw elements gathered, in the state's own type
            kept = np.ascontiguousarray(np.asarray(t.data)[:, :, live])
            h.state = ov.Tensor(kept, list(kept.shape), t.element_type)
