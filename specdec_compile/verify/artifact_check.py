"""An artifact directory verified against its export at the artifact's own shapes: what
``specdec-compile pair`` runs on each model it compiles and ``specdec-compile --verify`` on the
artifact before it is written."""
from __future__ import annotations

import logging
from pathlib import Path

from ..contract import MODEL_FILE
from ..errors import SpecdecError
from .replay import verify

_log = logging.getLogger("specdec_compile")


class VerifyFailed(SpecdecError):
    """A compiled model is not numerically its export (exit 1, as ``specdec-compile verify``)."""

    exit_code = 1


def verify_artifact(original: Path, art: Path, what: str, done: str = "nothing written") -> dict:
    """``verify`` of the artifact directory ``art`` (its manifest's k, prefill, ctx, batch and
    specializations) against the export ``original``; raises ``VerifyFailed`` (its message ends with
    ``done``) when they differ, else returns the report's numbers."""
    from ..artifact.manifest import Manifest
    m = Manifest.read(art)
    _log.info("verifying the %s against its export", what)
    rep = verify(original, art / MODEL_FILE, k=m.k or 7, prefill_len=m.prefill_len, ctx_len=m.ctx_len,
                 batch_size=m.batch_size, widths=m.specializations or ())
    if not rep.ok:
        raise VerifyFailed(f"verify: the compiled {what} differs from its export (max |Δ logits| "
                           f"{rep.max_logits_diff:.3e}, max |Δ cache| {rep.max_cache_diff:.3e}, tolerance "
                           f"{rep.tol:g}); {done}")
    return {"ok": True, "max_logits_diff": rep.max_logits_diff, "max_cache_diff": rep.max_cache_diff,
            "max_hidden_diff": rep.max_hidden_diff, "tol": rep.tol}
