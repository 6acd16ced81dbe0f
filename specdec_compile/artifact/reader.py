"""Reading an artifact directory (contract section 5) for the runtime.

An artifact directory holds ``model.onnx`` (plus its external data),
``specializations.json`` and ``manifest.json``; a qaic one also ``custom_io.yaml``
and ``compile.sh``, and for the Cloud AI 100 backend a QPC directory. The runtime
needs from it: the role, the lowering target, the specializations (batch,
prefill length, context length, the compiled seq_lens) and, for a TLM, the
speculation length(s). Everything is checked here, once, so that a bad
artifact fails with one line before any model is loaded.

The manifest is read strictly (``specdec_compile.artifact.manifest.Manifest.read``) and
checked against ``specializations.json``, which is the source of truth for
shapes: it is what ``qaic-exec`` compiles and what the device enforces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..contract import (BATCH_INDEX, DRAFT_HIDDEN_STATES, HIDDEN_STATES, INPUT_IDS, MANIFEST_FILE, MODEL_FILE, ROLES,
                        SPECIALIZATIONS_FILE)
from ..errors import SpecdecError
from .manifest import Manifest, read_json
from .records import check_interface, check_records, check_sizes


def _as_int(value, what: str, where: Path) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            value = value.strip()
        i = int(value)
        if isinstance(value, float) and value != i:
            raise ValueError
    except (TypeError, ValueError):
        raise SpecdecError(f"{where}: {what} is {value!r}, expected an integer") from None
    return i


@dataclass(frozen=True)
class Artifact:
    """What the runtime knows about one artifact directory."""

    path: Path
    role: str
    target: str
    batch_size: int
    ctx_len: int
    prefill_len: int
    seq_lens: tuple[int, ...]          # every compiled seq_len, sorted
    k: int | None = None               # TLM: primary speculation length
    k_list: tuple[int, ...] = ()       # TLM: every verification width (drafts per round)
    vocab_size: int | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    eos_token_id: int | None = None
    embedding_rows: int | None = None  # ids the model reads, when known apart from the logits width
    #: --interface qeff (contract section 7): a TLM's calls take num_logits_to_keep; seq_lens are
    #: then the decode widths and ``call_shapes`` every compiled (batch, seq_len).
    #: ``cache_rows``: its continuous batching (--full-batch-size): calls take batch_index (the
    #: cache rows), the prefill runs at batch 1
    qeff: bool = False
    cache_rows: bool = False
    call_shapes: tuple[tuple[int, int], ...] = ()
    manifest: dict = field(default_factory=dict, compare=False, repr=False)   # the manifest's JSON
    record: Manifest | None = field(default=None, compare=False, repr=False)  # None: built by hand (tests)

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def name(self) -> str:
        return f"{self.role.upper()} artifact {self.path}"

    @property
    def hidden_states(self) -> dict | None:
        """A TLM compiled with --hidden-states: its manifest's ``hidden_states`` record."""
        return self.manifest.get("hidden_states") if self.role == "tlm" else None

    @property
    def feature_draft(self) -> dict | None:
        """A feature draft (DLM compiled with --feature-layers): its manifest's ``feature_draft`` record."""
        return self.manifest.get("feature_draft") if self.role == "dlm" else None

    @property
    def extra_inputs(self) -> dict[str, int]:
        """Inputs beyond the contract's core (name -> width of the last axis): a feature draft's features."""
        fd = self.feature_draft
        return {fd.get("input", HIDDEN_STATES): int(fd["width"])} if fd else {}

    @property
    def extra_outputs(self) -> dict[str, int]:
        """Outputs beyond logits and the cache (name -> width): a TLM's hidden states, a
        feature draft's own predicted features; [batch, seq_len, width] each."""
        hs, fd = self.hidden_states, self.feature_draft
        if hs:
            return {hs.get("output", HIDDEN_STATES): int(hs["width"])}
        if fd:
            return {fd.get("draft_output", DRAFT_HIDDEN_STATES): int(fd["draft_width"])}
        return {}

    def shapes(self) -> list[tuple[int, int]]:
        """The (batch_size, seq_len) pairs a call may use."""
        if self.call_shapes:
            return list(self.call_shapes)
        return [(self.batch_size, s) for s in self.seq_lens]

    @property
    def prefill_batch(self) -> int:
        """The rows of a prefill call: 1 for --interface qeff (one prompt into its cache row), else all."""
        return next((b for b, s in self.shapes() if s == self.prefill_len), self.batch_size)

    def check_call(self, batch: int, seq_len: int) -> None:
        if (batch, seq_len) not in self.shapes():
            allowed = ", ".join(f"[{b}, {s}]" for b, s in self.shapes())
            raise SpecdecError(f"{self.name}: a call of shape [{batch}, {seq_len}] matches no "
                               f"specialization (compiled: {allowed})")


