"""``specdec-compile`` as the demo and the benchmarks call it: one artifact, reused when
its stamp says it was compiled from the same model and options by the same compiler;
the trio every speculative run needs (``compile_trio``), the feature pair
(``compile_feature_pair``) and an imported EAGLE-3 head with its TLM (``compile_eagle3``)."""
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


def head_sha(head: Path) -> str:
    """The sha256 of a speculators checkpoint directory's ``model.safetensors``."""
    return hashlib.sha256((head / "model.safetensors").read_bytes()).hexdigest()


def compile_eagle3(export: Path, head: Path, out: Path, *, k: int, k_list: list[int], prefill_len: int,
                   ctx_len: int, log=print, target: str = "ort", weights: str = "float") -> tuple[Path, Path, dict]:
    """A ``speculators`` EAGLE-3 head imported by ``specdec-compile import-head`` against ``export``
    and the TLM compiled with the ``--hidden-states`` the import names, both under ``out``/eagle3-SHA
    (SHA: the head's model.safetensors sha256; cached: the stamp holds the head's files, the export's
    sha256, the options and the compiler's sources), lowered for ``target``. Returns (the TLM, the
    head, what was imported). ``weights``: the head's (``import-head --weights``; "float": the
    checkpoint's), its directory ``head`` or ``head-int8``/``head-int4`` beside the one TLM."""
    sha = head_sha(head)
    base = out / f"eagle3-{sha[:16]}"
    common = ["--target", target, "--prefill-len", str(prefill_len), "--ctx-len", str(ctx_len)]
    hdir = base / ("head" if weights == "float" else f"head-{weights}")
    wflag = [] if weights == "float" else ["--weights", weights]
    t_head = compile_artifact(head, hdir, ["--tlm", str(export), "--k", str(k), *common, *wflag, "--quiet"],
                              log=log, subcommand="import-head",
                              key_files=(head / "config.json", head / "model.safetensors", export))
    from specdec_compile.layer_lists import format_layers
    man = json.loads((hdir / "manifest.json").read_text())
    layers = format_layers(man["feature_draft"]["target_layers"])
    t_tlm = compile_artifact(export, base / "tlm", ["--role", "tlm", "--k", str(k), "--k-list",
                                                    ",".join(map(str, k_list)), "--hidden-states", layers, *common],
                             log=log)
    rec = man["feature_draft"].get("eagle3") or {}
    info = {"dir": str(head), "sha256": sha, "hidden_states": layers, "artifacts": str(base),
            "aux_hidden_state_layer_ids": rec.get("aux_hidden_state_layer_ids"),
            "draft_vocab_size": rec.get("draft_vocab_size"), "weights": weights,
            "compile_s": {"head": round(t_head, 1), "tlm": round(t_tlm, 1)}}
    return base / "tlm", hdir, info
