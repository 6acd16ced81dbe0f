"""What the command-line tools share: one argument parser and one error wrapper.

Every expected failure is a ``SpecdecError``: one line on stderr, exit 2, never
a traceback. Progress: the library logs its steps through ``logging`` (loggers
under ``specdec_compile``, INFO; it configures no handler); ``start_progress``
shows them on stderr, one line each, while a command runs (``--quiet``: never;
``--progress``: also when stderr is not a terminal). ``run_cli`` turns it (and interrupts, broken pipes and bugs) into
that line and an exit status; ``Parser`` makes argparse's usage errors such
failures instead of argparse's own usage dump and exit.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from ..errors import SpecdecError


def strict_int(text: str) -> int:
    """argparse type of the integer options: ASCII digits and an optional minus only (int() would also
    read "1_0" as 10, "+3" and other scripts' digits)."""
    from ..layer_lists import INTEGER
    if not INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r} (an integer in ASCII digits)")
    try:
        return int(text)
    except ValueError:   # more digits than Python converts
        raise argparse.ArgumentTypeError(f"invalid int value: {text[:20]!r}... ({len(text)} digits)") from None


class _StoreOnce(argparse.Action):
    """Store an option's value; the same option again with another value is refused: argparse
    would keep the last one and drop the first without a word (``--k-list 1 --k-list 2``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = parser.given
        if self.dest in given and given[self.dest] != values:
            raise SpecdecError(f"{'/'.join(self.option_strings)} given twice ({given[self.dest]!r}, then "
                               f"{values!r}): give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _strict(args: tuple, kwargs: dict) -> dict:
    """An option's keywords with ``_StoreOnce`` and ``strict_int`` where argparse's defaults would be."""
    if args and str(args[0]).startswith("-") and kwargs.get("action") is None:
        kwargs = {**kwargs, "action": _StoreOnce}
        if kwargs.get("type") is int:
            kwargs["type"] = strict_int
    return kwargs


def _strict_group(group):
    """A group of a ``Parser`` whose options follow the parser's rules too."""
    plain = group.add_argument
    group.add_argument = lambda *args, **kwargs: plain(*args, **_strict(args, kwargs))
    return group


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one-line ``SpecdecError``s (exit 2 through ``run_cli``).

    ``help_hint`` is appended to the message, e.g. ``" (see specdec-compile --help)"``;
    without it the message is argparse's alone. An option that takes one value (in a group too)
    takes it once (a second, different value is refused: argparse keeps the
    last without a word), and ``type=int`` reads ASCII digits only (``strict_int``); repeatable
    options (``action="append"``) and switches are as argparse makes them.
    """

    def __init__(self, *args, help_hint: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.help_hint = help_hint
        self.given: dict = {}

    def add_argument(self, *args, **kwargs):
        return super().add_argument(*args, **_strict(args, kwargs))

    def add_mutually_exclusive_group(self, **kwargs):
        return _strict_group(super().add_mutually_exclusive_group(**kwargs))

    def add_argument_group(self, *args, **kwargs):
        return _strict_group(super().add_argument_group(*args, **kwargs))

    def parse_known_args(self, args=None, namespace=None):
        self.given = {}       # each parse starts afresh (tests parse many command lines with one parser)
        return super().parse_known_args(args, namespace)

    def error(self, message):  # noqa: D401 - argparse API
        raise SpecdecError(f"{message}{self.help_hint}")




#: the package's logger: every library module logs under it
LOGGER = "specdec_compile"


def add_progress_flags(p: argparse.ArgumentParser, steps: str = "load, detect, each pass, save, verify") -> None:
    """--quiet / --progress: whether the library's progress lines go to stderr; ``steps``: what they report."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    g.add_argument("--progress", action="store_true",
                   help=f"progress lines on stderr ({steps}) even when stderr "
                        "is not a terminal (default: only on a terminal)")


class _Progress(logging.Handler):
    """One line per record on the current stderr: ``PROG: [  1.2s] message``."""

    def __init__(self, prog: str):
        super().__init__(logging.INFO)
        self.prog, self.t0 = prog, time.perf_counter()

    def emit(self, record):
        try:
            print(f"{self.prog}: [{time.perf_counter() - self.t0:6.1f}s] {record.getMessage()}",
                  file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


_active: list = []   # (handler, the logger's level before)


def start_progress(prog: str, args) -> None:
    """Show the library's progress on stderr until ``stop_progress`` (``run_cli`` calls it)."""
    stop_progress()
    if getattr(args, "quiet", False) or not (getattr(args, "progress", False) or sys.stderr.isatty()):
        return
    logger = logging.getLogger(LOGGER)
    h = _Progress(prog)
    _active.append((h, logger.level))
    logger.addHandler(h)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


def stop_progress() -> None:
    logger = logging.getLogger(LOGGER)
    while _active:
        h, level = _active.pop()
        logger.removeHandler(h)
        logger.setLevel(level)


class Terminated(BaseException):
    """SIGTERM arrived: raised where the program is, so that ``finally`` and cleanup handlers
    (the artifact writer's temporary directory) run before it exits."""


def _on_sigterm(signum, frame):
    raise Terminated()


def drop_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered does not fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def run_cli(fn, argv, prog: str) -> int:
    """Run ``fn(argv)``, turning expected failures into one line and exit 2 (SIGTERM: cleanup, then 143).
    A closed stderr (``2>&-``: Python's ``sys.stderr`` is None) takes the diagnostics to the null
    device: ``print(file=None)`` would put them on stdout, into a ``--json`` record."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return fn(argv)
    except SpecdecError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:   # the reader left (| head): quiet, but not "done" (exit 0 would claim it)
        drop_stdout()
        return 128 + signal.SIGPIPE
    except Exception as e:  # a bug: still one line unless asked for the traceback
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {' '.join(str(e).split())[:500]} "
              f"(set SPECDEC_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        stop_progress()
