"""OpenVINO GenAI's own pipeline beside our backends (bench/backends.py), on the same weights.

GenAI is found in this order: ``SPECDEC_OVGENAI_PYTHON`` (a Python with ``openvino-genai`` and,
to build the model, ``optimum-intel``: a scratch venv, so that the project's pinned packages stay
as they are; docs/benchmarks-openvino-genai.md says how to make one), else this Python when it can
import ``openvino_genai``. Without either the section says so in one line.

The model: GenAI runs an OpenVINO IR with its own stateful cache (``optimum-cli export openvino
--weight-format fp32`` of the same Hugging Face checkpoint our export was made from), built once
and cached under the bench's build folder, rebuilt when the checkpoint's files change. Prompts go
in as token ids (``bench/ovgenai_worker.py``), the same ids as ours, so no GenAI tokenizer is
needed. Runs: target-only and prompt lookup, each at f32 and at the CPU plugin's default precision;
greedy, ``ignore_eos``, the same number of new tokens. Each run's greedy ids are compared with ours.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PYTHON_ENV = "SPECDEC_OVGENAI_PYTHON"
WORKER = Path(__file__).resolve().parent / "ovgenai_worker.py"
MAX_NGRAM = 3          # GenAI's prompt lookup: the longest n-gram matched (its samples' value)


def genai_python() -> tuple[str | None, str]:
    """(the Python that runs GenAI, or None; a line saying which, or why none)."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not (Path(named).is_file() and os.access(named, os.X_OK)):
            return None, f"{PYTHON_ENV}={named} is not an executable file"
        return named, f"{PYTHON_ENV}={named}"
    if importlib.util.find_spec("openvino_genai") is not None:
        return sys.executable, "this Python"
    return None, (f"openvino-genai is not installed (pip install openvino-genai optimum-intel, or point "
                  f"{PYTHON_ENV} at a venv that has them: docs/benchmarks-openvino-genai.md)")


def _stamp(hf: Path) -> dict:
    """What the IR was built from: the checkpoint's files, sizes and modification times."""
    files = sorted(p for p in hf.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json"))
    return {"source": str(hf.resolve()), "weight_format": "fp32",
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def ensure_ir(python: str, hf: Path, cache: Path, log=print) -> Path:
    """The OpenVINO IR of checkpoint ``hf`` (f32 weights) under ``cache``, exported with
    optimum-intel by ``python`` when missing or made from other files. RuntimeError: one line."""
    ir = cache / f"{hf.name}-fp32"
    stamp = _stamp(hf)
    stamp_file = ir / "specdec-ovgenai-stamp.json"
    if (ir / "openvino_model.xml").is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return ir
    tmp = cache / f".{ir.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    log(f"[genai] exporting {hf} to an OpenVINO IR (optimum-intel, fp32) -> {ir}")
    cmd = [python, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", str(hf),
           "--task", "text-generation-with-past", "--weight-format", "fp32", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not (tmp / "openvino_model.xml").is_file():
        tail = " ".join((r.stderr or r.stdout).split())[-300:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"optimum-intel could not export {hf} (needs optimum-intel in {python}): {tail}")
    (tmp / stamp_file.name).write_text(json.dumps(stamp))
    shutil.rmtree(ir, ignore_errors=True)
    tmp.rename(ir)
    return ir


def run_worker(python: str, request: dict, timeout: float | None = None, args: list[str] | None = None,
               cwd: Path | None = None) -> dict:
    """One worker run under ``python``: bench/ovgenai_worker.py, or ``args`` (the JSON protocol the
    same; bench/ov_worker.py is run so), in ``cwd``. RuntimeError: one line."""
    r = subprocess.run([python, *(args or [str(WORKER)])], input=json.dumps(request), capture_output=True,
                       text=True, timeout=timeout, cwd=cwd)
    lines = r.stdout.strip().splitlines()
    try:
        ans = json.loads(lines[-1]) if lines else {"error": " ".join(r.stderr.split())[-300:]}
    except ValueError:
        ans = {"error": f"unreadable answer: {lines[-1][:200]}"}
    if r.returncode != 0 or "error" in ans:
        raise RuntimeError(f"the {'GenAI' if args is None else 'OpenVINO'} worker failed: {ans.get('error', r.returncode)}")
    return ans


def measure(hf: Path, cache: Path, prompts: list[list[int]], new: int, threads: int, k: int,
            ours: list[list[int]], log=print) -> dict | str:
    """GenAI's runs on ``prompts``: per run tokens/s and whether its greedy ids equal ``ours`` (our
    OpenVINO f32 target-only ids) per prompt. A string (one line) when it cannot be measured."""
    python, which = genai_python()
    if python is None:
        return f"not measured: {which}"
    try:
        ir = ensure_ir(python, hf, cache, log)
        runs = [{"precision": p, "mode": m} for p in ("f32", None) for m in ("target", "prompt_lookup")]
        ans = run_worker(python, {"ir": str(ir), "prompts": prompts, "max_new_tokens": new, "threads": threads,
                                  "runs": runs, "num_assistant_tokens": k, "max_ngram_size": MAX_NGRAM})
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"not measured: {' '.join(str(e).split())[:400]}"
    rows = []
    for r in ans["runs"]:
        gen = r.pop("generated")
        r["greedy_equal_ours_f32"] = [g == o for g, o in zip(gen, ours)]
        r["generated_tokens"] = sum(map(len, gen))
        rows.append(r)
    return {"python": which, "ir": str(ir), "openvino_genai": ans["openvino_genai"],
            "cpu_default_precision": ans["cpu_default_precision"], "num_assistant_tokens": k,
            "max_ngram_size": MAX_NGRAM, "rows": rows}
