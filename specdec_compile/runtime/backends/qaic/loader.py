"""Loading for Cloud AI 100: find the QPC, read its IO descriptor, check it
against the artifact, load and activate the program. Nothing here runs it.

``qaicrt`` / ``QAicApi_pb2`` come from the platform SDK (``import_qaicrt``);
tests pass FAKE modules in their place.
"""
from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ....contract import (BATCH_INDEX, COMPILE_SCRIPT, INPUT_IDS, LOGITS, MANIFEST_FILE, NUM_LOGITS_TO_KEEP,
                          POSITION_IDS, QPC_DIR)
from ....errors import SpecdecError
from ....artifact.reader import Artifact
from ..base import check_device_ids, resolve_artifact, with_vocab
from .buffers import BufType, buffer_types, check_value_binding

SDK_LIB = "/opt/qti-aic/dev/lib"
SDK_PYTHON = "/opt/qti-aic/dev/python"
QPC_FILE = "programqpc.bin"
QEFF_INPUTS = (BATCH_INDEX, NUM_LOGITS_TO_KEEP)


def import_qaicrt():
    """(qaicrt, QAicApi_pb2) from the Cloud AI 100 platform SDK, or a SpecdecError."""
    mods = []
    for name, extra in (("qaicrt", f"{SDK_LIB}/{platform.machine()}"), ("QAicApi_pb2", SDK_PYTHON)):
        try:
            mods.append(__import__(name))
            continue
        except ImportError:
            pass
        if os.path.isdir(extra) and extra not in sys.path:
            sys.path.append(extra)
        try:
            mods.append(__import__(name))
        except ImportError:
            raise SpecdecError(f"--backend qaic needs the Cloud AI 100 runtime ({name} not importable; "
                               f"install the platform SDK under /opt/qti-aic)") from None
    return mods[0], mods[1]


def find_qpc(artifact: Artifact, qpc=None) -> Path:
    """The QPC directory of an artifact: ``qpc`` if given, else OUT/qpc (or the
    -aic-binary-dir named by the manifest); it must hold programqpc.bin."""
    cands = []
    if qpc is not None:
        if not isinstance(qpc, (str, os.PathLike)):
            raise SpecdecError(f"{artifact.path}: qpc must be the QPC directory (a path), got {qpc!r}")
        cands = [Path(qpc)]
    else:
        m = artifact.manifest
        for key in ("qpc_dir", "qpc", "aic_binary_dir"):
            if isinstance(m.get(key), str):
                q = Path(m[key])
                cands.append(q if q.is_absolute() else artifact.path / q)
        cands += [artifact.path / QPC_DIR, artifact.path / f"{QPC_DIR}s", artifact.path]
    for c in cands:
        if (c / QPC_FILE).is_file():
            return c
        if c.name == QPC_FILE and c.is_file():
            return c.parent
    raise SpecdecError(f"{artifact.path}: no compiled QPC ({QPC_FILE}) in "
                       f"{', '.join(str(c) for c in cands)}; run its {COMPILE_SCRIPT} first")


@dataclass
class QaicProgram:
    """A loaded, activated QPC and the facts about its bindings the runner needs."""

    artifact: Artifact
    rt: object                      # the qaicrt module
    qpc_path: Path
    device_ids: list[int] | None
    context: object
    queue: object
    program: object
    exec_obj: object
    bindings: list                  # the IO descriptor's bindings, in index order
    index: dict                     # binding name -> index
    dtypes: dict                    # QAicApi type -> BufType (buffers.py)
    allowed: list                   # per specialization: {binding name: dims}
    retained: list[str]             # the retained-state bindings (kept on the device)
    logits_type: BufType

    def check(self, status, what: str) -> None:
        if status != self.rt.QStatus.QS_SUCCESS:
            raise SpecdecError(f"{self.artifact.name}: qaicrt {what} failed ({status})")


