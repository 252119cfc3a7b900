"""Quiet hours: train only inside a daily window of local time, such as the night."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, time

from agent.monitors.base import Verdict

Clock = Callable[[], datetime]
"""Returns the local wall-clock time; injectable so tests choose the hour."""

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def parse_window(text: str) -> tuple[time, time]:
    """``"HH:MM-HH:MM"`` (24-hour local time) as (start, end); the window may wrap midnight.

    ``24:00`` is accepted as an end (``"22:00-24:00"`` means until midnight).

    Raises
    ------
    ValueError
        When the text is not two times of day, or start equals end.
    """
    match = _WINDOW.match(text)
    expected = f"quiet hours {text!r}: expected HH:MM-HH:MM (24-hour local time, e.g. '01:00-06:00')"
    if match is None:
        raise ValueError(expected)
    start_h, start_m, end_h, end_m = (int(g) for g in match.groups())
    if end_h == 24 and end_m == 0:
        end_h = 0  # midnight at the end of the day: the window wraps to 00:00
    if start_h > 23 or end_h > 23 or start_m > 59 or end_m > 59:
        raise ValueError(expected)
    start, end = time(start_h, start_m), time(end_h, end_m)
    if start == end:
        raise ValueError(f"quiet hours {text!r}: start equals end (leave quiet hours unset to train at any hour)")
    return start, end


def in_window(moment: time, start: time, end: time) -> bool:
    """Whether ``moment`` lies in [start, end), wrapping midnight when end is before start."""
    if start < end:
        return start <= moment < end
    return moment >= start or moment < end


class QuietHours:
    """Eligible only inside a daily window of local time.

    Parameters
    ----------
    window:
        ``"HH:MM-HH:MM"``, 24-hour local time; ``"23:00-06:00"`` wraps midnight.
    clock:
        Returns the local time now; default ``datetime.now``.

    Raises
    ------
    ValueError
        For a malformed window (see :func:`parse_window`).
    """

    name = "quiet_hours"

    def __init__(self, window: str = "01:00-06:00", clock: Clock | None = None) -> None:
        self.start, self.end = parse_window(window)
        self._clock = clock if clock is not None else datetime.now
        self.window = f"{self.start:%H:%M}-{self.end:%H:%M}"

    def check(self, now: float) -> Verdict:
        """Compare the wall clock with the window; ``now`` (monotonic) is unused: the window is wall-clock time."""
        moment = self._clock()
        inside = in_window(moment.time(), self.start, self.end)
        where = "inside" if inside else "outside"
        return Verdict(self.name, inside, f"{where} quiet hours {self.window} (now {moment:%H:%M})")
