"""What a model argument of ``pair`` is, and the files its hash covers.

A model is given as an ``.onnx`` file, an optimum export folder (``model.onnx`` in it) or a
Hugging Face folder (``config.json`` and ``*.safetensors`` / ``pytorch_model*.bin``); a
speculators head as its checkpoint folder. The cache key is made of the files' sha256
(names relative to the model, so a moved folder keeps its key); a file whose size and
mtime are what ``pair.json`` recorded keeps its recorded sha256 instead of being read again,
so that a second ``pair`` with the same settings costs a few ``stat`` calls.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..contract import MANIFEST_FILE
from ..errors import SpecdecError

#: files beside an export that the compile reads (family, special ids) or the runtime needs
SIDE_FILES = ("config.json", "generation_config.json")
#: a tokenizer's files (copied into the pair's tokenizer/ folder; the first three define its vocabulary)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")
VOCAB_FILES = TOKENIZER_FILES[:5]
EXPECTED = ("model.onnx (an optimum export) or config.json with *.safetensors or pytorch_model*.bin "
            "(a Hugging Face model)")


@dataclass
class ModelInput:
    flag: str                   # the option it came from: --tlm, --dlm, --head
    path: Path                  # as given
    kind: str                   # "onnx" | "optimum" | "hf" | "head"
    folder: Path                # where config.json and the tokenizer's files are
    onnx: Path | None = None    # the export (None for a Hugging Face folder until exported)
    files: list[Path] = field(default_factory=list)
    external: list[Path] = field(default_factory=list)   # an export's external data files

    @property
    def needs_export(self) -> bool:
        return self.kind == "hf"

    def tokenizer_files(self) -> list[Path]:
        return [self.folder / n for n in TOKENIZER_FILES if (self.folder / n).is_file()]


def _top_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _is_hf_folder(p: Path) -> bool:
    if not (p / "config.json").is_file():
        return False
    return any(p.glob("*.safetensors")) or any(p.glob("pytorch_model*.bin"))


def resolve(path: str | os.PathLike, flag: str, known: dict | None = None) -> ModelInput:
    """The model ``path`` names (one line when it names none). ``known``: ``pair.json``'s record
    of an earlier build (an .onnx file's external data list is kept there, not parsed again)."""
    p = Path(path)
    if not p.exists():
        raise SpecdecError(f"{flag} {p}: no such file or directory")
    if (p / MANIFEST_FILE).is_file():   # a compiled artifact has a model.onnx too: not an optimum export
        raise SpecdecError(f"{flag} {p}: a compiled artifact ({MANIFEST_FILE}), not a model: give the export or "
                           f"Hugging Face folder it was compiled from (expected {EXPECTED})")
    if p.is_file():
        return _onnx_input(flag, p, p, "onnx", known)
    if not p.is_dir():   # a device, a socket: neither a model file nor a folder
        raise SpecdecError(f"{flag} {p}: not a regular file or a folder: expected an .onnx file or a folder with "
                           f"{EXPECTED}")
    if (p / "model.onnx").is_file():
        return _onnx_input(flag, p, p / "model.onnx", "optimum", known)
    if _is_hf_folder(p):
        return ModelInput(flag, p, "hf", p, None, _top_files(p))
    raise SpecdecError(f"{flag} {p}: a folder with no model in it: expected {EXPECTED}")


def resolve_head(path: str | os.PathLike) -> ModelInput:
    p = Path(path)
    if not p.is_dir():
        raise SpecdecError(f"--head {p}: " + ("no such directory" if not p.exists() else "not a directory") +
                           " (expected a speculators checkpoint folder: config.json, model.safetensors)")
    if not (p / "config.json").is_file():
        raise SpecdecError(f"--head {p}: a folder with no config.json: expected a speculators checkpoint folder "
                           f"(config.json, model.safetensors)")
    return ModelInput("--head", p, "head", p, None, _top_files(p))


def _onnx_input(flag: str, given: Path, onnx_path: Path, kind: str, known: dict | None) -> ModelInput:
    folder = onnx_path.parent
    external = _external_files(onnx_path, known)
    files = [onnx_path, *external] + [folder / n for n in (*SIDE_FILES, *TOKENIZER_FILES) if (folder / n).is_file()]
    return ModelInput(flag, given, kind, folder, onnx_path, list(dict.fromkeys(files)), external)


def _external_files(onnx_path: Path, known: dict | None) -> list[Path]:
    """The external data files the model names: as recorded when the .onnx is unchanged, else parsed."""
    rec = (known or {}).get("files") or []
    first = rec[0] if rec else None
    st = onnx_path.stat()
    if first and first.get("path") == str(onnx_path.resolve()) and \
            (first.get("size"), first.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
        return [onnx_path.parent / r["name"] for r in rec[1:] if "external" in r.get("role", "")]
    import onnx

    from ..model_io import external_data_files
    try:
        proto = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - onnx raises several kinds for a bad file
        raise SpecdecError(f"{onnx_path}: not an ONNX model ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:160]})") from None
    return [onnx_path.parent / n for n in external_data_files(proto)]


def known_inputs(m: dict | None) -> dict:
    """``pair.json``'s ``inputs`` where every file record is well formed, else {} (then every file
    is hashed again: a damaged record is never trusted)."""
    rec = (m or {}).get("inputs")
    fields = (("name", str), ("path", str), ("size", int), ("mtime_ns", int), ("sha256", str), ("role", str))
    if not isinstance(rec, dict):
        return {}
    for entry in rec.values():
        files = entry.get("files") if isinstance(entry, dict) else None
        if not isinstance(files, list) or not all(
                isinstance(f, dict) and all(isinstance(f.get(k), t) for k, t in fields) for f in files):
            return {}
        if any(os.path.isabs(f["name"]) or ".." in Path(f["name"]).parts for f in files):
            return {}
    return rec


def digest(inp: ModelInput, known: dict | None = None) -> dict:
    """The record of ``inp`` for pair.json: its kind, path, and each file's name, size, mtime and
    sha256 (a file whose size and mtime ``known`` recorded keeps the recorded sha256), and one
    sha256 over the names and hashes (the key's part)."""
    import hashlib

    from ..model_io import sha256_file
    old = {f["path"]: f for f in (known or {}).get("files") or [] if isinstance(f, dict) and "path" in f}
    ext = {str(p) for p in inp.external}
    files, total = [], hashlib.sha256()
    for f in inp.files:
        try:
            st = f.stat()
            ap = str(f.resolve())
            prev = old.get(ap)
            same = prev and (prev.get("size"), prev.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)
            sha = prev["sha256"] if same else sha256_file(f)
        except OSError as e:   # e.g. an external data file the model names is missing
            raise SpecdecError(f"{inp.flag} {inp.path}: cannot read {f}: {e.strerror or e}") from None
        name = os.path.relpath(f, inp.folder)
        files.append({"name": name, "path": ap, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha,
                      "role": "external data" if str(f) in ext else ""})
        total.update(f"{name}\0{sha}\n".encode())
    return {"kind": inp.kind, "path": str(inp.path.resolve()), "sha256": total.hexdigest(), "files": files}


def compile_input(path: str | os.PathLike) -> Path:
    """The .onnx file ``specdec-compile MODEL`` compiles: MODEL itself, or an optimum export
    folder's model.onnx; a Hugging Face folder or a folder with no model gets one line saying
    what to run."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.exists():
        raise SpecdecError(f"{p}: no such file")
    if (p / "model.onnx").is_file():
        return p / "model.onnx"
    if _is_hf_folder(p):
        raise SpecdecError(f"{p}: a Hugging Face folder, not an ONNX export: export it first (optimum-cli export onnx "
                           f"--model {p} --task text-generation-with-past OUT, then give OUT), or build a pair from "
                           f"it in one command (specdec-compile pair --tlm {p} ..., docs/pair.md)")
    raise SpecdecError(f"{p}: not a file, and a folder with no model in it (expected an .onnx model, or an optimum "
                       f"export folder holding model.onnx)")
