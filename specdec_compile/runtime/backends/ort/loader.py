"""Loading for ONNX Runtime: a session, and the checked interface of a rewritten graph.

Sessions come from ``ort_session.create_session`` (shared with ``verify``); ``load_ort`` opens an artifact and checks
that its graph has the contract's interface (section 2), returning an
``OrtModel`` that the runner binds and runs. Nothing here runs the model.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ....contract import BATCH_INDEX, INPUT_IDS, LOGITS, NUM_LOGITS_TO_KEEP, POSITION_IDS
from ....errors import SpecdecError
from ....artifact.reader import Artifact
from ....ort_session import CPU, CUDA, create_session, default_providers, threads_from_env  # noqa: F401 (re-exported)
from ..base import resolve_artifact, with_vocab

ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bfloat16)": None,
}
#: environment variable giving the intra-op thread count when none is asked for
THREADS_ENV = "SPECDEC_ORT_THREADS"


def kv_names(names) -> list[str]:
    """The ``past_key.{i}`` / ``past_value.{i}`` names among ``names``, by layer then kind."""
    past = [n for n in names if n.startswith("past_key.") or n.startswith("past_value.")]

    def key(n):
        kind, _, i = n.partition(".")
        return (int(i) if i.isdigit() else 1 << 30, kind)
    return sorted(past, key=key)


@dataclass
class OrtModel:
    """A loaded, checked artifact: what the runner needs to bind and run it."""

    artifact: Artifact
    session: object
    providers: list[str]
    device: str                         # "cpu" or "cuda"
    device_id: int
    kv_names: list[str]
    kv_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    kv_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    logits_dtype: np.dtype = np.dtype(np.float32)
    input_dtypes: dict[str, np.dtype] = field(default_factory=dict)   # extra inputs (a feature draft's features)


def _check_names(path: Path, ins: dict, outs: dict, art: Artifact) -> list[str]:
    """The cache inputs of a graph with the contract's names (and the extra inputs and
    outputs its manifest declares); raises for anything else."""
    for need in (INPUT_IDS, POSITION_IDS):
        if need not in ins:
            raise SpecdecError(f"{path}: no {need!r} input; not a graph rewritten by specdec-compile")
    if LOGITS not in outs:
        raise SpecdecError(f"{path}: no 'logits' output")
    kv = kv_names(list(ins))
    qeff = ({BATCH_INDEX} if art.cache_rows else set()) | ({NUM_LOGITS_TO_KEEP} if art.qeff else set())
    extra = sorted(set(ins) - {INPUT_IDS, POSITION_IDS} - set(kv) - set(art.extra_inputs) - qeff)
    if extra:
        raise SpecdecError(f"{path}: unexpected inputs {extra}; the contract allows only "
                           f"input_ids, position_ids and past_key/past_value (and a feature draft's features)")
    lacking = sorted(qeff - set(ins) - ({NUM_LOGITS_TO_KEEP} if art.role == "dlm" else set()))
    if lacking:   # a manifest that says --interface qeff over a graph without its inputs
        raise SpecdecError(f"{path}: the manifest says --interface qeff but the graph has no {lacking[0]!r} "
                           f"input; the manifest does not describe this graph")
    for names, what, have in ((art.extra_inputs, "input", ins), (art.extra_outputs, "output", outs)):
        for n in names:
            if n not in have:
                raise SpecdecError(f"{path}: the manifest declares the {what} {n!r} but the graph has none")
    if not kv:
        raise SpecdecError(f"{path}: no past_key.{{i}} / past_value.{{i}} inputs")
    for n in kv:
        if f"{n}_RetainedState" not in outs:
            raise SpecdecError(f"{path}: input {n} has no {n}_RetainedState output")
    return kv


def _check_role_shape(art: Artifact, ins: dict, outs: dict) -> None:
    """The manifest's role against the graph's logits: a TLM's are [B, S, V] (every position), a
    DLM's [B, 1, V]. A relabelled manifest would otherwise run and decode wrong tokens."""
    shape, seq = list(outs[LOGITS].shape), list(ins[INPUT_IDS].shape)
    if len(shape) != 3:
        raise SpecdecError(f"{art.model_path}: logits has rank {len(shape)} ({shape}), expected [batch, seq, vocab]")
    s, per_position = shape[1], len(seq) == 2 and shape[1] == seq[1] and shape[1] != 1
    if art.role == "dlm" and (per_position or (isinstance(s, int) and s != 1)):
        raise SpecdecError(f"{art.model_path}: the manifest says role dlm but the graph's logits are {shape}, one row "
                           f"per position: a TLM's (a DLM gives [batch, 1, vocab]); the manifest does not describe "
                           f"this graph")
    if art.role == "tlm" and s == 1 and max(art.seq_lens) > 1:
        raise SpecdecError(f"{art.model_path}: the manifest says role tlm but the graph's logits are {shape}, the last "
                           f"token only: a DLM's (a TLM gives [batch, seq_len, vocab]); the manifest does not "
                           f"describe this graph")
    for names, have in ((art.extra_inputs, ins), (art.extra_outputs, outs)):
        for n, width in names.items():
            last = (list(have[n].shape) or [None])[-1]
            if isinstance(last, int) and last != width:
                raise SpecdecError(f"{art.model_path}: the manifest says {n} is {width} wide but the graph's is "
                                   f"{last}; the manifest does not describe this graph")


