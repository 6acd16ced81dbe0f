"""verify's side of hidden states and feature drafts.

The original export does not output the residual stream: ``exposed_copy``
writes a copy of it (weights linked, never re-serialized) in which the
tensors the layers finder found are graph outputs too, so the rewrite's
``hidden_states`` / ``draft_hidden_states`` are compared with the export's
own internal tensors. ``Request`` says, from the rewrite's metadata and
interface, what to compare and what to feed.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..contract import DRAFT_HIDDEN_STATES, FEATURE_LAYERS_KEY, HIDDEN_STATES, HIDDEN_STATES_KEY
from ..errors import SpecdecError
from ..model_io import load_model, save_model
from ..layer_lists import parse_layers, resolve_layers


@dataclass(frozen=True)
class Request:
    """``output``: the rewrite's hidden-states output (None: none); ``layers``: the
    layers it holds, as given; ``features``: the rewrite takes a feature input of width F."""
    output: str | None = None
    layers: tuple[int, ...] = ()
    feature_width: int | None = None


def request_of(model: onnx.ModelProto, rewritten: str | Path) -> Request:
    """What to compare and feed for the rewrite ``model`` (loaded by the caller from ``rewritten``,
    the path its errors name)."""
    meta = {p.key: p.value for p in model.metadata_props}
    outs = {o.name for o in model.graph.output}
    feat = next((i for i in model.graph.input if i.name == HIDDEN_STATES), None)
    width = feat.type.tensor_type.shape.dim[-1].dim_value if feat is not None else None
    if HIDDEN_STATES in outs:
        if HIDDEN_STATES_KEY not in meta:
            raise SpecdecError(f"{rewritten}: a hidden_states output but no {HIDDEN_STATES_KEY} metadata")
        return Request(HIDDEN_STATES, parse_layers(meta[HIDDEN_STATES_KEY], HIDDEN_STATES_KEY), width)
    if DRAFT_HIDDEN_STATES in outs:
        if FEATURE_LAYERS_KEY not in meta:
            raise SpecdecError(f"{rewritten}: a draft_hidden_states output but no {FEATURE_LAYERS_KEY} metadata")
        return Request(DRAFT_HIDDEN_STATES, (-1,), width)
    return Request(feature_width=width)


class ExposedCopy:
    """A temporary copy of ``path`` whose outputs also include ``names``."""

    def __init__(self, path: Path, names: list[str]):
        model = load_model(path)
        have = {o.name for o in model.graph.output}
        for n in names:
            if n not in have:
                model.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
        self._dir = tempfile.TemporaryDirectory(prefix="specdec-verify-")
        self.path = Path(self._dir.name) / path.name
        save_model(model, self.path, path.resolve().parent, link=True)   # a scratch copy ONNX Runtime reads

    def close(self) -> None:
        self._dir.cleanup()


def layer_names(det, req: Request) -> list[str]:
    """The original's tensors the rewrite's hidden-states output concatenates."""
    if req.output is None:
        return []
    if not det.layer_outputs:
        raise SpecdecError(f"the original's layer outputs are not found: {det.layer_outputs_problem}")
    idx = resolve_layers(req.layers, len(det.layer_outputs), "hidden states")
    return [det.layer_outputs[i] for i in idx]


def random_features(rng: np.random.Generator, n: int, width: int | None) -> np.ndarray | None:
    """One feature row per position of a row's history (standard normal)."""
    return rng.standard_normal((n, width)).astype(np.float32) if width else None


def max_diff(got: np.ndarray | None, want: np.ndarray | None, what: str = "hidden states") -> float:
    """The largest absolute difference of ``got`` (the rewrite's) and ``want`` (the export's), NaN
    when either holds a NaN (or both the same infinity); 0.0 when there is nothing to compare. Tensors
    of other shapes are not the same model's: one line naming ``what``, never a broadcast."""
    if got is None or want is None:
        return 0.0
    if got.shape != want.shape:
        raise SpecdecError(f"the rewrite's {what} have shape {list(got.shape)}, the export's {list(want.shape)} "
                           f"(the rewrite is not a rewrite of this export)")
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float32) - want.astype(np.float32))))


def worst(values) -> float:
    """The largest of ``values`` (0.0 for none), NaN when any is NaN (Python's ``max`` keeps its
    first argument when a later one is NaN: a NaN difference would read as no difference)."""
    values = [float(v) for v in values]
    return float("nan") if any(v != v for v in values) else max(values, default=0.0)
