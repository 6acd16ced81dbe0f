"""Weight-only quantization of an imported head (``import-head --weights int8|int4``).

A draft's weights decide only which tokens it proposes: the target verifies every
draft, so greedy output stays target-only's token for token and seeded sampling
stays the target's draw (runtime/sampling.py) whatever the head computes. What a
head call costs on a CPU is mostly reading its weights (SmolLM2's head: 9.5M
float32 parameters, 38 MB a call), so weights of 8 or 4 bits make each draft
cheaper. ONNX Runtime's ``MatMulNBitsQuantizer`` turns every MatMul with a
constant weight (fc, the attention and MLP projections, the LM head) into
``com.microsoft::MatMulNBits`` (symmetric, blocks of ``BLOCK`` along the input
dimension, ``ACCURACY_LEVEL`` 4: the activations are quantized to int8 per block
and multiplied in int8, the fastest kernel). The target's embedding table, which
the head reads by Gather, stays float32. ONNX Runtime and OpenVINO run that op;
Cloud AI 100 has no precedent for it (docs/qaic-ops.md), so ``--target qaic`` is
refused (the device compiler's own ``--mxfp6-matmul`` is its way).
"""
from __future__ import annotations

from pathlib import Path

from ..errors import SpecdecError

WEIGHTS = ("float", "int8", "int4")
BITS = {"int8": 8, "int4": 4}
BLOCK = 32
ACCURACY_LEVEL = 4


def check_weights(weights: str, target: str, flag: str = "--weights", targets=("ort", "openvino")) -> None:
    """One line for a weight format no artifact of ``target`` can have (``flag``: the option that set it;
    ``targets``: the caller's targets that can have it, named in the hint)."""
    if weights not in WEIGHTS:
        raise SpecdecError(f"{flag} {weights!r}: one of {', '.join(WEIGHTS)}")
    if weights != "float" and target == "qaic":
        raise SpecdecError(f"{flag} {weights} quantizes to ONNX Runtime's MatMulNBits, which Cloud AI 100 "
                           f"has no precedent for: use --target {' or '.join(targets)} (for the device: --mxfp6-matmul)")


def quantize_head(path: Path, weights: str) -> dict | None:
    """Quantize the export at ``path`` in place (``weights`` "int8"/"int4"); returns the manifest's record
    of what was done (None for "float": the export is left as it is)."""
    if weights == "float":
        return None
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    model = onnx.load(str(path))
    before = sum(n.op_type == "MatMul" for n in model.graph.node)
    q = MatMulNBitsQuantizer(model, bits=BITS[weights], block_size=BLOCK, is_symmetric=True,
                             accuracy_level=ACCURACY_LEVEL)
    q.process()
    out = q.model.model
    n = sum(node.op_type == "MatMulNBits" for node in out.graph.node)
    if n == 0:
        raise SpecdecError(f"{path}: --weights {weights}: no MatMul with a constant weight to quantize")
    onnx.save(out, str(path))
    return {"format": weights, "op": "com.microsoft::MatMulNBits", "bits": BITS[weights], "block_size": BLOCK,
            "symmetric": True, "accuracy_level": ACCURACY_LEVEL, "matmuls": n, "matmuls_left_float": before - n}
