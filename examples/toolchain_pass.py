"""specdec-compile as one pass of your own ONNX toolchain: onnx_ir model in, artifact out.

    python examples/toolchain_pass.py MODEL.onnx OUT_DIR

Any onnx_ir pass may run before it; the rewrite hands back an onnx_ir model for the
passes after it, and write_artifact writes the directory a backend loads.
"""
import sys

import onnx_ir as ir

from specdec_compile import pipeline
from specdec_compile.artifact.writer import write_artifact
from specdec_compile.options import Options


def main(model_path: str, out: str) -> None:
    model = ir.load(model_path)          # your toolchain's model, weights as external references
    # ... your own onnx_ir passes here ...
    opts = Options(role="tlm", k=3, target="ort", ctx_len=64, prefill_len=8)
    result = pipeline.rewrite(model, opts, source=model_path)
    rewritten = result.as_given()        # an onnx_ir.Model again, for the passes after this one
    print("inputs: ", [v.name for v in rewritten.graph.inputs][:4], "...")
    print("outputs:", [v.name for v in rewritten.graph.outputs][:3], "...")
    print("passes: ", ", ".join(result.passes))
    written = write_artifact(result, opts, out, force=True)
    print("artifact:", written.out, written.files)


if __name__ == "__main__":
    main(*sys.argv[1:3])
