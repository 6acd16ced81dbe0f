"""The diff of two models or files, and of a sequence of snapshots."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import onnx

from ..contract import MANIFEST_FILE
from ..errors import SpecdecError
from ..model_io import load_model, resolve_model_path
from ..artifact.manifest import Manifest
from .hashing import TensorHasher
from .index import GraphIndex, type_desc
from .matching import heuristic_renames, match_nodes, match_nodes_by_name, topology_io_renames
from .sections import (SECTIONS, init_section, io_section, is_empty, metadata_section, nodes_section,
                       op_counts_section)


# --------------------------------------------------------------------------- two models


def diff_models(a: onnx.ModelProto, b: onnx.ModelProto, *, a_dir=None, b_dir=None,
                a_label: str = "a", b_label: str = "b", hasher: TensorHasher | None = None) -> dict:
    """Diff two models (loaded without external data). ``*_dir``: where their external data lives."""
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
            "outputs": io_section(ga.output_order, dout, gb.output_order, doutb, out_map),
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


def _artifact_notes(pa: Path, pb: Path, identical: bool) -> list[str]:
    notes = []
    if (pa.parent / MANIFEST_FILE).is_file() and (pb.parent / MANIFEST_FILE).is_file():
        try:
            ja, jb = Manifest.read(pa.parent), Manifest.read(pb.parent)
        except SpecdecError:      # not two artifacts this tool wrote: no notes
            return notes
        if ja.k != jb.k:
            what = "graphs are identical" if identical else "graphs differ as shown"
            notes.append(f"k differs ({ja.k} vs {jb.k}); {what}: k lives in "
                         f"specializations.json (seq_len = k, k+1), not in the graph")
    return notes


def diff_files(path_a, path_b, *, hasher: TensorHasher | None = None) -> dict:
    """Diff two .onnx files (or artifact directories holding model.onnx)."""
    pa, pb = resolve_model_path(path_a), resolve_model_path(path_b)
    ma, mb = load_model(pa), load_model(pb)
    rep = diff_models(ma, mb, a_dir=pa.parent, b_dir=pb.parent, a_label=str(path_a), b_label=str(path_b),
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
    snaps = list(snapshots)
    if not snaps:
        raise SpecdecError("explain: no snapshots to compare")
    hasher = TensorHasher()
    passes = []
    for (na, ma), (nb, mb) in zip(snaps, snaps[1:]):
        r = diff_models(ma, mb, a_dir=base_dir, b_dir=base_dir, a_label=na, b_label=nb, hasher=hasher)
        r["pass"] = nb
        passes.append(r)
    rep: dict[str, Any] = {"kind": "explain", "passes": passes,
                           "identical": all(p["identical"] for p in passes), "notes": []}
    if total and len(snaps) > 2:
        rep["total"] = diff_models(snaps[0][1], snaps[-1][1], a_dir=base_dir, b_dir=base_dir,
                                   a_label=snaps[0][0], b_label=snaps[-1][0], hasher=hasher)
    return rep

