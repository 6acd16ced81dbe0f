"""``specdec-compile verify``: the rewritten graph replayed against its export.

    replay.py   verify(): the export and the artifact called on the same tokens, per
                specialization, cache carried over; the width check (a position's logits in
                one call of k+1 tokens and in k+1 calls of one)
    hidden.py   the hidden-state outputs compared with the export's own tensors
    openvino.py the rewrite run on OpenVINO (``--backend openvino``): cache in state variables
    artifact_check.py  an artifact directory against its export at its own shapes (``pair``,
                ``specdec-compile --verify``): ``verify_artifact``, ``VerifyFailed`` (exit 1)
"""
from .replay import VerifyReport, verify  # noqa: F401