_PASS_IDS = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten")


def embedding_rows(model_path: Path) -> int | None:
    """Rows of the embedding table that ``input_ids`` index, read from the graph
    (weights not loaded); None when no Gather of a 2-D initializer by the ids shows.

    A draft whose LM head keeps only the first rows of the table still reads every
    id its embedding has; this tells the runtime how many that is.
    """
    from ..model_io import load_model

    graph = load_model(model_path).graph
    tables = {t.name: t for t in graph.initializer if len(t.dims) == 2}
    ids = {INPUT_IDS}
    rows = []
    for node in graph.node:                     # ONNX graphs are topologically sorted
        if node.op_type in _PASS_IDS and node.input and node.input[0] in ids:
            ids.update(node.output)
        elif (node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ids
              and node.input[0] in tables and all(a.i == 0 for a in node.attribute if a.name == "axis")):
            rows.append(int(tables[node.input[0]].dims[0]))
    return min(rows) if rows else None


def read_specializations(path: Path) -> list[dict]:
    data = read_json(path, "the specialization file")
    specs = data.get("specializations") if isinstance(data, dict) else None
    if not isinstance(specs, list) or not specs:
        raise SpecdecError(f"{path}: expected {{\"specializations\": [...]}} with at least one entry")
    out = []
    for i, s in enumerate(specs):
        if not isinstance(s, dict):
            raise SpecdecError(f"{path}: specialization {i} is not an object")
        missing = [k for k in ("batch_size", "seq_len", "ctx_len") if k not in s]
        if missing:
            raise SpecdecError(f"{path}: specialization {i} lacks {', '.join(missing)}")
        e = {k: _as_int(s[k], f"specialization {i} {k}", path) for k in ("batch_size", "seq_len", "ctx_len")}
        if min(e.values()) < 1:
            raise SpecdecError(f"{path}: specialization {i} has a non-positive value {e}")
        if e["seq_len"] > e["ctx_len"]:
            raise SpecdecError(f"{path}: specialization {i} has seq_len {e['seq_len']} above ctx_len {e['ctx_len']}")
        out.append(e)
    return out


def _read_dir(p: Path) -> tuple[Manifest, list[dict]]:
    """The manifest and the specializations of artifact directory ``p``."""
    if not p.exists():
        raise SpecdecError(f"{p}: no such artifact directory")
    if not p.is_dir():
        raise SpecdecError(f"{p}: not a directory (expected an artifact directory from specdec-compile)")
    try:
        m = Manifest.read(p)
    except RecursionError:   # json nests objects by recursion
        raise SpecdecError(f"{p / MANIFEST_FILE}: nested too deeply to be a manifest") from None
    check_sizes(p, m)
    check_records(p, m)
    check_interface(p, m)
    try:
        specs = read_specializations(p / SPECIALIZATIONS_FILE)
    except RecursionError:
        raise SpecdecError(f"{p / SPECIALIZATIONS_FILE}: nested too deeply to be a specialization file") from None
    return m, specs


