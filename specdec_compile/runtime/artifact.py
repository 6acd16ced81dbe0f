"""Reading an artifact directory (contract section 5) for the runtime.

An artifact directory holds ``model.onnx`` (plus its external data),
``specializations.json``, ``manifest.json``, ``custom_io.yaml`` and
``compile.sh``; for the Cloud AI 100 backend also a QPC directory. The runtime
needs from it: the role, the lowering target, the specializations (batch,
prefill length, context length, the compiled seq_lens) and, for a TLM, the
speculation length(s). Everything is checked here, once, so that a bad
artifact fails with one line before any model is loaded.

The manifest is read strictly (``specdec_compile.manifest.Manifest.read``) and
checked against ``specializations.json``, which is the source of truth for
shapes: it is what ``qaic-exec`` compiles and what the device enforces.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..contract import DRAFT_HIDDEN_STATES, HIDDEN_STATES, INPUT_IDS, MANIFEST_FILE, MODEL_FILE, SPECIALIZATIONS_FILE
from ..errors import SpecdecError
from ..manifest import Manifest, read_json


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
    #: --interface qeff (contract section 7): calls take batch_index (the cache rows), a TLM
    #: num_logits_to_keep; seq_lens are then the decode widths (at batch_size = full_batch_size)
    #: and ``call_shapes`` every compiled (batch, seq_len), the prefill's at batch 1
    qeff: bool = False
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
    from ..io import load_model

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
        out.append(e)
    return out


def _read_dir(p: Path) -> tuple[Manifest, list[dict]]:
    """The manifest and the specializations of artifact directory ``p``."""
    if not p.exists():
        raise SpecdecError(f"{p}: no such artifact directory")
    if not p.is_dir():
        raise SpecdecError(f"{p}: not a directory (expected an artifact directory from specdec-compile)")
    return Manifest.read(p), read_specializations(p / SPECIALIZATIONS_FILE)


def _check_role(p: Path, m: Manifest, expect_role: str | None) -> None:
    if expect_role and m.role != expect_role:
        raise SpecdecError(f"{p}: is a {m.role.upper()} artifact, expected a {expect_role.upper()} "
                           f"(were --tlm and --dlm swapped?)")


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
    """An --interface qeff artifact (contract section 7): a TLM only, its prefill at batch 1."""
    where = p / SPECIALIZATIONS_FILE
    if m.role == "dlm":
        raise SpecdecError(f"{p}: a --interface qeff DLM has no seq_len 2 (QEfficient's DLM decodes one token a "
                           f"call), which this loop needs: compile the draft without --interface qeff")
    B, CL, PL = m.batch_size, m.ctx_len, m.prefill_len
    shapes = tuple((s["batch_size"], s["seq_len"]) for s in specs)
    if {s["ctx_len"] for s in specs} != {CL}:
        raise SpecdecError(f"{where}: ctx_len is not {CL} ({MANIFEST_FILE}) in every specialization")
    if not shapes or shapes[0] != (B if PL == 1 else 1, PL) or any(b != B for b, _ in shapes[1:]):
        raise SpecdecError(f"{where}: expected QEfficient's prefill [1, {PL}] then decodes at batch {B}, "
                           f"got {[list(x) for x in shapes]}")
    seq_lens = tuple(sorted({s for _, s in shapes[1:]}))
    k, k_list = _tlm_widths(p, m, seq_lens, CL, need_k=False)
    if need_model and not (p / MODEL_FILE).is_file():
        raise SpecdecError(f"{p / MODEL_FILE}: missing (the rewritten graph)")
    return Artifact(path=p, role=m.role, target=m.target, batch_size=B, ctx_len=CL, prefill_len=PL,
                    seq_lens=seq_lens, k=k, k_list=k_list, vocab_size=m.vocab_size, num_layers=m.num_layers,
                    num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, eos_token_id=m.eos_token_id,
                    manifest=m.to_json(), record=m, qeff=True, call_shapes=shapes)


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

    ``expect_role`` ("tlm"/"dlm") makes a role mismatch an error;
    ``need_model`` requires ``model.onnx`` (the ONNX Runtime backend needs it,
    the Cloud AI 100 backend needs the QPC instead).
    """
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


#: special token ids a manifest records (from the export's config.json / generation_config.json):
#: what they are called, and the manifest keys that hold them
SPECIAL_IDS = (("EOS ids", ("eos_token_id", "eos_token_ids")), ("BOS ids", ("bos_token_id",)),
               ("pad ids", ("pad_token_id",)))


def special_ids(a: Artifact) -> dict[str, frozenset[int]]:
    """The special token ids ``a``'s manifest records, as sets (EOS: every id listed)."""
    out = {}
    for what, keys in SPECIAL_IDS:
        found: set[int] = set()
        for key in keys:
            v = a.eos_token_id if key == "eos_token_id" else a.manifest.get(key)
            v = [v] if isinstance(v, int) else v
            if isinstance(v, list):
                found |= {x for x in v if isinstance(x, int) and not isinstance(x, bool)}
        if found:
            out[what] = frozenset(found)
    return out


