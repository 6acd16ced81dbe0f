"""A Hugging Face folder exported with optimum (``optimum-cli export onnx --task
text-generation-with-past``): the ``export`` extra, imported only here and only when a
Hugging Face folder is given, so the core package stays free of torch."""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from ..errors import SpecdecError

_log = logging.getLogger(__name__)
INSTALL = "pip install 'specdec-compile[export]'"
TASK = "text-generation-with-past"


def check_optimum(flag: str, folder: Path) -> None:
    """One line saying how to install optimum when it is not importable."""
    try:
        import optimum.exporters.onnx  # noqa: F401
    except ImportError:
        raise SpecdecError(f"{flag} {folder} is a Hugging Face folder: exporting it needs optimum, which is not "
                           f"installed ({INSTALL}); or export it yourself (optimum-cli export onnx --model "
                           f"{folder} --task {TASK} OUT) and give OUT") from None


def export_hf(flag: str, folder: Path, out: Path) -> Path:
    """``folder`` exported to ``out``; returns ``out/model.onnx`` (one line when optimum fails)."""
    check_optimum(flag, folder)
    exe = shutil.which("optimum-cli", path=str(Path(sys.executable).parent))
    cmd = ([exe] if exe else [sys.executable, "-m", "optimum.commands.optimum_cli"]) + [
        "export", "onnx", "--model", str(folder), "--task", TASK, str(out)]
    _log.info("exporting %s with optimum (%s)", folder, TASK)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not (out / "model.onnx").is_file():
        lines = [x for x in (res.stderr or res.stdout or "").splitlines() if x.strip()]
        last = lines[-1].strip()[:300] if lines else f"exit status {res.returncode}"
        raise SpecdecError(f"{flag} {folder}: optimum could not export it ({last})")
    return out / "model.onnx"
