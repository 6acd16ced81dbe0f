"""The demo's build cache: every stage writes a directory whose stamp holds the key
it was built under, all or nothing; a later run with the same key reuses it.

Used by ``train_pair`` (the toy pair), ``smollm2`` (the real target) and ``distill``
(its draft). Keys are ``h(...)`` over whatever changes a stage's result.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

STAMP = "specdec-stamp.json"


def h(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(files: list[Path]) -> str:
    d = hashlib.sha256()
    for p in files:
        d.update(p.name.encode())
        d.update(p.read_bytes())
    return d.hexdigest()[:16]


def stamp_ok(path: Path, key: str) -> bool:
    try:
        return json.loads((path / STAMP).read_text())["key"] == key
    except (OSError, ValueError, KeyError):
        return False


def publish(tmp: Path, final: Path, key: str, extra: dict | None = None) -> None:
    """Write the stamp into ``tmp`` and move it over ``final`` (all or nothing)."""
    (tmp / STAMP).write_text(json.dumps({"key": key, **(extra or {})}, indent=1, sort_keys=True))
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def fresh_tmp(final: Path) -> Path:
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def torch_cached(path: Path, build, *, force: bool = False):
    """``build()``'s result saved to ``path`` with ``torch.save`` (atomically; older files of
    the same prefix beside it removed), or loaded from ``path`` when it is there."""
    import torch
    if force or not path.exists():
        data = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob(path.name.split("-")[0] + "-*.pt"):
            old.unlink()
        torch.save(data, str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)
        return data
    return torch.load(path)


def export_onnx(hf_dir: Path, out: Path) -> tuple[Path, float]:
    t0 = time.time()
    tmp = fresh_tmp(out)
    exe = shutil.which("optimum-cli", path=str(Path(sys.executable).parent)) or shutil.which("optimum-cli")
    cmd = ([exe] if exe else [sys.executable, "-m", "optimum.commands.optimum_cli"]) + [
        "export", "onnx", "--model", str(hf_dir), "--task", "text-generation-with-past", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not (tmp / "model.onnx").exists():
        raise SystemExit(f"optimum export of {hf_dir} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return tmp, time.time() - t0


def reuse_result(res_path: Path, key: str, stamps: list, line) -> dict | None:
    """A stage's saved result (``res_path``, JSON with "key") when it was written under ``key``
    and every (directory, key) of ``stamps`` still holds; None otherwise."""
    if not res_path.exists():
        return None
    prev = json.loads(res_path.read_text())
    if prev.get("key") != key or not all(stamp_ok(d, k) for d, k in stamps):
        return None
    line(f"reusing {stamps[0][0]} (key {key})")
    prev["reused"] = True
    return prev