def _read_iodesc(art: Artifact, qpc_path: Path, qpc_obj, api, ok) -> tuple[list, dict, list]:
    """(bindings, allowed shapes per specialization, buffer types) from the QPC's IO descriptor."""
    status, raw = qpc_obj.getIoDescriptor()
    if status != ok:
        raise SpecdecError(f"{art.name}: qaicrt getIoDescriptor failed ({status})")
    iodesc = api.IoDesc()
    iodesc.ParseFromString(bytes(raw))
    bindings = list(iodesc.selected_set.bindings)
    dtypes = buffer_types(api)
    names = {b.name for b in bindings}
    for need in (INPUT_IDS, POSITION_IDS, LOGITS):
        if need not in names:
            raise SpecdecError(f"{qpc_path}: the QPC has no {need!r} binding")
    for b in bindings:
        if b.type not in dtypes:
            raise SpecdecError(f"{qpc_path}: binding {b.name} has an unsupported type {b.type}")
    floats = {LOGITS, *art.extra_inputs, *art.extra_outputs}
    for b in bindings:
        if b.name in (INPUT_IDS, POSITION_IDS, *QEFF_INPUTS) or b.name in floats:
            check_value_binding(qpc_path, b, dtypes, "float" if b.name in floats else "int")
    allowed = [{b.name: tuple(s.dims) for b, s in zip(bindings, shape_set.shapes)}
               for shape_set in iodesc.allowed_shapes]
    # a QPC of one specialization may list no allowed shapes: its selected set is the only one
    shape_sets = allowed or [{b.name: tuple(b.dims) for b in bindings}]
    # every (batch, seq_len) the artifact declares must be one the QPC accepts
    qpc_shapes = {tuple(a[INPUT_IDS]) for a in shape_sets if INPUT_IDS in a}
    missing = [s for s in art.shapes() if s not in qpc_shapes]
    if missing:
        raise SpecdecError(f"{qpc_path}: the QPC was compiled for input_ids shapes "
                           f"{sorted(qpc_shapes)}, not the artifact's {missing}")
    return bindings, shape_sets, dtypes


def _call_symbols(art: Artifact) -> dict:
    """(batch, seq_len) -> the values of the interface's symbolic dims at that call: an
    --interface qeff artifact's specializations as recorded, else batch_size, seq_len, ctx_len."""
    specs = (art.manifest.get("qeff") or {}).get("specializations") if art.qeff else None
    out = {}
    for sp in specs or ({"batch_size": b, "seq_len": s, "ctx_len": art.ctx_len} for b, s in art.shapes()):
        vals = {k: int(v) for k, v in sp.items() if isinstance(v, int) or (isinstance(v, str) and v.isdigit())}
        out[(vals.get("batch_size"), vals.get("seq_len"))] = vals
    return out


def check_qpc_interface(art: Artifact, qpc_path: Path, bindings, shape_sets: list) -> None:
    """The QPC's bindings must be the artifact's recorded interface, with its dims at each of the
    artifact's calls (the cache's rows and ctx_len, the features' width, the logits' columns): a
    QPC compiled from another model or with other options is refused here, never run (an input
    the runtime does not write would be left to whatever the device holds). One line."""
    io = art.manifest.get("interface")
    if not isinstance(io, dict):
        return      # an artifact written before the interface was recorded: names checked above only
    want = {d.get("name"): d.get("shape") for d in (*(io.get("inputs") or ()), *(io.get("outputs") or ()))
            if isinstance(d, dict)}
    names = [b.name for b in bindings]
    extra, lacks = [n for n in names if n not in want], [n for n in want if n not in names]
    if extra or lacks:
        what = "; ".join(x for x in (extra and f"has {extra}, not in the artifact's interface ({MANIFEST_FILE})",
                                     lacks and f"lacks {lacks}") if x)
        raise SpecdecError(f"{qpc_path}: the QPC {what}: compiled from another model?")
    for (B, S), sym in _call_symbols(art).items():
        first = None
        for a in (a for a in shape_sets if a.get(INPUT_IDS) == (B, S)):
            bad = next(((n, a[n], exp) for n in names if (exp := _expected(want[n], sym, a[n])) is not None
                        and exp != list(a[n])), None)
            if bad is None:
                break
            first = first or bad
        else:
            if first is None:
                continue        # no such call in the QPC: refused by _read_iodesc already
            n, got, exp = first
            raise SpecdecError(f"{qpc_path}: at input_ids [{B}, {S}] the QPC's {n} is {list(got)}, the "
                               f"artifact's interface says {exp}: compiled from another model or other options?")


def _expected(shape, sym: dict, got) -> list | None:
    """``shape`` (the interface record's dims) resolved with ``sym``; a dim it cannot resolve
    takes the QPC's own. None when the record has no usable shape."""
    if not isinstance(shape, list) or len(shape) != len(got):
        return None if not isinstance(shape, list) else [*shape]
    return [d if isinstance(d, int) else sym.get(d, g) for d, g in zip(shape, got)]


