"""The target an EAGLE-3 head is imported for: its export (``.onnx``) or its compiled TLM directory.

What the import needs from it: the layer count, hidden size and vocabulary (to
check the checkpoint against), its file name and sha256 (recorded, so that
specdec-run refuses another target), the layers a compiled TLM exposes with
``--hidden-states`` (they must be exactly the checkpoint's), and, when the
checkpoint has no ``embed_tokens.weight``, the target's token embedding: the
``[V, H]`` initializer a Gather of ``input_ids`` reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract import MANIFEST_FILE, MODEL_FILE
from ..errors import SpecdecError
from ..layer_lists import format_layers

_ID_OPS = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten")


@dataclass(frozen=True)
class Target:
    path: Path                     # as given
    model: Path                    # the ONNX file (the export, or the artifact's model.onnx)
    num_layers: int
    hidden_size: int | None        # None: a compiled TLM without --hidden-states (refused later)
    vocab_size: int
    file: str                      # the export's file name, as a TLM manifest's "source" records it
    sha256: str
    exposed: tuple[int, ...] | None   # a compiled TLM's --hidden-states layer indices; None for an export
    family: str | None = None      # its config.json model_type (an export's, or a TLM manifest's "family")
    #: a compiled TLM's shapes a draft must share (batch_size, ctx_len, prefill_len) and its k and target,
    #: the import's defaults; None for an export
    compiled: dict | None = None


def read_target(path: str | Path) -> Target:
    p = Path(path)
    if p.is_dir():
        return _from_artifact(p)
    if not p.is_file():
        raise SpecdecError(f"--tlm {p}: no such file or directory (give the target's export or its compiled "
                           f"TLM directory)")
    return _from_export(p)


def _from_artifact(p: Path) -> Target:
    from ..artifact.manifest import Manifest
    if not (p / MANIFEST_FILE).is_file():
        raise SpecdecError(f"--tlm {p}: a directory without {MANIFEST_FILE} (give the target's export or its "
                           f"compiled TLM directory)")
    m = Manifest.read(p)
    if m.role != "tlm":
        raise SpecdecError(f"--tlm {p}: a {m.role.upper()} artifact, not a TLM")
    if not m.source_file or not m.source_sha256:
        raise SpecdecError(f"--tlm {p}: the manifest records no source export (file, sha256)")
    hs = m.hidden_states or {}
    return Target(path=p, model=p / MODEL_FILE, num_layers=m.num_layers, hidden_size=hs.get("hidden_size"),
                  vocab_size=m.vocab_size, file=m.source_file, sha256=m.source_sha256,
                  exposed=tuple(hs.get("layer_indices") or ()), family=m.family,
                  compiled={"k": m.k, "prefill_len": m.prefill_len, "ctx_len": m.ctx_len,
                            "batch_size": m.batch_size, "target": m.target})


def _from_export(p: Path) -> Target:
    from .. import pipeline
    from ..model_io import read_any, sha256_file
    original, source, source_dir, _ = read_any(p, None)
    _, det = pipeline.import_and_detect(original, source, source_dir)
    if not det.layer_outputs:
        raise SpecdecError(f"--tlm {p}: the decoder layers' outputs are not found ({det.layer_outputs_problem}); "
                           f"its hidden states cannot feed an EAGLE-3 head")
    return Target(path=p, model=p, num_layers=det.info.num_layers, hidden_size=det.hidden_size,
                  vocab_size=det.info.vocab_size, file=p.name, sha256=sha256_file(p), exposed=None,
                  family=det.info.family)


def check_exposed(t: Target, layers: tuple[int, ...]) -> None:
    """A compiled TLM must output exactly ``layers`` (its --hidden-states), in that order."""
    if t.exposed is None:
        return
    if tuple(t.exposed) != tuple(layers):
        have = f"--hidden-states {format_layers(t.exposed)}" if t.exposed else "no --hidden-states"
        raise SpecdecError(f"--tlm {t.path} was compiled with {have}, but the head reads layers "
                           f"{format_layers(layers)}: recompile the target with --hidden-states "
                           f"{format_layers(layers)}")


def target_embedding(t: Target) -> np.ndarray:
    """The target's token embedding [V, H] (float32), read from its graph."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    from ..model_io import load_model
    g = load_model(t.model).graph
    tables = {x.name: x for x in g.initializer if len(x.dims) == 2}
    ids = {"input_ids"}
    for node in g.node:
        if node.op_type in _ID_OPS and node.input and node.input[0] in ids:
            ids.update(node.output)
            continue
        if node.op_type != "Gather" or len(node.input) != 2 or node.input[1] not in ids:
            continue
        table = tables.get(node.input[0])
        if table is None or any(a.name == "axis" and a.i != 0 for a in node.attribute):
            break
        table = onnx.TensorProto.FromString(table.SerializeToString())
        if uses_external_data(table):
            load_external_data_for_tensor(table, str(t.model.parent))
        return numpy_helper.to_array(table).astype(np.float32)
    raise SpecdecError(f"--tlm {t.path}: its token embedding is not a plain [vocab, hidden] table read by a "
                       f"Gather of input_ids; give a checkpoint with embed_tokens.weight")
