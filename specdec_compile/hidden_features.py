"""Hidden states and feature drafts: what the pipeline checks and records.

A TLM compiled with ``--hidden-states LAYERS`` outputs the residual stream
after those layers (``hidden_states``). A feature draft (an EAGLE-style head
with a float input of the target's features) is compiled as a DLM with
``--feature-layers LAYERS``, naming the target layers it reads; it also
outputs its own last layer's output (``draft_hidden_states``), its
prediction of the target's feature. docs/CONTRACT.md, sections 2, 3 and 6.
"""
from __future__ import annotations

import onnx

from .contract import FEATURE_LAYERS_KEY, HIDDEN_STATES_KEY
from .errors import SpecdecError, UnsupportedPatternError
from .layer_lists import format_layers, resolve_layers


def check(det, role: str, hidden_states, feature_layers) -> tuple[int, ...] | None:
    """Refuse what this model cannot give (one line); the ``PassContext.exposed_layers``. The
    role already agrees with the layers (``Options`` refuses --hidden-states for a DLM)."""
    if det.feature_input is not None and feature_layers is None:
        what = (f"the export has a float input {det.feature_input!r} [batch, seq, {det.feature_width}] "
                f"besides its cache: a feature draft")
        if role == "tlm":
            raise SpecdecError(f"{what}; compile it with --role dlm --feature-layers LAYERS")
        raise SpecdecError(f"{what}; name the target layers it reads with --feature-layers LAYERS (e.g. -1)")
    if feature_layers is not None:
        if det.feature_input is None:
            raise SpecdecError("--feature-layers: the export has no feature input (a float [batch, seq, F] "
                               "input besides its cache): it is not a feature draft")
        n = len(feature_layers)
        # (n + 1) x H: n target layers and the draft's own-feature slot (an EAGLE-3 head, contract section 2)
        own_slot = bool(det.hidden_size) and det.feature_width == (n + 1) * det.hidden_size
        if det.feature_width % n and not own_slot:
            raise SpecdecError(f"--feature-layers names {n} layers, but the feature input "
                               f"{det.feature_input!r} is {det.feature_width} wide (not a multiple of {n})")
    if hidden_states is not None:
        resolve_layers(tuple(hidden_states), det.info.num_layers, "--hidden-states")
    layers = hidden_states if role == "tlm" else ((-1,) if feature_layers is not None else None)
    if layers is not None and not det.layer_outputs:
        option = "--hidden-states" if role == "tlm" else "--feature-layers (the draft's own features)"
        raise UnsupportedPatternError(f"{option}: the decoder layers' outputs are not found: "
                                      f"{det.layer_outputs_problem}")
    return tuple(layers) if layers is not None else None


def widths(det, hidden_states, feature_layers) -> dict:
    """``interface_problems``' keyword arguments for the extra inputs and outputs."""
    out = {}
    if hidden_states is not None:
        out["hidden_width"] = len(hidden_states) * det.hidden_size
    if feature_layers is not None:
        out["feature_width"] = det.feature_width
        out["draft_width"] = det.hidden_size
    return out


def record(model: onnx.ModelProto, hidden_states, feature_layers) -> None:
    """The layers, as given, in the model's metadata (verify reads them)."""
    if hidden_states is not None:
        model.metadata_props.add(key=HIDDEN_STATES_KEY, value=format_layers(hidden_states))
    if feature_layers is not None:
        model.metadata_props.add(key=FEATURE_LAYERS_KEY, value=format_layers(feature_layers))


def manifest_fields(result) -> dict:
    """The manifest's ``hidden_states`` (TLM) / ``feature_draft`` (DLM) entries."""
    det = getattr(result, "detection", None)
    hidden, feats = getattr(result, "hidden_states", None), getattr(result, "feature_layers", None)
    out = {}
    if hidden is not None and det is not None:
        out["hidden_states"] = {
            "layers": list(hidden),
            "layer_indices": list(resolve_layers(tuple(hidden), det.info.num_layers, "--hidden-states")),
            "hidden_size": det.hidden_size, "width": len(hidden) * det.hidden_size,
            "output": "hidden_states"}
    if feats is not None and det is not None:
        out["feature_draft"] = {
            "target_layers": list(feats), "width": det.feature_width, "input": "hidden_states",
            "draft_output": "draft_hidden_states", "draft_width": det.hidden_size,
            "pairing": "row at position p: token x_p and the target's feature at position p-1 (zeros at p = 0)"}
    return out