def check_expect_role(expect_role) -> None:
    """``expect_role`` is None or a role (contract.ROLES); anything else is the caller's mistake, not
    the artifact's: a ValueError naming the roles, not a message about the artifact's role."""
    if expect_role is not None and (not isinstance(expect_role, str) or expect_role not in ROLES):
        raise ValueError(f"expect_role must be one of {', '.join(map(repr, ROLES))} or None (got {expect_role!r})")


def _check_role(p: Path, m: Manifest, expect_role: str | None) -> None:
    if expect_role and m.role != expect_role:
        raise SpecdecError(f"{p}: is a {m.role.upper()} artifact, expected a {expect_role.upper()} "
                           f"(were --tlm and --dlm swapped?)")


def check_listed_seq_lens(p: Path, m: Manifest, specs: list[dict]) -> None:
    """The manifest's ``specializations`` (seq_lens in file order) are the file's: verify and pair
    read the manifest's list."""
    listed = [s["seq_len"] for s in specs]
    if m.specializations and list(m.specializations) != listed:
        raise SpecdecError(f"{p}: {MANIFEST_FILE} lists the seq_lens {list(m.specializations)} but "
                           f"{SPECIALIZATIONS_FILE} has {listed}")


def _shapes(p: Path, m: Manifest, specs: list[dict]) -> tuple[int, int, int, tuple[int, ...]]:
    """(batch size, context length, prefill length, compiled seq_lens), checked against the manifest."""
    where = p / SPECIALIZATIONS_FILE
    batches = {s["batch_size"] for s in specs}
    ctxs = {s["ctx_len"] for s in specs}
    if len(batches) != 1:
        raise SpecdecError(f"{where}: batch_size differs between specializations ({sorted(batches)})")
    if len(ctxs) != 1:
        raise SpecdecError(f"{where}: ctx_len differs between specializations ({sorted(ctxs)})")
    B, CL = batches.pop(), ctxs.pop()
    seq_lens = tuple(sorted({s["seq_len"] for s in specs}))
    check_listed_seq_lens(p, m, specs)
    for key, value in (("batch_size", B), ("ctx_len", CL)):
        if getattr(m, key) != value:
            raise SpecdecError(f"{p}: {MANIFEST_FILE} says {key}={getattr(m, key)} but {SPECIALIZATIONS_FILE} "
                               f"says {value}")
    PL = m.prefill_len
    if PL not in seq_lens:
        raise SpecdecError(f"{p}: prefill length {PL} is not a compiled seq_len {list(seq_lens)}")
    if PL > CL:
        raise SpecdecError(f"{p}: prefill length {PL} exceeds the context length {CL}")
    return B, CL, PL, seq_lens


def _load_qeff(p: Path, m: Manifest, specs: list[dict], need_model: bool) -> Artifact:
    """An --interface qeff artifact (contract section 7): its prefill, then its decodes at batch B;
    with continuous batching (``batch_index``) the prefill at batch 1. A DLM decodes at seq_len 1
    only (the loop ingests two tokens in two calls)."""
    where = p / SPECIALIZATIONS_FILE
    cb = BATCH_INDEX in m.qeff
    B, CL, PL = m.batch_size, m.ctx_len, m.prefill_len
    shapes = tuple((s["batch_size"], s["seq_len"]) for s in specs)
    if {s["ctx_len"] for s in specs} != {CL}:
        raise SpecdecError(f"{where}: ctx_len is not {CL} ({MANIFEST_FILE}) in every specialization")
    first = (1 if cb and PL != 1 else B, PL)
    if not shapes or shapes[0] != first or any(b != B for b, _ in shapes[1:]):
        raise SpecdecError(f"{where}: expected QEfficient's prefill {list(first)} then decodes at batch {B}, "
                           f"got {[list(x) for x in shapes]}")
    decodes = tuple(sorted({s for _, s in shapes[1:]}))
    seq_lens = tuple(sorted({s for b, s in shapes if b == B}))    # the plain interface's prefill too
    if m.role == "dlm":
        if decodes != (1,) and not (PL == 1 and not decodes):   # plain at PL 1: the prefill is the decode
            raise SpecdecError(f"{where}: a --interface qeff DLM decodes at seq_len 1, got {list(decodes)}")
        k, k_list = None, ()
    else:
        k, k_list = _tlm_widths(p, m, decodes, CL, need_k=False)
    if need_model and not (p / MODEL_FILE).is_file():
        raise SpecdecError(f"{p / MODEL_FILE}: missing (the rewritten graph)")
    return Artifact(path=p, role=m.role, target=m.target, batch_size=B, ctx_len=CL, prefill_len=PL,
                    seq_lens=seq_lens, k=k, k_list=k_list, vocab_size=m.vocab_size, num_layers=m.num_layers,
                    num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, eos_token_id=m.eos_token_id,
                    manifest=m.to_json(), record=m, qeff=True, cache_rows=cb, call_shapes=shapes)