def guarded(where, what: str, fn, *args):
    """``fn(*args)``, a qaicrt call: an exception the SDK's bindings raise (besides the statuses
    they return) becomes one line naming the call, never a traceback."""
    try:
        return fn(*args)
    except SpecdecError:
        raise
    except Exception as e:
        raise SpecdecError(f"{where}: qaicrt {what} failed ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:300]})") from None


def _check_bindings(art: Artifact, qpc_path: Path, bindings, allowed) -> dict:
    """Binding name -> index, once the QPC's bindings are checked against the artifact: the
    extras it declares, the --interface qeff inputs, then the whole recorded interface."""
    index = {b.name: b.index for b in bindings}
    for n in (*art.extra_inputs, *art.extra_outputs):
        if n not in index:
            raise SpecdecError(f"{qpc_path}: the manifest declares {n!r} but the QPC has no such binding")
    want = ({BATCH_INDEX} if art.cache_rows else set()) | ({NUM_LOGITS_TO_KEEP} if art.qeff and art.role == "tlm"
                                                             else set())
    if not want <= set(index):
        raise SpecdecError(f"{qpc_path}: the artifact has --interface qeff but the QPC has no "
                           f"{' / '.join(sorted(want - set(index)))} binding: compiled from another model?")
    for name, option in ((BATCH_INDEX, "--full-batch-size"), (NUM_LOGITS_TO_KEEP, "--interface qeff")):
        if name in index and name not in want:
            raise SpecdecError(f"{qpc_path}: the QPC has a {name} binding but the artifact was compiled "
                               f"without {option}: compiled from another model?")
    return index


def load_qaic(artifact, *, device_ids=None, qpc=None, expect_role: str | None = None,
              qaicrt_module=None, aicapi_module=None) -> QaicProgram:
    """Load an artifact's QPC on the devices ``device_ids`` (default: device 0)."""
    if qaicrt_module is None or aicapi_module is None:
        rt, api = import_qaicrt()
        qaicrt_module = qaicrt_module or rt
        aicapi_module = aicapi_module or api
    rt, api = qaicrt_module, aicapi_module
    art = resolve_artifact(artifact, expect_role, need_model=False)
    qpc_path = find_qpc(art, qpc)
    device_ids = None if device_ids is None else check_device_ids(device_ids)
    ok = rt.QStatus.QS_SUCCESS
    where = art.name
    if device_ids:
        context = guarded(where, f"Context (devices {device_ids})", lambda: rt.Context(rt.QIDList(device_ids)))
        queue = guarded(where, f"Queue (device {device_ids[0]})", rt.Queue, context, device_ids[0])
    else:
        context = guarded(where, "Context", rt.Context)
        queue = guarded(where, "Queue (device 0)", rt.Queue, context, 0)
    qpc_obj = guarded(qpc_path, "Qpc (reading the program)", rt.Qpc, str(qpc_path))
    bindings, allowed, dtypes = guarded(qpc_path, "IO descriptor", _read_iodesc, art, qpc_path, qpc_obj, api, ok)
    index = _check_bindings(art, qpc_path, bindings, allowed)
    lb = bindings[index[LOGITS]]
    art = with_vocab(art, int(lb.dims[-1]), "QPC's logits binding")
    check_qpc_interface(art, qpc_path, bindings, allowed)
    props = rt.QAicProgramProperties()
    single = device_ids[0] if device_ids and len(device_ids) == 1 else None
    if device_ids and len(device_ids) > 1:
        props.devMapping = ":".join(map(str, device_ids))
    program = guarded(where, "Program", rt.Program, context, single, qpc_obj, props)
    loaded = QaicProgram(
        artifact=art, rt=rt, qpc_path=qpc_path, device_ids=device_ids, context=context, queue=queue,
        program=program, exec_obj=None, bindings=bindings, index=index, dtypes=dtypes, allowed=allowed,
        retained=[b.name for b in bindings if b.name.startswith("past_") or b.name.endswith("_RetainedState")],
        logits_type=dtypes[lb.type])
    loaded.check(guarded(where, "program load", program.load), "program load")
    loaded.check(guarded(where, "program activate", program.activate), "program activate")
    loaded.exec_obj = guarded(where, "ExecObj", rt.ExecObj, context, program)
    return loaded