def _check_special_ids(tlm: Artifact, dlm: Artifact) -> None:
    t, d = special_ids(tlm), special_ids(dlm)
    for what, _ in SPECIAL_IDS:
        if what in t and what in d and t[what] != d[what]:
            first = min(t[what] ^ d[what])
            raise SpecdecError(f"TLM and DLM have different {what}: {sorted(t[what])} ({tlm.path}) vs "
                               f"{sorted(d[what])} ({dlm.path}), first at id {first}; speculative decoding "
                               f"needs one shared tokenizer")


def check_pair(tlm: Artifact, dlm: Artifact, tokenizers=None) -> None:
    """A TLM and a DLM can run together: the same batch, context and prefill
    length, and one tokenizer. Their table sizes may differ (see vocab.py).

    ``tokenizers`` = (the TLM's, the DLM's): they must agree on the token of
    every id both models can emit and on the special tokens. Without both, the
    special token ids the two manifests record must agree.
    """
    if tlm.role != "tlm":
        raise SpecdecError(f"{tlm.path}: --tlm is a {tlm.role.upper()} artifact")
    if dlm.role != "dlm":
        raise SpecdecError(f"{dlm.path}: --dlm is a {dlm.role.upper()} artifact")
    for attr, what in (("batch_size", "batch size"), ("ctx_len", "context length"),
                       ("prefill_len", "prefill length")):
        a, b = getattr(tlm, attr), getattr(dlm, attr)
        if a != b:
            raise SpecdecError(f"TLM and DLM differ in {what}: {a} ({tlm.path}) vs {b} ({dlm.path}); "
                               f"compile both with the same value")
    if tokenizers is not None and all(t is not None for t in tokenizers):
        from .tokenizer import check_tokenizers_agree

        sizes = [v for v in (tlm.vocab_size, dlm.vocab_size) if v]
        check_tokenizers_agree(*tokenizers, limit=min(sizes) if sizes else None)
    else:
        _check_special_ids(tlm, dlm)


def _layers(xs) -> str:
    return ",".join(str(x) for x in xs)


def check_feature_pair(tlm: Artifact, dlm: Artifact) -> None:
    """A feature draft and its target match (contract section 5): the draft's
    ``target_layers``, resolved against the TLM's layer count, are the TLM's
    ``layer_indices`` in order, and the widths are equal. The loop feeds the
    draft's own ``draft_hidden_states`` back where a target feature is not known
    yet, so that output must be as wide as the features it reads."""
    fd = dlm.feature_draft
    if fd is None:
        return
    reads = list(fd.get("target_layers") or [])
    hs = tlm.hidden_states
    if hs is None:
        raise SpecdecError(f"{dlm.path} is a feature draft reading target layers {_layers(reads)}, but the target "
                           f"{tlm.path} exposes no hidden states: compile it with --hidden-states {_layers(reads)}")
    n = tlm.num_layers
    resolved = [x + n if (x < 0 and n) else x for x in reads]
    if resolved != list(hs.get("layer_indices") or []):
        raise SpecdecError(f"the target was compiled with --hidden-states {_layers(hs.get('layers') or [])} but the "
                           f"draft reads layers {_layers(reads)} ({tlm.path}, {dlm.path}); compile the target "
                           f"with --hidden-states {_layers(reads)}")
    reads_width = int(fd.get("target_width", fd["width"]))
    if int(hs["width"]) != reads_width:
        raise SpecdecError(f"the target's hidden states are {hs['width']} wide but the draft reads {reads_width} "
                           f"({tlm.path}, {dlm.path}): another hidden size")
    if fd.get("own_offset") is not None:
        _check_own_slot(dlm, fd)     # an EAGLE-3 head: its own features go to a slot of their own
    elif int(fd["draft_width"]) != int(fd["width"]):
        raise SpecdecError(f"{dlm.path}: the draft's own features (draft_hidden_states) are {fd['draft_width']} "
                           f"wide but it reads {fd['width']}: the loop feeds them back in place of the target's "
                           f"for later drafts, so it needs one target layer of its own hidden size")
    want, src = fd.get("target") or {}, tlm.manifest.get("source") or {}
    if want.get("sha256") and src.get("sha256") and want["sha256"] != src["sha256"]:
        raise SpecdecError(f"{dlm.path} is a feature draft for the target {want.get('file')} (sha256 "
                           f"{want['sha256'][:12]}), but {tlm.path} was compiled from {src.get('file')} (sha256 "
                           f"{src['sha256'][:12]}): another target")
    if len(reads) != 1 and fd.get("own_offset") is None:
        raise SpecdecError(f"{dlm.path}: the draft reads {len(reads)} target layers ({_layers(reads)}); the loop "
                           f"feeds its own features back in place of the target's for later drafts, so it "
                           f"reads exactly one")


def _check_own_slot(dlm: Artifact, fd: dict) -> None:
    """An own-slot feature draft (contract section 2): input [target features ; own features], the slot
    as wide as ``draft_hidden_states``."""
    off, width, own = int(fd["own_offset"]), int(fd["width"]), int(fd["draft_width"])
    if off != int(fd.get("target_width", -1)) or width - off != own:
        raise SpecdecError(f"{dlm.path}: the feature draft's own slot [{off}, {width}) does not hold its "
                           f"{own}-wide draft_hidden_states after target_width {fd.get('target_width')}")
