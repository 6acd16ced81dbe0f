"""The command lines, over the library: one package, one module per tool.

    specdec-compile MODEL --role tlm --k 7 -o OUT     compile (the default subtool)   cli/compile.py
    specdec-compile verify ORIGINAL REWRITTEN         numerical equivalence           cli/verify.py
    specdec-compile diff A.onnx B.onnx                graph-aware diff                cli/diff.py
    specdec-compile import-head CKPT --tlm TLM -o OUT an EAGLE-3 head as a draft  cli/import_head.py
    specdec-compile pair --tlm T --dlm D -o OUT       export, compile, verify a pair cli/pair.py
    specdec-run --tlm OUT --dlm OUT ...               speculative decoding            cli/run.py

``cli/common.py`` holds what they share (the parser, the error wrapper).
``python -m specdec_compile`` is ``specdec-compile``. Every expected failure
is a ``SpecdecError``: one line on stderr, exit 2.
"""
from __future__ import annotations

import sys

from .common import run_cli  # re-exported: specdec_compile.cli.run_cli

PROG = "specdec-compile"
SUBTOOLS = ("verify", "diff", "import-head", "pair")


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "verify":
        from .verify import main as verify_main
        return verify_main(argv[1:], prog=f"{PROG} verify")
    if argv and argv[0] == "diff":
        from .diff import main as diff_main
        return diff_main(argv[1:], prog=f"{PROG} diff")
    if argv and argv[0] == "import-head":
        from .import_head import main as import_main
        return import_main(argv[1:], prog=f"{PROG} import-head")
    if argv and argv[0] == "pair":
        from .pair import main as pair_main
        return pair_main(argv[1:], prog=f"{PROG} pair")
    from .compile import main as compile_main
    return compile_main(argv, prog=PROG)


def main(argv: list[str] | None = None) -> int:
    """``specdec-compile``: the exit status of the subtool ``argv`` names (compile by default)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(_dispatch, argv, PROG)
