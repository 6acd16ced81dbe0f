"""Checks on an exported rewrite: onnx.checker, strict shape inference, and
the contract's interface (names, order, dtypes, dims)."""
from __future__ import annotations

import contextlib

import onnx

from .contract import (BATCH, BATCH_INDEX, CTX, DRAFT_HIDDEN_STATES, FULL_BATCH, HIDDEN_STATES,
                       NUM_LOGITS_TO_KEEP, SEQ, interface)
from .errors import SpecdecError
from .value_types import dims


def _dims(vi: onnx.ValueInfoProto) -> list:
    return dims(vi, unknown=0, no_shape=[])   # an unknown dim as 0: never a contract dim


def interface_problems(model: onnx.ModelProto, role: str, num_layers: int, num_kv_heads: int,
                       head_dim: int, vocab: int, value_head_dim: int | None = None,
                       hidden_width: int | None = None, feature_width: int | None = None,
                       draft_width: int | None = None, qeff: bool = False,
                       batch_index: bool = True) -> list[str]:
    """Every way ``model``'s interface differs from the contract (empty: none).
    ``value_head_dim``: the values' head dim when it differs from the keys' (latent attention).
    ``hidden_width``: a TLM's ``hidden_states`` output width; ``feature_width`` and
    ``draft_width``: a feature draft's input and own-feature output widths (None: absent).
    ``qeff``: QEfficient's interface (contract section 7); ``batch_index``: with it its continuous
    batching (a cache of ``full_batch_size`` rows and the input ``batch_index``)."""
    problems = []
    ins, outs = interface(num_layers, hidden_states=hidden_width is not None,
                          features=feature_width is not None, qeff_role=role if qeff else None,
                          batch_index=batch_index)
    got_in = [i.name for i in model.graph.input]
    got_out = [o.name for o in model.graph.output]
    if got_in != ins:
        problems.append(f"inputs {got_in} != {ins}")
    if got_out != outs:
        problems.append(f"outputs {got_out} != {outs}")
    cb = qeff and batch_index
    rows = FULL_BATCH if cb else BATCH
    kv = [rows, num_kv_heads, CTX, head_dim]
    kv_value = [rows, num_kv_heads, CTX, value_head_dim or head_dim]
    width = 1 if role == "dlm" else NUM_LOGITS_TO_KEEP if qeff else SEQ
    want = {"input_ids": (onnx.TensorProto.INT64, [BATCH, SEQ]),
            "position_ids": (onnx.TensorProto.INT64, [BATCH, SEQ]),
            "logits": (onnx.TensorProto.FLOAT, [BATCH, width, vocab]),
            BATCH_INDEX: (onnx.TensorProto.INT64, [BATCH, 1]),
            NUM_LOGITS_TO_KEEP: (onnx.TensorProto.INT64, [NUM_LOGITS_TO_KEEP, 1])}
    extra = {HIDDEN_STATES: hidden_width if role == "tlm" else feature_width, DRAFT_HIDDEN_STATES: draft_width}
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name in extra:
            if _dims(vi) != [BATCH, SEQ, extra[vi.name]]:
                problems.append(f"{vi.name}: dims {_dims(vi)} != {[BATCH, SEQ, extra[vi.name]]}")
            continue
        if vi.name in want:
            dtype, dims = want[vi.name]
        else:
            dtype, dims = None, kv_value if vi.name.startswith("past_value.") else kv
        if dtype is not None and vi.type.tensor_type.elem_type != dtype:
            problems.append(f"{vi.name}: dtype {vi.type.tensor_type.elem_type} != {dtype}")
        if _dims(vi) != dims:
            problems.append(f"{vi.name}: dims {_dims(vi)} != {dims}")
    symbolic = {d for vi in list(model.graph.input) + list(model.graph.output) for d in _dims(vi)
                if isinstance(d, str)}
    allowed = {BATCH, SEQ, CTX} | ({NUM_LOGITS_TO_KEEP} if qeff else set()) | ({FULL_BATCH} if cb else set())
    if not symbolic <= allowed:
        problems.append(f"extra symbolic dims {sorted(symbolic - allowed)}")
    return problems


def _without_external(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for checks, in which each externally stored initializer is a graph
    input of the same type and dims (checks then never open, or need, the data
    files, and no weight is allocated)."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    keep, moved = [], []
    for t in light.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            moved.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            keep.append(t)
    if moved:
        del light.graph.initializer[:]
        light.graph.initializer.extend(keep)
        light.graph.input.extend(moved)
    return light


def check_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.checker plus strict shape inference; returns the inferred model.

    Raises SpecdecError naming the check that failed (a compiler bug, but
    reported without a traceback)."""
    light = _without_external(model)
    try:
        onnx.checker.check_model(light)
    except onnx.checker.ValidationError as e:
        raise SpecdecError(f"rewritten graph fails onnx.checker: {str(e).splitlines()[0]}") from None
    try:
        return onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    except Exception as e:  # InferenceError and friends
        raise SpecdecError(f"rewritten graph fails shape inference: {str(e).splitlines()[0]}") from None


def input_problem(original: onnx.ModelProto, source) -> SpecdecError | None:
    """The error naming the input ``original`` (read from ``source``) as not valid ONNX, when
    onnx.checker or strict shape inference fail on it; None when they pass."""
    try:
        check_model(original)
    except SpecdecError as e:
        return SpecdecError(f"{source or 'the input model'} is not a valid ONNX model: "
                            f"{str(e).replace('rewritten graph fails ', 'it fails ')}")
    return None


@contextlib.contextmanager
def input_blamed(original: onnx.ModelProto, source):
    """An unexpected error of a detector or pass on an input that is not valid ONNX becomes one
    line naming the input (``input_problem``); on a valid input it stays what it is, a bug."""
    try:
        yield
    except SpecdecError:
        raise
    except Exception:
        problem = input_problem(original, source)
        if problem is not None:
            raise problem from None
        raise
