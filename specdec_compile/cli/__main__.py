"""``python -m specdec_compile.cli``: the same as ``specdec-compile``."""
import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
