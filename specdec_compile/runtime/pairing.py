"""Whether two artifacts run together: a TLM and its draft (shapes, special ids, tokenizers) and a
feature draft and its target (the layers and widths of contract section 5). Here, not in the
artifact package, because the tokenizer check is the runtime's."""
from __future__ import annotations

from ..artifact.reader import Artifact
from ..errors import SpecdecError
from ..options import Options


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


def _interface_words(o: Options) -> str:
    if o.interface != "qeff":
        return f"--batch-size {o.batch_size}"
    return f"--full-batch-size {o.batch_size}" if o.continuous_batching else f"--interface qeff --batch-size {o.batch_size}"


def check_compile_pair(tlm: Options, dlm: Options) -> None:
    """Before compiling a pair (``specdec-compile pair``): the two ``Options`` give a TLM and a draft
    that this runtime drives together (``check_pair`` accepts them, one backend runs both), or one
    ``SpecdecError`` line naming the option to change, so that no pair is refused at run time.

    Supported: any interface for either model (the default, QEfficient's plain ``--interface qeff``,
    its continuous batching ``--full-batch-size``), mixed freely (a default DLM with a qeff TLM,
    a qeff DLM with any TLM), when both have the same rows (batch size / full_batch_size), context,
    prefill length and target. A draft's rows are its own cache's: a default DLM paired with a
    batch-B TLM is compiled at ``--batch-size B``. A feature draft needs a TLM with hidden states."""
    if not isinstance(tlm, Options) or not isinstance(dlm, Options):
        raise SpecdecError("check_compile_pair takes the TLM's and the draft's Options")
    if tlm.role != "tlm" or dlm.role != "dlm":
        raise SpecdecError(f"a pair is a TLM and a DLM, got --role {tlm.role} and --role {dlm.role}")
    if tlm.target != dlm.target:
        raise SpecdecError(f"the TLM is compiled for --target {tlm.target} and the draft for --target {dlm.target}: "
                           f"one backend runs both; compile them for the same target")
    for attr, flag in (("ctx_len", "--ctx-len"), ("prefill_len", "--prefill-len")):
        a, b = getattr(tlm, attr), getattr(dlm, attr)
        if a != b:
            raise SpecdecError(f"the TLM has {flag} {a} and the draft {flag} {b}: compile both with the same value")
    if tlm.batch_size != dlm.batch_size:
        raise SpecdecError(f"the TLM decodes {tlm.batch_size} rows ({_interface_words(tlm)}) and the draft "
                           f"{dlm.batch_size} ({_interface_words(dlm)}): a draft keeps one cache row per TLM row; "
                           f"compile the draft with --batch-size {tlm.batch_size} (or --full-batch-size "
                           f"{tlm.batch_size})")
    if dlm.feature_layers and not tlm.hidden_states:
        raise SpecdecError(f"the draft is a feature draft (--feature-layers {_layers(dlm.feature_layers)}): compile "
                           f"the TLM with --hidden-states {_layers(dlm.feature_layers)}")


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
