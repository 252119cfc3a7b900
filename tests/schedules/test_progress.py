"""SolveProgressDisplay without a terminal: plain lines at a regular interval, whatever the solver reports."""

from __future__ import annotations

import io
import re
import time

from schedules.milp import SolveProgress
from schedules.progress import SolveProgressDisplay


def elapsed_of(lines: list[str]) -> list[float]:
    return [float(re.search(r":\s+([0-9.]+) s", line).group(1)) for line in lines]


def test_plain_lines_come_at_a_regular_interval_while_the_solver_is_silent() -> None:
    out = io.StringIO()
    with SolveProgressDisplay("poet g", stream=out, interval_s=0.1):
        time.sleep(0.55)  # a long LP relaxation: no callback at all
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 6
    assert all(line.startswith("poet g: ") and "\x1b[" not in line for line in lines)
    seconds = elapsed_of(lines)
    assert seconds == sorted(seconds) and seconds[0] >= 0.1 - 1e-3


def test_callbacks_in_bursts_add_no_lines_and_the_next_line_shows_the_latest() -> None:
    out = io.StringIO()
    with SolveProgressDisplay("poet g", stream=out, interval_s=0.5) as display:
        for k in range(1000):  # branch and bound reporting many times a second
            display(SolveProgress(elapsed_s=0.0, incumbent_j=2.0 + k, bound_j=1.5, gap=0.25))
        assert out.getvalue() == ""
        time.sleep(0.6)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "incumbent 1001 J" in lines[0] and "gap 25.00%" in lines[0]


def test_no_line_after_the_display_is_left() -> None:
    out = io.StringIO()
    with SolveProgressDisplay("poet g", stream=out, interval_s=0.05):
        time.sleep(0.12)
    written = out.getvalue()
    time.sleep(0.15)
    assert written and out.getvalue() == written


def test_without_a_with_block_each_callback_may_print_once_per_interval() -> None:
    out = io.StringIO()
    display = SolveProgressDisplay("poet g", stream=out, interval_s=60.0)
    display(SolveProgress(elapsed_s=0.0, incumbent_j=None, bound_j=1.0, gap=None))
    display(SolveProgress(elapsed_s=0.0, incumbent_j=None, bound_j=1.0, gap=None))
    assert len(out.getvalue().splitlines()) == 1
