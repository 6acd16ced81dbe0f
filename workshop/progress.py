"""Progress of the demo's long stages: rich bars on a terminal, plain lines in logs."""
from __future__ import annotations


class Reporter:
    """Progress bars (rich) plus one plain line per finished stage."""

    def __init__(self, quiet: bool = False):
        from rich.console import Console
        self.console = Console(stderr=False, quiet=quiet)
        self.quiet = quiet

    def progress(self):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        return Progress(TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                        console=self.console, transient=False, disable=self.quiet)

    def tick(self, name: str, done: int, total: int, info: str) -> None:
        """Without a terminal (logs, CI) the bars do not redraw: print every 10% instead."""
        if self.quiet or self.console.is_terminal:
            return
        every = max(1, total // 10)
        if done % every == 0 or done == total:
            self.line(f"  {name} {done}/{total} {info}")

    def line(self, msg: str) -> None:
        self.console.print(msg, highlight=False, markup=False)
