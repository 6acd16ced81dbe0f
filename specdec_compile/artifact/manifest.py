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
    "kv_dtype": (_STR, False), "logits_dtype": (_STR, True), "precision": (_STR, True),
    "num_cores": (_INT, True), "num_devices": (_INT, True), "hw_version": (_STR, True),
    "bos_token_id": (_INT, True), "eos_token_id": (_INT, True), "pad_token_id": (_INT, True),
    "eos_token_ids": (_INTS, True),
    "source": (_DICT, False), "passes": (_STRS, False), "ops": (_DICT, False),
    "tool_version": (_STR, False), "interface": (_DICT, False), "files": (_STRS, False),
}

#: keys written only when the artifact has them (contract sections 5 and 7): a TLM compiled with
#: --hidden-states, a feature draft compiled with --feature-layers, --interface qeff,
#: --mxint8-kv-cache / --qaic-flag, and the sha256 of every other file (``digests``; older
#: artifacts lack it)
OPTIONAL: dict[str, str] = {"hidden_states": _DICT, "feature_draft": _DICT, "qeff": _DICT,
                            "compile_options": _DICT, "digests": _DICT}

#: the options only the Cloud AI 100 compiler reads: recorded for a qaic artifact, null for the others
QAIC_KEYS = ("precision", "num_cores", "num_devices", "hw_version", "logits_dtype")


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
    kv_dtype: str                        # qaic: the custom IO's cache precision; ort/openvino: the graph's cache dtype
    logits_dtype: str | None
    precision: str | None                # QAIC_KEYS: null unless target is qaic
    num_cores: int | None
    num_devices: int | None
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
    digests: dict | None = None          # file name -> sha256, every file of ``files`` but manifest.json

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
        self._check_compile_keys(where)
        for key in ("prefill_len", "ctx_len", "batch_size"):
            if getattr(self, key) < 1:
                raise SpecdecError(f"{where}: {key}={getattr(self, key)}, expected at least 1")
        if self.digests is not None:
            self._check_digests(where)
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

    def _check_compile_keys(self, where) -> None:
        """A qaic artifact records the compile's precision and counts; an ort or openvino one
        records none of them (its graph runs at its own dtypes, on no Cloud AI 100 cores)."""
        if self.target != "qaic":
            given = next((k for k in QAIC_KEYS if getattr(self, k) is not None), None)
            if given is not None:
                raise SpecdecError(f"{where}: {given} is {getattr(self, given)!r}, an option of the Cloud AI 100 "
                                   f"compiler, on an {self.target} artifact (expected null: its graph has no such "
                                   f"setting; an older specdec-compile wrote one, so compile the artifact again)")
            return
        if self.precision is None:
            raise SpecdecError(f"{where}: precision is null, expected the compile's (fp16 or mx6)")
        for key in ("num_cores", "num_devices"):
            if getattr(self, key) is None or getattr(self, key) < 1:
                raise SpecdecError(f"{where}: {key}={getattr(self, key)}, expected at least 1")

    def _check_digests(self, where) -> None:
        listed = set(self.files) - {MANIFEST_FILE}
        if set(self.digests) != listed:
            raise SpecdecError(f"{where}: digests name {sorted(self.digests)}, expected the files "
                               f"{sorted(listed)}")
        bad = next((k for k, v in self.digests.items()
                    if not isinstance(v, str) or len(v) != 64 or set(v) - set("0123456789abcdef")), None)
        if bad is not None:
            raise SpecdecError(f"{where}: digests[{bad!r}] is {self.digests[bad]!r}, expected a sha256 (64 hex digits)")


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
