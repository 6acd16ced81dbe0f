"""What the command-line tools share: one argument parser and one error wrapper.

Every expected failure is a ``SpecdecError``: one line on stderr, exit 2, never
a traceback. ``run_cli`` turns it (and interrupts, broken pipes and bugs) into
that line and an exit status; ``Parser`` makes argparse's usage errors such
failures instead of argparse's own usage dump and exit.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import SpecdecError


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one-line ``SpecdecError``s (exit 2 through ``run_cli``).

    ``help_hint`` is appended to the message, e.g. ``" (see specdec-compile --help)"``;
    without it the message is argparse's alone.
    """

    def __init__(self, *args, help_hint: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.help_hint = help_hint

    def error(self, message):  # noqa: D401 - argparse API
        raise SpecdecError(f"{message}{self.help_hint}")


_Parser = Parser  # its older name, kept for callers of the time before cli/ was one package


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
