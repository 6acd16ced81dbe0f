"""The diff of two models or files, and of a sequence of snapshots."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import json
import os

import onnx

from ..contract import MANIFEST_FILE, SPECIALIZATIONS_FILE
from ..errors import SpecdecError
from ..model_checks import check_model_input
from ..model_io import check_external_data, external_tensors, load_model, resolve_model_path
from ..artifact.manifest import Manifest
from .hashing import TensorHasher
from .index import GraphIndex, type_desc
from .matching import heuristic_renames, match_nodes, match_nodes_by_name, topology_io_renames
from .sections import (SECTIONS, init_section, io_section, is_empty, metadata_section, nodes_section,
                       op_counts_section, output_sources)


# --------------------------------------------------------------------------- two models


def _check_model(m, directory, label: str) -> None:
    """One-line errors for a model ``diff_models`` cannot compare truthfully: not a ModelProto,
    a broken graph (``check_model_input``, without the compiler's own opset and domain limits), external data without its directory (two models'
    references would be compared, not their bytes) or with missing, unsafe or short files."""
    if not isinstance(m, onnx.ModelProto):
        raise SpecdecError(f"diff_models: model {label!r} is a {type(m).__name__}, expected an onnx.ModelProto "
                           f"(diff_files takes paths)")
    check_model_input(m, f"model {label!r}", compiler=False)
    ext = next(iter(external_tensors(m)), None)
    if ext is None:
        return
    if directory is None:
        raise SpecdecError(f"diff_models: model {label!r} has external data (tensor {ext.name!r}) but no directory "
                           f"to read it from: pass the directory of its data files (a_dir / b_dir)")
    if not isinstance(directory, (str, os.PathLike)):
        raise SpecdecError(f"diff_models: the data directory of model {label!r} is a {type(directory).__name__}, "
                           f"expected a path")
    check_external_data(m, Path(directory), what=f"model {label!r}")


def diff_models(a: onnx.ModelProto, b: onnx.ModelProto, *, a_dir=None, b_dir=None,
                a_label: str = "a", b_label: str = "b", hasher: TensorHasher | None = None) -> dict:
    """Diff two models (loaded without external data). ``*_dir``: where their external data lives
    (required when a model has external data)."""
    _check_model(a, a_dir, a_label)
    _check_model(b, b_dir, b_label)
    return _diff_models(a, b, a_dir=a_dir, b_dir=b_dir, a_label=a_label, b_label=b_label, hasher=hasher)


def _diff_models(a: onnx.ModelProto, b: onnx.ModelProto, *, a_dir, b_dir, a_label: str, b_label: str,
                 hasher: TensorHasher | None) -> dict:
    """``diff_models`` of models already checked (read from files, or snapshots of one compile)."""
    hasher = hasher or TensorHasher()
    ga, gb = GraphIndex(a, a_dir, hasher), GraphIndex(b, b_dir, hasher)

    init_sec, init_map = init_section(ga, gb)

    din = {n: type_desc(v.type) for n, v in ga.inputs.items()}
    dinb = {n: type_desc(v.type) for n, v in gb.inputs.items()}
    dout = {n: type_desc(v.type) for n, v in ga.outputs.items()}
    doutb = {n: type_desc(v.type) for n, v in gb.outputs.items()}

    def unmatched(order_a, order_b, known):
        sa, sb = set(order_a), set(order_b)
        ua = [n for n in order_a if n not in sb and n not in known]
        ub = [n for n in order_b if n not in sa and n not in set(known.values())]
        return ua, ub

    # interface renames: what the consumers of an input say (name-matched nodes), then names
    name_match = match_nodes_by_name(ga, gb)
    in_map: dict[str, str] = {}
    out_map: dict[str, str] = {}
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(topology_io_renames(ga, gb, name_match, ua, ub, inputs=True))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(topology_io_renames(ga, gb, name_match, ua, ub, inputs=False))
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(heuristic_renames(ua, ub, din, dinb))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(heuristic_renames(ua, ub, dout, doutb))

    match = match_nodes(ga, gb, in_map, init_map, out_map)

    # with the full matching, renames that only topology shows (renamed copies)
    ua, ub = unmatched(ga.input_order, gb.input_order, in_map)
    in_map.update(topology_io_renames(ga, gb, match, ua, ub, inputs=True))
    ua, ub = unmatched(ga.output_order, gb.output_order, out_map)
    out_map.update(topology_io_renames(ga, gb, match, ua, ub, inputs=False))

    report: dict[str, Any] = {
        "kind": "diff",
        "a": a_label,
        "b": b_label,
        "interface": {
            "inputs": io_section(ga.input_order, din, gb.input_order, dinb, in_map),
            "outputs": io_section(ga.output_order, dout, gb.output_order, doutb, out_map,
                                  output_sources(ga, gb, out_map, match, in_map, init_map)),
        },
        "metadata": metadata_section(a, b),
        "op_counts": op_counts_section(ga, gb),
        "nodes": nodes_section(ga, gb, match, in_map, init_map),
        "initializers": init_sec,
        "notes": [],
    }
    report["identical"] = all(is_empty(report[s]) for s in SECTIONS)
    return report


# --------------------------------------------------------------------------- files and snapshots


#: manifest settings a graph diff does not compare (they live in specializations.json, custom_io.yaml or
#: compile.sh); a note names those that differ. k has its own note; k_list is named when k is the same.
_SETTINGS = ("k_list", "prefill_len", "ctx_len", "batch_size", "kv_dtype", "logits_dtype", "precision",
             "num_cores", "num_devices", "hw_version", "compile_options")


def _is_artifact(d: Path) -> bool:
    return os.path.lexists(d / MANIFEST_FILE) or os.path.lexists(d / SPECIALIZATIONS_FILE)


def _artifact_notes(pa: Path, pb: Path, identical: bool) -> list[str]:
    """Notes on two artifact directories: the compile settings their manifests differ in, or
    that a manifest could not be read (so none were compared)."""
    if not (_is_artifact(pa.parent) and _is_artifact(pb.parent)):
        return []
    manifests = []
    for p in (pa, pb):
        try:
            manifests.append(Manifest.read(p.parent))
        except SpecdecError as e:   # hand-edited, corrupt or missing: say so, never skip silently
            return [f"cannot read the manifest of {p.parent} ({e}); compile settings such as k and ctx_len "
                    f"were not compared"]
    ja, jb = manifests
    notes = []
    if ja.k != jb.k:
        what = "graphs are identical" if identical else "graphs differ as shown"
        notes.append(f"k differs ({ja.k} vs {jb.k}); {what}: k lives in "
                     f"specializations.json (seq_len = k, k+1), not in the graph")
    keys = [f for f in _SETTINGS if getattr(ja, f) != getattr(jb, f) and not (f == "k_list" and ja.k != jb.k)]
    if keys:
        listed = ", ".join(f"{f} ({_setting(getattr(ja, f))} vs {_setting(getattr(jb, f))})" for f in keys)
        notes.append(f"the manifests also differ in {listed}: compile settings a graph diff does not "
                     f"compare (see specializations.json, custom_io.yaml, compile.sh)")
    return notes


def _setting(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v)


def _model_path(path, which: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise SpecdecError(f"diff_files: {which} is a {type(path).__name__}, expected a path to an .onnx file or an "
                           f"artifact directory (diff_models takes onnx.ModelProto)")
    if not os.fspath(path):
        raise SpecdecError(f"{which} is an empty path")
    return resolve_model_path(path)


def diff_files(path_a, path_b, *, hasher: TensorHasher | None = None) -> dict:
    """Diff two .onnx files (or artifact directories holding model.onnx)."""
    pa, pb = _model_path(path_a, "the first model"), _model_path(path_b, "the second model")
    # checks the graphs and their external data; a diff reads any valid model (an opset below
    # the compiler's, a custom domain), not only what the compiler takes
    ma, mb = load_model(pa, compiler=False), load_model(pb, compiler=False)
    rep = _diff_models(ma, mb, a_dir=pa.parent, b_dir=pb.parent, a_label=str(path_a), b_label=str(path_b),
                       hasher=hasher)
    rep["notes"] = _artifact_notes(pa, pb, rep["identical"])
    return rep


def diff_snapshots(snapshots: Iterable[tuple[str, onnx.ModelProto]], *, base_dir=None,
                   total: bool = True) -> dict:
    """What each step changed: diff consecutive ``(name, model)`` snapshots (an explain report).

    Each diff is labelled with the later snapshot's name (``"pass"``); ``total``
    adds the diff of the first snapshot against the last when there are several steps.

    ``base_dir``: the directory external data locations are relative to (the
    source model's); without it external tensors are compared by reference.
    """
    snaps = _snapshot_list(snapshots)
    if not snaps:
        raise SpecdecError("explain: no snapshots to compare")
    hasher = TensorHasher()
    passes = []
    for (na, ma), (nb, mb) in zip(snaps, snaps[1:]):
        r = _diff_models(ma, mb, a_dir=base_dir, b_dir=base_dir, a_label=na, b_label=nb, hasher=hasher)
        r["pass"] = nb
        passes.append(r)
    rep: dict[str, Any] = {"kind": "explain", "passes": passes,
                           "identical": all(p["identical"] for p in passes), "notes": []}
    if total and len(snaps) > 2:
        rep["total"] = _diff_models(snaps[0][1], snaps[-1][1], a_dir=base_dir, b_dir=base_dir,
                                    a_label=snaps[0][0], b_label=snaps[-1][0], hasher=hasher)
    return rep


def _snapshot_list(snapshots) -> list[tuple[str, onnx.ModelProto]]:
    """``snapshots`` as a list of ``(name, ModelProto)`` pairs; a one-line error for anything else."""
    try:
        snaps = list(snapshots)
    except TypeError:
        raise SpecdecError(f"explain: snapshots is a {type(snapshots).__name__}, expected a list of "
                           f"(name, onnx.ModelProto) pairs") from None
    for i, s in enumerate(snaps):
        if not (isinstance(s, (tuple, list)) and len(s) == 2 and isinstance(s[0], str)
                and isinstance(s[1], onnx.ModelProto)):
            raise SpecdecError(f"explain: snapshot {i} is not a (name, onnx.ModelProto) pair")
    return [tuple(s) for s in snaps]
