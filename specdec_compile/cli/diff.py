"""``specdec-compile diff``: the command line over the diff library.

    specdec-compile diff A.onnx B.onnx [--json] [--color auto|always|never]
    specdec-compile diff --passes ORIGINAL.onnx --role tlm [--target qaic|ort|openvino] [--k K] [--json]

Exit status like ``diff(1)``: 0 same, 1 different, 2 error. A leaf: the
library (``specdec_compile.diff``) never imports this module.
"""
from __future__ import annotations

import argparse
import os
import sys

from .common import Parser, drop_stdout, run_cli
from ..contract import TARGETS
from ..errors import SpecdecError
from ..diff.compare import diff_files
from ..diff.render import print_report, render_json


def _build_parser(prog: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, help_hint=" (see --help)",
               description="Graph-aware diff of two ONNX models, or of the passes of a compile. "
               "Exit status: 0 same, 1 different, 2 error.")
    p.add_argument("paths", nargs="+", metavar="MODEL",
                   help="A.onnx B.onnx (or two artifact directories); with --passes: the original export")
    p.add_argument("--json", action="store_true", help="machine-readable JSON (stable key order)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colours (default: only when stdout is a terminal)")
    p.add_argument("--passes", action="store_true",
                   help="compile ORIGINAL and show what each pass changed (same sections per pass)")
    p.add_argument("--role", choices=("tlm", "dlm"), help="with --passes: the role to compile for")
    p.add_argument("--target", choices=TARGETS, default=None,
                   help="with --passes: lowering target (default qaic)")
    p.add_argument("--k", type=int, default=None, help="with --passes: speculation length (graph does not depend on it)")
    return p


def _main(argv: list[str], prog: str) -> int:
    args = _build_parser(prog).parse_args(argv)
    _check_stdout()
    if args.passes:
        if len(args.paths) != 1:
            raise SpecdecError("--passes takes exactly one model: the original export")
        if not args.role:
            raise SpecdecError("--passes needs --role tlm or --role dlm")
        report = _explain(args)
    else:
        if len(args.paths) != 2:
            raise SpecdecError(f"expected two models to compare, got {len(args.paths)}")
        given = [f for f, v in (("--role", args.role), ("--target", args.target), ("--k", args.k)) if v is not None]
        if given:
            raise SpecdecError(f"{'/'.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --passes")
        report = diff_files(args.paths[0], args.paths[1])
    status = 0 if report["identical"] else 1
    try:
        if args.json:
            sys.stdout.write(render_json(report))
            sys.stdout.flush()
        else:
            print_report(report, sys.stdout, color={"always": True, "never": False}.get(args.color))
    except BrokenPipeError:   # the reader left early (| head): the comparison's status still holds
        drop_stdout()
    except OSError as e:
        drop_stdout()
        raise SpecdecError(f"cannot write the report to stdout: {e.strerror or e}") from None
    return status


def _explain(args) -> dict:
    """The --passes report: the compile of the export, pass by pass; a compiled model is refused
    in diff's terms (it has no passes left to show)."""
    from ..explain import explain_file  # the compile pipeline: loaded only for --passes
    from ..model_checks import AlreadyCompiledError

    path = args.paths[0]
    try:
        return explain_file(path, role=args.role, target=args.target or "qaic", k=args.k)
    except AlreadyCompiledError as e:
        raise SpecdecError(f"{path} is already compiled ({e.marker}): diff --passes compiles a stock export to show "
                           f"what each pass changes; give the export it was compiled from (to compare two compiled "
                           f"models: specdec-compile diff A B)") from None


def _check_stdout() -> None:
    """A one-line error before any work when there is no stdout to write the report to."""
    out = sys.stdout
    if out is None or getattr(out, "closed", False):
        raise SpecdecError("stdout is closed: nowhere to write the report")
    try:
        fd = out.fileno()
    except (OSError, ValueError, AttributeError):
        return   # not a file (a test's capture, an io.StringIO): it takes writes
    try:
        os.fstat(fd)
    except OSError:
        raise SpecdecError("stdout is closed: nowhere to write the report") from None


def main(argv: list[str] | None = None, prog: str = "specdec-compile diff") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(lambda a: _main(a, prog), argv, prog)


if __name__ == "__main__":
    sys.exit(main())
