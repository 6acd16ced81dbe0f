"""``python -m specdec_compile.diff A.onnx B.onnx``: the same as ``specdec-compile diff``."""
import sys

from ..cli.diff import main

if __name__ == "__main__":
    sys.exit(main())