def _cache_geometry(art: Artifact, name: str, arg) -> tuple[tuple[int, ...], np.dtype]:
    """Shape [batch_size, n_kv_heads, ctx_len, head_dim] and dtype of cache input ``arg``."""
    path = art.model_path
    shape = list(arg.shape)
    if len(shape) != 4:
        raise SpecdecError(f"{path}: {name} has rank {len(shape)}, expected 4")
    fixed = [art.batch_size, shape[1], art.ctx_len, shape[3]]
    for dim, (val, what) in enumerate(zip(shape, ("batch_size", "n_kv_heads", "ctx_len", "head_dim"))):
        if isinstance(val, int) and val != fixed[dim] and dim in (0, 2):
            raise SpecdecError(f"{path}: {name} has {what}={val} but the specializations say {fixed[dim]}")
    for dim, what in ((1, "num_kv_heads"), (3, "head_dim")):
        claim = getattr(art, what)
        if not isinstance(fixed[dim], int):
            fixed[dim] = claim
        elif claim is not None and claim != fixed[dim]:
            raise SpecdecError(f"{path}: {name} has {what}={fixed[dim]} but the manifest says {claim}")
    if not all(isinstance(d, int) and d > 0 for d in fixed):
        raise SpecdecError(f"{path}: cannot tell the cache shape of {name} ({shape})")
    dt = ORT_TYPES.get(arg.type)
    if dt is None:
        raise SpecdecError(f"{path}: {name} has type {arg.type}, not supported by this runtime")
    return tuple(fixed), np.dtype(dt)


def _check_cache_fits(art: Artifact, shapes: dict, dtypes: dict) -> None:
    """The cache the manifest's sizes ask for (twice, for the swap path) must fit in this host's memory."""
    need = 2 * sum(int(np.prod(s, dtype=np.float64)) * dtypes[n].itemsize for n, s in shapes.items())
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return
    if have > 0 and need > have:
        raise SpecdecError(f"{art.path}: its cache (batch {art.batch_size}, ctx_len {art.ctx_len}) needs "
                           f"{need / 2 ** 30:.1f} GiB, more than this host's {have / 2 ** 30:.1f} GiB")


def check_interface(art: Artifact, ins: dict, outs: dict) -> tuple[list[str], dict, dict]:
    """The graph's inputs and outputs (name -> an arg with ``shape`` and ONNX ``type``) against the
    contract and the manifest: (cache input names, their shapes, their dtypes); the cache must fit
    in memory. Shared by every backend that reads the graph's interface (ONNX Runtime, OpenVINO)."""
    kv = _check_names(art.model_path, ins, outs, art)
    _check_role_shape(art, ins, outs)
    shapes, dtypes = {}, {}
    for n in kv:
        shapes[n], dtypes[n] = _cache_geometry(art, n, ins[n])
    _check_cache_fits(art, shapes, dtypes)
    return kv, shapes, dtypes


def _check_cache_writes(art: Artifact) -> None:
    """The graph still writes its cache the target's way (no optimizer inlined CtxScatter since)."""
    from ....artifact.cache_writes import check_cache_writes
    from ....model_io import load_model
    check_cache_writes(load_model(art.model_path), art.target, str(art.model_path))


def load_ort(artifact, *, providers=None, device_id: int = 0, expect_role: str | None = None,
             session_options=None, intra_op_threads: int | None = None) -> OrtModel:
    """Open an artifact (directory or ``Artifact``) in ONNX Runtime and check its interface."""
    art = resolve_artifact(artifact, expect_role, need_model=True)
    if isinstance(device_id, bool) or not isinstance(device_id, numbers.Integral) or device_id < 0:
        raise SpecdecError(f"{art.name}: device_id must be a CUDA device number >= 0, got {device_id!r}")
    if intra_op_threads is None and not (session_options is not None and
                                         getattr(session_options, "intra_op_num_threads", 0)):
        intra_op_threads = threads_from_env(THREADS_ENV)    # when the caller asked for no count
    session = create_session(art.model_path, providers=providers, session_options=session_options,
                             intra_op_threads=intra_op_threads)
    providers = session.get_providers()     # what it runs (ONNX Runtime drops a provider it cannot start)
    if providers[0] != CUDA and device_id:
        raise SpecdecError(f"{art.name}: device_id {device_id} names a CUDA device, but the session runs on "
                           f"{providers[0]}")
    _check_cache_writes(art)
    ins = {i.name: i for i in session.get_inputs()}
    outs = {o.name: o for o in session.get_outputs()}
    kv, shapes, dtypes = check_interface(art, ins, outs)
    lshape = outs[LOGITS].shape
    vocab = lshape[-1] if lshape and isinstance(lshape[-1], int) else None
    device = "cuda" if providers[0] == CUDA else "cpu"
    return OrtModel(artifact=with_vocab(art, vocab, "graph's logits"), session=session, providers=providers,
                    device=device, device_id=device_id if device == "cuda" else 0, kv_names=kv,
                    kv_shapes=shapes, kv_dtypes=dtypes,
                    logits_dtype=np.dtype(ORT_TYPES.get(outs[LOGITS].type) or np.float32),
                    input_dtypes={n: np.dtype(ORT_TYPES.get(ins[n].type) or np.float32) for n in art.extra_inputs})

