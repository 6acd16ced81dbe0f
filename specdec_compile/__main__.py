"""``python -m specdec_compile``: the same as ``specdec-compile``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
