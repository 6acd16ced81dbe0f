"""What a manifest claims beyond its flat keys, checked before the runtime trusts it.

``manifest.Manifest.read`` checks each key's JSON type; the runtime also reads
the nested objects (``hidden_states``, ``feature_draft``) and allocates by the
sizes a manifest gives (``ctx_len``, ``batch_size``). A hand-edited manifest
must fail here with one line naming the key, not mid-run with a traceback or
with an allocation of a terabyte.
"""
from __future__ import annotations

from pathlib import Path

from ..contract import (BATCH_INDEX, DRAFT_HIDDEN_STATES, HIDDEN_STATES, INPUT_IDS, LOGITS, MANIFEST_FILE,
                        NUM_LOGITS_TO_KEEP, POSITION_IDS)
from ..errors import SpecdecError

#: the largest sizes a manifest may claim: far above any model served today, far below what
#: would make the runtime allocate without bound (a cache is batch x ctx_len x heads x dims)
MAX_CTX_LEN = 1 << 22
MAX_BATCH = 1 << 12
MAX_WIDTH = 1 << 20
#: the names an extra tensor may not take: the contract's own
_CORE = (INPUT_IDS, POSITION_IDS, LOGITS, BATCH_INDEX, NUM_LOGITS_TO_KEEP)


def _int(where, key: str, v, lo: int = 1, hi: int = MAX_WIDTH) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SpecdecError(f"{where}: {key} is {v!r}, expected an integer in [{lo}, {hi}]")
    return v


def _ints(where, key: str, v, lo: int = -MAX_WIDTH, hi: int = MAX_WIDTH) -> list[int]:
    if not isinstance(v, list) or not v or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
        raise SpecdecError(f"{where}: {key} is {v!r}, expected a non-empty list of integers")
    for x in v:
        _int(where, key, x, lo, hi)
    return v


def _name(where, key: str, v, default: str) -> str:
    if v is None:
        return default
    if not isinstance(v, str) or not v or v in _CORE or v.startswith(("past_key", "past_value")) \
            or v.endswith("_RetainedState"):
        raise SpecdecError(f"{where}: {key} is {v!r}, expected the name of an extra tensor (not logits, "
                           f"the ids, positions or a cache buffer)")
    return v


def _record(where, key: str, v) -> dict:
    if not isinstance(v, dict):
        raise SpecdecError(f"{where}: {key} is {v!r}, expected an object")
    return v


def check_sizes(p: Path, m) -> None:
    """The sizes the runtime allocates by, bounded."""
    where = p / MANIFEST_FILE
    _int(where, "ctx_len", m.ctx_len, 1, MAX_CTX_LEN)
    _int(where, "batch_size", m.batch_size, 1, MAX_BATCH)
    _int(where, "prefill_len", m.prefill_len, 1, MAX_CTX_LEN)
    for key in ("num_layers", "num_kv_heads", "head_dim", "vocab_size"):
        if getattr(m, key) is not None:
            _int(where, key, getattr(m, key), 1, 1 << 24)


def check_records(p: Path, m) -> None:
    """``hidden_states`` (a TLM's) and ``feature_draft`` (a feature draft's), each key named when wrong."""
    where = p / MANIFEST_FILE
    if m.hidden_states is not None:
        hs = _record(where, "hidden_states", m.hidden_states)
        n = m.num_layers
        _ints(where, "hidden_states.layers", hs.get("layers"))
        idx = _ints(where, "hidden_states.layer_indices", hs.get("layer_indices"), 0,
                    (n - 1) if n else MAX_WIDTH)
        if len(idx) != len(hs["layers"]):
            raise SpecdecError(f"{where}: hidden_states.layer_indices {idx} do not match hidden_states.layers "
                               f"{hs['layers']}")
        _int(where, "hidden_states.width", hs.get("width"))
        if hs.get("hidden_size") is not None:
            _int(where, "hidden_states.hidden_size", hs.get("hidden_size"))
        _name(where, "hidden_states.output", hs.get("output"), HIDDEN_STATES)
    if m.feature_draft is not None:
        fd = _record(where, "feature_draft", m.feature_draft)
        _ints(where, "feature_draft.target_layers", fd.get("target_layers"))
        width = _int(where, "feature_draft.width", fd.get("width"))
        _int(where, "feature_draft.draft_width", fd.get("draft_width"))
        for key in ("target_width", "own_offset"):    # an EAGLE-3 head's: a slice of the input
            if fd.get(key) is not None:
                _int(where, f"feature_draft.{key}", fd[key], 1, width)
        inp = _name(where, "feature_draft.input", fd.get("input"), HIDDEN_STATES)
        out = _name(where, "feature_draft.draft_output", fd.get("draft_output"), DRAFT_HIDDEN_STATES)
        if inp == out:
            raise SpecdecError(f"{where}: feature_draft.input and feature_draft.draft_output are both {inp!r}")
        target = fd.get("target")
        if target is not None and (not isinstance(target, dict)
                                   or not all(isinstance(target.get(k), (str, type(None))) for k in ("file", "sha256"))):
            raise SpecdecError(f"{where}: feature_draft.target is {target!r}, expected {{\"file\": name, "
                               f"\"sha256\": hex}}")


def check_interface(p: Path, m) -> None:
    """What the manifest says of the cache against its own ``interface`` record (the graph's
    inputs and outputs as written): ``num_layers`` is the count of ``past_key.{i}`` inputs (the
    runtime resolves negative feature layers by it), and an ort or openvino artifact's
    ``kv_dtype`` is their dtype."""
    where = p / MANIFEST_FILE
    inputs = m.interface.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(s, dict) and isinstance(s.get("name"), str)
                                               for s in inputs):
        raise SpecdecError(f"{where}: interface.inputs is not a list of {{\"name\", \"dtype\", \"shape\"}} objects")
    past = [s for s in inputs if s["name"].startswith("past_")]
    keys = sum(s["name"].startswith("past_key.") for s in past)
    if m.num_layers is not None and keys and keys != m.num_layers:
        raise SpecdecError(f"{where}: num_layers is {m.num_layers}, but the interface has {keys} past_key inputs")
    dtypes = sorted({str(s.get("dtype")) for s in past})
    if m.target != "qaic" and past and dtypes != [m.kv_dtype]:
        raise SpecdecError(f"{where}: kv_dtype is {m.kv_dtype!r}, but the {m.target} graph's cache inputs are "
                           f"{', '.join(dtypes)}")


def check_digests(p: Path, m) -> None:
    """Every file the manifest's ``digests`` names is in ``p`` with that sha256: a file changed,
    damaged or swapped after the compile wrote it (a ``model.onnx`` of the same shapes but other
    weights) is refused in one line. An artifact written before digests were recorded has none:
    nothing is checked."""
    from ..model_io import sha256_file
    if m.digests is None:
        return
    root = p.resolve()
    for name, want in sorted(m.digests.items()):
        f = p / name
        if Path(name).is_absolute() or ".." in Path(name).parts or root not in f.resolve().parents:
            raise SpecdecError(f"{p / MANIFEST_FILE}: digests name {name!r}, a file outside the artifact")
        if not f.is_file():
            raise SpecdecError(f"{f}: missing or not a regular file (the manifest records its sha256)")
        got = sha256_file(f)
        if got != want:
            raise SpecdecError(f"{f}: sha256 {got[:16]}..., but the manifest records {want[:16]}... (changed "
                               f"since specdec-compile wrote it: compile the artifact again)")
