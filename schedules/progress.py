"""Live solver progress for the command line: elapsed, incumbent, bound, gap.

On a terminal it is one ``rich`` status line redrawn four times a second (the
elapsed time keeps ticking between solver callbacks); anywhere else (a pipe, a
log file, CI) it is a plain line at a fixed interval, written by a small timer
thread whatever the solver is doing: solver callbacks come in bursts during
branch and bound and not at all while an LP relaxation runs, so lines printed
from them would come every few seconds in one solve and once a minute in the
next.  ``rich`` is imported only when a terminal display is actually shown.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO


class SolveProgressDisplay:
    """A context manager and ``progress=`` callback for :func:`schedules.plan`.

    Parameters
    ----------
    label:
        What is being solved, shown at the start of each line.
    stream:
        Where progress goes (standard error by default; results go to standard output).
    interval_s:
        Seconds between plain lines when ``stream`` is not a terminal (from a
        timer thread while the display is entered as a context manager).
    live:
        Force the terminal display on or off; by default on when ``stream`` is a TTY.
    """

    def __init__(self, label: str, stream: TextIO | None = None, interval_s: float = 5.0,
                 live: bool | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.live_mode = _isatty(self.stream) if live is None else live
        self.started = time.monotonic()
        self.latest: Any = None
        self._last_line = float("-inf")
        self._live: Any = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()

    def __enter__(self) -> "SolveProgressDisplay":
        self.started = time.monotonic()
        if self.live_mode:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self, console=Console(file=self.stream), refresh_per_second=4, transient=True)
            self._live.__enter__()
        else:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="solve-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None

    def __call__(self, progress: Any) -> None:
        """Record a ``SolveProgress`` (elapsed_s, incumbent_j, bound_j, gap) from the solver.

        Outside a ``with`` block (no timer thread) a plain line is printed from
        here, at most once per ``interval_s``.
        """
        self.latest = progress
        now = time.monotonic()
        if not self.live_mode and self._ticker is None and now - self._last_line >= self.interval_s:
            self._last_line = now
            print(self.line(), file=self.stream, flush=True)

    def _tick(self) -> None:
        """Print a plain line at every multiple of ``interval_s`` since the start, until told to stop."""
        ticks = 1
        while not self._stop.wait(max(self.started + ticks * self.interval_s - time.monotonic(), 0.0)):
            print(self.line(), file=self.stream, flush=True)
            ticks = int((time.monotonic() - self.started) // self.interval_s) + 1  # a late tick skips, not bunches

    def line(self) -> str:
        """The current status as one line of text."""
        elapsed = time.monotonic() - self.started
        p = self.latest
        if p is None:
            return f"{self.label}: {elapsed:6.1f} s  building and presolving..."
        return (f"{self.label}: {elapsed:6.1f} s  incumbent {_joules(p.incumbent_j)}  "
                f"bound {_joules(p.bound_j)}  gap {_percent(p.gap)}")

    def __rich__(self) -> Any:
        # Re-rendered by rich's refresh thread, so the elapsed time ticks between callbacks.
        from rich.text import Text

        # Text, not markup: file names may hold brackets.  One line, cut short on narrow terminals.
        return Text.assemble(("solving ", "bold cyan"), self.line(), no_wrap=True, overflow="ellipsis")


def _joules(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g} J"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or file-like objects without a terminal
        return False
