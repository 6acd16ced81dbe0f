"""``specdec-compile``: one command with subtools over one library.

    specdec-compile MODEL --role tlm --k 7 -o OUT     compile (the default subtool)
    specdec-compile verify ORIGINAL REWRITTEN         numerical equivalence
    specdec-compile diff A.onnx B.onnx                graph-aware diff

Every expected failure is a ``SpecdecError``: one line on stderr, exit 2.
"""
from __future__ import annotations

import os
import sys

from .errors import SpecdecError

PROG = "specdec-compile"
SUBTOOLS = ("verify", "diff")


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "verify":
        from .verify import main as verify_main
        return verify_main(argv[1:], prog=f"{PROG} verify")
    if argv and argv[0] == "diff":
        from .diff import main as diff_main
        return diff_main(argv[1:], prog=f"{PROG} diff")
    from .cli_compile import main as compile_main
    return compile_main(argv, prog=PROG)


def run_cli(fn, argv, prog: str) -> int:
    """Run ``fn(argv)``, turning expected failures into one line and exit 2."""
    try:
        return fn(argv)
    except SpecdecError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: still one line unless asked for the traceback
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {' '.join(str(e).split())[:500]} "
              f"(set SPECDEC_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(_dispatch, argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
