"""``manifest.json`` of an artifact directory (contract section 5): one record.

The artifact writer builds a ``Manifest`` and writes ``to_json()``; every
reader (the runtime's ``load_artifact``, ``verify``'s defaults, the CLIs, the
diff's notes) gets one from ``Manifest.read(directory)``. Reading is strict:
the JSON must be an object with exactly the keys below, each of its type;
anything else is a one-line ``SpecdecError`` naming the file. No other
spellings of a key are accepted.

The file is flat JSON, sorted keys, two-space indent; ``source`` is the one
nested object (``{"file": name, "sha256": hex}``), kept here as two fields.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from .. import __version__
from ..contract import MANIFEST_FILE, ROLES, TARGETS
from ..errors import SpecdecError

_INT, _STR, _INTS, _STRS, _DICT = "an integer", "a string", "a list of integers", "a list of strings", "an object"

#: JSON key -> (what its value is, may it be null); the record's fields in this order
SCHEMA: dict[str, tuple[str, bool]] = {
    "role": (_STR, False), "target": (_STR, False),
    "k": (_INT, True), "k_list": (_INTS, True),
    "prefill_len": (_INT, False), "ctx_len": (_INT, False), "batch_size": (_INT, False),
    "specializations": (_INTS, False),
    "num_layers": (_INT, True), "num_heads": (_INT, True), "num_kv_heads": (_INT, True),
    "head_dim": (_INT, True), "vocab_size": (_INT, True),
    "dtype": (_STR, True), "family": (_STR, True), "exporter": (_STR, True),
    "kv_dtype": (_STR, False), "logits_dtype": (_STR, True), "precision": (_STR, False),
    "num_cores": (_INT, False), "num_devices": (_INT, False), "hw_version": (_STR, True),
    "bos_token_id": (_INT, True), "eos_token_id": (_INT, True), "pad_token_id": (_INT, True),
    "eos_token_ids": (_INTS, True),
    "source": (_DICT, False), "passes": (_STRS, False), "ops": (_DICT, False),
    "tool_version": (_STR, False), "interface": (_DICT, False), "files": (_STRS, False),
}

#: keys written only when the artifact has them (contract sections 5 and 7): a TLM compiled with
#: --hidden-states, a feature draft compiled with --feature-layers, --interface qeff, and
#: --mxint8-kv-cache / --qaic-flag
OPTIONAL: dict[str, str] = {"hidden_states": _DICT, "feature_draft": _DICT, "qeff": _DICT,
                            "compile_options": _DICT}


@dataclass(frozen=True)
class Manifest:
    """What an artifact was built from and how; one field per key of ``manifest.json``
    (``source`` split into ``source_file`` and ``source_sha256``)."""

    role: str
    target: str
    k: int | None                        # TLM: the primary speculation length; DLM: None
    k_list: tuple[int, ...] | None       # TLM: every verification width, sorted; DLM: None
    prefill_len: int
    ctx_len: int
    batch_size: int
    specializations: tuple[int, ...]     # seq_len of each specialization, in file order
    num_layers: int | None
    num_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    vocab_size: int | None
    dtype: str | None
    family: str | None
    exporter: str | None
    kv_dtype: str
    logits_dtype: str | None
    precision: str
    num_cores: int
    num_devices: int
    hw_version: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    eos_token_ids: tuple[int, ...] | None
    source_file: str | None
    source_sha256: str | None
    passes: tuple[str, ...]
    ops: dict                            # qaic_ops.op_set of the graph
    tool_version: str
    interface: dict                      # artifacts.io_signature of the graph
    files: tuple[str, ...]               # every file of the directory, sorted
    hidden_states: dict | None = None    # TLM --hidden-states: layers, layer_indices, hidden_size, width, output
    feature_draft: dict | None = None    # feature draft: target_layers, width, input, draft_output, draft_width, pairing
    qeff: dict | None = None             # --interface qeff: (full_batch_size, batch_index) or batch_size, ...
    compile_options: dict | None = None  # mxint8_kv_cache, qaic_flags (passed to the compiler as given)

    def to_json(self) -> dict:
        """The JSON object ``manifest.json`` holds (lists for tuples)."""
        d = {}
        for key in SCHEMA:
            if key == "source":
                d[key] = {"file": self.source_file, "sha256": self.source_sha256}
            else:
                v = getattr(self, key)
                d[key] = list(v) if isinstance(v, tuple) else v
        for key in OPTIONAL:
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    def dumps(self) -> str:
        """The text of ``manifest.json``: sorted keys, so the same record gives the same bytes."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data, where: str | Path = MANIFEST_FILE) -> "Manifest":
        """The record of a parsed ``manifest.json``; one-line SpecdecError (naming ``where``) when
        a key is missing, unknown or of the wrong type, or the role, target or widths are impossible."""
        if not isinstance(data, dict):
            raise SpecdecError(f"{where}: expected a JSON object")
        missing = [k for k in SCHEMA if k not in data]
        if missing:
            raise SpecdecError(f"{where}: lacks {', '.join(missing)} (not written by this specdec-compile "
                               f"{__version__}: compile the artifact again)")
        unknown = sorted(k for k in data if k not in SCHEMA and k not in OPTIONAL)
        if unknown:
            raise SpecdecError(f"{where}: unknown key(s) {', '.join(unknown)}")
        values = {k: _checked(where, k, data[k], *SCHEMA[k]) for k in SCHEMA}
        source = values.pop("source")
        if set(source) != {"file", "sha256"} or not all(v is None or isinstance(v, str) for v in source.values()):
            raise SpecdecError(f"{where}: source is {source!r}, expected {{\"file\": name, \"sha256\": hex}}")
        extra = {k: _checked(where, k, data[k], kind, False) for k, kind in OPTIONAL.items() if k in data}
        m = cls(**values, source_file=source["file"], source_sha256=source["sha256"], **extra)
        m._check(where)
        return m

    @classmethod
    def read(cls, directory: str | Path) -> "Manifest":
        """The manifest of the artifact directory ``directory``, strictly checked."""
        path = Path(directory) / MANIFEST_FILE
        return cls.from_json(read_json(path, "the artifact manifest"), where=path)

    def _check(self, where) -> None:
        if self.role not in ROLES:
            raise SpecdecError(f"{where}: role is {self.role!r}, expected tlm or dlm")
        if self.target not in TARGETS:
            raise SpecdecError(f"{where}: target is {self.target!r}, expected one of {', '.join(TARGETS)}")
        for key in ("prefill_len", "ctx_len", "batch_size", "num_cores", "num_devices"):
            if getattr(self, key) < 1:
                raise SpecdecError(f"{where}: {key}={getattr(self, key)}, expected at least 1")
        if self.role == "dlm" and self.feature_draft is None and (self.k is not None or self.k_list is not None):
            raise SpecdecError(f"{where}: a DLM manifest has k={self.k}, k_list={self.k_list}; expected null")
        if self.hidden_states is not None and self.role != "tlm":
            raise SpecdecError(f"{where}: hidden_states belongs to a TLM manifest")
        if self.feature_draft is not None and self.role != "dlm":
            raise SpecdecError(f"{where}: feature_draft belongs to a DLM manifest")
        if self.qeff is not None:   # continuous batching records full_batch_size, the plain interface batch_size
            key = "full_batch_size" if "batch_index" in self.qeff else "batch_size"
            if self.qeff.get(key) != self.batch_size:
                raise SpecdecError(f"{where}: qeff.{key} {self.qeff.get(key)!r} is not batch_size {self.batch_size}")
        if self.role == "tlm" or self.feature_draft is not None:
            if self.k is None or self.k < 1:
                raise SpecdecError(f"{where}: k={self.k}, expected k >= 1")
            if not self.k_list or self.k not in self.k_list:
                raise SpecdecError(f"{where}: k_list {self.k_list} does not hold k={self.k}")


FIELDS = tuple(f.name for f in fields(Manifest))


def _checked(where, key: str, value, kind: str, nullable: bool):
    """``value`` if it is ``kind`` (or null where allowed), lists as tuples; else one line."""
    if value is None and nullable:
        return None
    ok = {
        _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
        _STR: lambda v: isinstance(v, str),
        _INTS: lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
        _STRS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        _DICT: lambda v: isinstance(v, dict),
    }[kind](value)
    if not ok:
        raise SpecdecError(f"{where}: {key} is {value!r}, expected {kind}{' or null' if nullable else ''}")
    return tuple(value) if isinstance(value, list) else value


def read_json(path: Path, what: str):
    """The parsed JSON file ``path`` (``what`` names it when missing); one-line errors, also for
    a FIFO or device, a file over ``io.MAX_TEXT_BYTES`` and JSON nested too deeply."""
    from ..model_io import read_json as _read
    if not path.exists():
        raise SpecdecError(f"{path}: missing ({what})")
    return _read(path, what)