def _tlm_widths(p: Path, m: Manifest, seq_lens: tuple[int, ...], CL: int,
                need_k: bool = True) -> tuple[int, tuple[int, ...]]:
    """A TLM's speculation length k and every verification width it serves (k_list), each compiled.
    ``need_k``: seq_len k (the first verification of section 6) must be compiled too."""
    where = p / SPECIALIZATIONS_FILE
    k, k_list = m.k, tuple(sorted(set(m.k_list) | {m.k}))
    if need_k and k not in seq_lens:
        raise SpecdecError(f"{where}: the TLM needs seq_len=k={k} for the first verification "
                           f"(has {list(seq_lens)})")
    for j in k_list:
        if j < 0 or j + 1 not in seq_lens:
            raise SpecdecError(f"{where}: the TLM needs seq_len={j + 1} to verify {j} drafts "
                               f"(has {list(seq_lens)})")
    if k + 1 > CL:
        raise SpecdecError(f"{p}: k+1={k + 1} exceeds the context length {CL}")
    return k, k_list


def load_artifact(path, expect_role: str | None = None, need_model: bool = True) -> Artifact:
    """Read and check the artifact directory ``path``.

    ``expect_role`` ("tlm"/"dlm") makes a role mismatch an error (another value: ValueError);
    ``need_model`` requires ``model.onnx`` (the ONNX Runtime backend needs it,
    the Cloud AI 100 backend needs the QPC instead).
    """
    check_expect_role(expect_role)
    p = Path(path)
    m, specs = _read_dir(p)
    _check_role(p, m, expect_role)
    if m.qeff is not None:
        return _load_qeff(p, m, specs, need_model)
    B, CL, PL, seq_lens = _shapes(p, m, specs)
    k, k_list = None, ()
    if m.role == "dlm":
        # a feature draft ingests a round's accepted tokens in k+1 (or PL) and drafts at 1
        for s in ((1,) if m.feature_draft is not None else (1, 2)):
            if s not in seq_lens:
                raise SpecdecError(f"{p / SPECIALIZATIONS_FILE}: a DLM needs a seq_len={s} specialization "
                                   f"(has {list(seq_lens)})")
    else:
        k, k_list = _tlm_widths(p, m, seq_lens, CL)
    if need_model and not (p / MODEL_FILE).is_file():
        raise SpecdecError(f"{p / MODEL_FILE}: missing (the rewritten graph)")
    return Artifact(path=p, role=m.role, target=m.target, batch_size=B, ctx_len=CL, prefill_len=PL,
                    seq_lens=seq_lens, k=k, k_list=k_list, vocab_size=m.vocab_size,
                    num_layers=m.num_layers, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                    eos_token_id=m.eos_token_id, manifest=m.to_json(), record=m)
