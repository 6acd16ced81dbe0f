"""A draft's tokenizer against its target's, before any export or compile.

Both with tokenizer files: the files that define the vocabulary are compared; when they
differ, the two tokenizers are loaded (transformers) and must agree on the token of every id
both models can emit (the runtime's own check); without transformers, differing files are
refused. Otherwise (an ``.onnx`` file, a folder without a tokenizer) the vocabulary sizes
(config.json's ``vocab_size``, else the graph's logits) must be equal. Refused in one line.
"""
from __future__ import annotations

import json

from ..errors import SpecdecError
from .inputs import VOCAB_FILES, ModelInput


def vocab_size(inp: ModelInput) -> int | None:
    """The vocabulary size: the export's logits when there is an export, else config.json's."""
    if inp.onnx is not None:
        import onnx
        try:
            g = onnx.load(str(inp.onnx), load_external_data=False).graph
        except Exception:  # noqa: BLE001 - the compile says what is wrong with it
            return None
        for o in g.output:
            if o.name == "logits":
                dims = o.type.tensor_type.shape.dim
                if dims and dims[-1].HasField("dim_value"):
                    return int(dims[-1].dim_value)
        return None
    cfg = inp.folder / "config.json"
    try:
        v = json.loads(cfg.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _vocab_bytes(inp: ModelInput) -> dict[str, bytes]:
    return {n: (inp.folder / n).read_bytes() for n in VOCAB_FILES if (inp.folder / n).is_file()}


def check_same_tokenizer(tlm: ModelInput, dlm: ModelInput) -> None:
    """Refuse a draft whose tokenizer is not the target's (one line)."""
    t_files, d_files = _vocab_bytes(tlm), _vocab_bytes(dlm)
    if t_files and d_files:
        if t_files == d_files:
            return
        _load_and_compare(tlm, dlm)
        return
    vt, vd = vocab_size(tlm), vocab_size(dlm)
    if vt is None or vd is None:
        raise SpecdecError(f"{dlm.flag} {dlm.path}: cannot tell its vocabulary size or the target's, and "
                           f"there are no tokenizer files on both sides to compare: refused")
    if vt != vd:
        raise SpecdecError(f"{dlm.flag} {dlm.path}: its vocabulary has {vd} tokens, the target's {vt}: another "
                           f"tokenizer (give a draft that shares the target's tokenizer)")


def _load_and_compare(tlm: ModelInput, dlm: ModelInput) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SpecdecError(f"{dlm.flag} {dlm.path}: its tokenizer files differ from the target's (and transformers, "
                           f"which could tell whether they agree anyway, is not installed): refused") from None
    from ..runtime.tokenizer import check_tokenizers_agree, load_tokenizer
    sizes = [v for v in (vocab_size(tlm), vocab_size(dlm)) if v]
    try:
        check_tokenizers_agree(load_tokenizer(tlm.folder), load_tokenizer(dlm.folder),
                               limit=min(sizes) if sizes else None)
    except SpecdecError as e:
        raise SpecdecError(f"{dlm.flag} {dlm.path}: its tokenizer differs from the target's ({e})") from None
