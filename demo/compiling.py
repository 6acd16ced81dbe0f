"""``specdec-compile`` as the demo and the benchmarks call it: one artifact, reused when
its stamp says it was compiled from the same model and options by the same compiler;
and the trio every speculative run needs (``compile_trio``)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "specdec-compile"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from specdec_compile.cli import main; sys.exit(main())"]


def tool_version() -> str:
    try:
        import specdec_compile
        return getattr(specdec_compile, "__version__", "?")
    except ImportError:  # pragma: no cover
        return "missing"


def compile_artifact(model: Path, out: Path, args: list[str], *, log=print, subcommand: str | None = None,
                     key_files: tuple[Path, ...] = ()) -> float:
    """``specdec-compile [SUBCOMMAND] MODEL ARGS -o OUT``, skipped when OUT was written from the same
    model and options by the same tool (its stamp says so). ``key_files``: the files whose contents
    identify the input instead of MODEL's (a checkpoint directory's files, with ``import-head``).
    Returns the wall time (0 when reused)."""
    ident = ([hashlib.sha256(f.read_bytes()).hexdigest() for f in key_files] if key_files
             else hashlib.sha256(model.read_bytes()).hexdigest())
    material = [ident, args, tool_version(), _src_digest()] + ([subcommand] if subcommand else [])
    key = hashlib.sha256(json.dumps(material).encode()).hexdigest()[:16]
    stamp = out.parent / f".{out.name}.stamp"
    if (out / "manifest.json").exists() and stamp.exists() and stamp.read_text().strip() == key:
        log(f"[compile] {out}: reused")
        return 0.0
    t0 = time.time()
    cmd = compile_cmd() + ([subcommand] if subcommand else []) + [str(model), *args, "-o", str(out), "--force"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"specdec-compile failed ({' '.join(cmd)}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    dt = time.time() - t0
    stamp.write_text(key)
    log(f"[compile] {out}: {' '.join(args)} ({dt:.1f} s)")
    return dt


def _src_digest() -> str:
    """The compiler's own sources: a changed pass recompiles."""
    d = hashlib.sha256()
    pkg = ROOT / "specdec_compile"
    for p in sorted(pkg.rglob("*.py")):
        if "runtime" in p.parts:
            continue
        d.update(p.read_bytes())
    return d.hexdigest()[:16]


def compile_trio(tlm_onnx: Path, dlm_onnx: Path, out: Path, *, k: int, k_list: list[int] | None,
                 prefill_len: int, ctx_len: int, log=print) -> dict:
    """The three artifacts a speculative run and its baseline need, for ONNX Runtime:
    ``OUT/dlm`` (the draft), ``OUT/tlm`` (the target at ``k``, plus the ``k_list`` widths when
    given) and ``OUT/tlm-base`` (the target compiled with ``--role dlm``: seq_len 1, the
    target-only baseline). Returns the compile seconds of each (0 when reused)."""
    common = ["--target", "ort", "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len)]
    tl = ["--role", "tlm", "--k", str(k)] + (["--k-list", ",".join(map(str, k_list))] if k_list else [])
    times = {}
    times["dlm"] = compile_artifact(dlm_onnx, out / "dlm", ["--role", "dlm", *common], log=log)
    times["tlm"] = compile_artifact(tlm_onnx, out / "tlm", [*tl, *common], log=log)
    times["tlm-base"] = compile_artifact(tlm_onnx, out / "tlm-base", ["--role", "dlm", *common], log=log)
    return times


def compile_feature_pair(tlm_onnx: Path, fdraft_onnx: Path, out: Path, *, k: int, k_list: list[int] | None,
                         prefill_len: int, ctx_len: int, log=print) -> dict:
    """A feature draft and the TLM it reads: ``OUT/tlm-hs`` (the target as ``compile_trio``'s TLM,
    plus ``--hidden-states -1``: the last layer's output before the final norm at every position)
    and ``OUT/fdlm`` (the head with ``--role dlm --feature-layers -1 --feature-target TLM_ONNX``;
    its ``k`` / ``k_list`` widths ingest a round's accepted tokens in one call). Returns the
    compile seconds of each."""
    common = ["--target", "ort", "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len)]
    ks = ["--k", str(k)] + (["--k-list", ",".join(map(str, k_list))] if k_list else [])
    times = {}
    times["fdlm"] = compile_artifact(fdraft_onnx, out / "fdlm", ["--role", "dlm", *ks, "--feature-layers", "-1",
                                                                 "--feature-target", str(tlm_onnx), *common],
                                   log=log)
    times["tlm-hs"] = compile_artifact(tlm_onnx, out / "tlm-hs", ["--role", "tlm", *ks, "--hidden-states", "-1",
                                                                  *common], log=log)
    return times
