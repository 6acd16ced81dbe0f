"""Finder: each layer's sliding window, read off what its mask computes.

Exporters build a window from constants in many ways (a Sub and a Greater
over positions, a Trilu over a buffer, a constant mask table sliced by
length). Rather than match each, the finder evaluates each layer's mask
operands (``_probe``: no weights read) for probe inputs of ``SEQ`` new
tokens after ``past`` cached ones and reads the visibility matrix: the query
at position p must see exactly the slots ``p - W < c <= p`` (a window of W
tokens) or ``c <= p`` (no window). Anything else is refused, naming the
layer and what the query saw: the compiler never replaces a mask it cannot
account for.

Probes: a short history, and one longer than the largest integer constant
(or constant table dim) in the mask's cone, so a window of any size shows.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..errors import UnsupportedPatternError
from ..graph_utils import const_value, producer
from ._probe import InvalidGraphError, Probe, ProbeError, probe_inputs

SEQ = 3
#: windows of this many tokens or more are not looked for (sentinels like INT_MAX are not windows)
MAX_PROBE = 1 << 17


def _cone_constants(tensors: list[gs.Tensor]) -> tuple[int, int]:
    """(largest integer scalar constant, largest dim of a constant table) in the cone."""
    best_scalar, best_dim, seen, stack = 0, 0, set(), list(tensors)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        v = const_value(t) if (isinstance(t, gs.Constant) or producer(t) is not None) else None
        if v is not None and v.dtype.kind in "iu" and v.size == 1 and abs(int(v.reshape(-1)[0])) < MAX_PROBE:
            best_scalar = max(best_scalar, abs(int(v.reshape(-1)[0])))
        elif v is not None and v.ndim >= 2:
            best_dim = max(best_dim, max(v.shape[-2:]))
        n = producer(t)
        if n is not None:
            stack += list(n.inputs)
    return best_scalar, best_dim


def visibility(kind: str, value: np.ndarray, past: int, seq: int, where: str) -> np.ndarray:
    """[seq, past+seq] bool: which slot each query sees, from one mask operand."""
    m = np.asarray(value)
    m = m.reshape((1,) * max(0, 4 - m.ndim) + m.shape)
    if m.shape[-1] != past + seq or m.shape[-2] not in (1, seq):
        raise UnsupportedPatternError(f"{where}: mask operand has shape {list(m.shape)} for {seq} queries over "
                                      f"{past + seq} keys")
    m = np.broadcast_to(m, m.shape[:-2] + (seq, past + seq)).reshape(-1, seq, past + seq)
    if not all(np.array_equal(m[0], x) for x in m[1:]):
        raise UnsupportedPatternError(f"{where}: the mask differs between heads or rows of one sequence")
    m = m[0]
    if kind == "additive":
        if not np.all((m >= -1e-6) & (m <= 1e-6) | (m <= -1e3)):
            raise UnsupportedPatternError(f"{where}: the additive mask holds values other than 0 and a large "
                                          f"negative (e.g. {float(m[(m < -1e-6) & (m > -1e3)][0]):g})")
        return m > -1.0
    return m.astype(bool) if kind == "visible" else ~m.astype(bool)


def window_of(vis: np.ndarray, past: int, where: str) -> int | None:
    """W when query p sees exactly p-W < c <= p; None when it sees c <= p."""
    windows = set()
    for i, row in enumerate(vis):
        p = past + i
        seen = np.nonzero(row)[0]
        if len(seen) == 0 or seen[-1] != p or not np.array_equal(seen, np.arange(seen[0], p + 1)):
            shown = f"{seen[0]}..{seen[-1]} ({len(seen)} slots)" if len(seen) else "nothing"
            raise UnsupportedPatternError(f"{where}: the attention mask is not causal: the query at position "
                                          f"{p} sees {shown}")
        if seen[0] > 0:
            windows.add(int(p - seen[0] + 1))
    if len(windows) > 1:
        raise UnsupportedPatternError(f"{where}: the mask's window differs between queries ({sorted(windows)})")
    return windows.pop() if windows else None


def _probes(operands: list[gs.Tensor]) -> list[int]:
    scalar, dim = _cone_constants(operands)
    out = {max(scalar + 2, SEQ + 5)}
    if dim > 2 * SEQ:
        out.add(dim - SEQ)
    return sorted(out)


def find_windows(graph: gs.Graph, layers, inputs, concats: list[gs.Node]
                 ) -> tuple[list[int | None], dict[str, str]]:
    """The window of each layer in ``layers`` (None: none), from its mask
    sites, and the dtype of each site's operand (by operand name)."""
    operands = [n.inputs[j] for a in layers for n, j, _ in a.sites]
    dtypes: dict[str, str] = {}
    if not operands:
        return [None] * len(layers), dtypes
    roles = {"input_ids": inputs.input_ids, "position_ids": inputs.position_ids,
             "attention_mask": inputs.attention_mask}
    found: list[set] = [set() for _ in layers]
    errors = []
    for past in _probes(operands):
        try:
            dims, feeds = probe_inputs(graph, past, SEQ, roles, [n.inputs[0] for n in concats])
            values = Probe(graph, dims, feeds).values(operands)
        except InvalidGraphError as e:
            raise UnsupportedPatternError(f"the model is not valid ONNX: {e}") from None
        except ProbeError as e:
            errors.append(f"past {past}: {e}")
            continue
        dtypes.update({t.name: np.asarray(v).dtype.name for t, v in zip(operands, values)})
        it = iter(values)
        for i, a in enumerate(layers):
            vis = np.ones((SEQ, past + SEQ), bool)
            for n, j, kind in a.sites:
                vis &= visibility(kind, next(it), past, SEQ, f"layer {i} (Softmax {a.softmax.name!r})")
            found[i].add(window_of(vis, past, f"layer {i} (Softmax {a.softmax.name!r})"))
    if errors:
        raise UnsupportedPatternError(f"cannot evaluate the attention mask to check it: {errors[0]}")
    return [min((w for w in ws if w is not None), default=None) for ws in found], dtypes
