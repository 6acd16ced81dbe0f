"""``specdec-compile``: one command with subtools over one library.

    specdec-compile MODEL --role tlm --k 7 -o OUT     compile (the default subtool)
    specdec-compile verify ORIGINAL REWRITTEN         numerical equivalence
    specdec-compile diff A.onnx B.onnx                graph-aware diff

Every expected failure is a ``SpecdecError``: one line on stderr, exit 2.
"""
from __future__ import annotations

import sys

from .cli_common import run_cli  # also imported from here by runtime/cli.py

PROG = "specdec-compile"
SUBTOOLS = ("verify", "diff")


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "verify":
        from .verify import main as verify_main
        return verify_main(argv[1:], prog=f"{PROG} verify")
    if argv and argv[0] == "diff":
        from .diff.cli import main as diff_main
        return diff_main(argv[1:], prog=f"{PROG} diff")
    from .cli_compile import main as compile_main
    return compile_main(argv, prog=PROG)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(_dispatch, argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
