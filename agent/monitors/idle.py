"""Idle: train only once the device's own users have left the CPU alone for a while.

Foreground load is user + system CPU time, averaged over all CPUs.  Niced work
is left out on purpose: the agent runs at ``Nice=10``, so its own training lands
in ``nice`` and does not make the device look busy.  Load average is not used:
it counts tasks waiting on I/O, which SD-card paging inflates.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import psutil

from agent.monitors.base import Verdict

Sampler = Callable[[], float]
"""Returns the foreground CPU percent (0-100) since its previous call."""


class ForegroundCpu:
    """User + system CPU percent over all CPUs since the previous call; a :data:`Sampler`.

    Computed from ``psutil.cpu_times()`` differences kept here rather than with
    ``psutil.cpu_times_percent(interval=None)``, whose "previous call" is one
    module-wide reading that any other caller in the process (a heartbeat) would reset.
    Primed at construction, so the first call already covers a real interval.
    """

    def __init__(self) -> None:
        self._last = psutil.cpu_times()
        self._percent = 0.0

    def __call__(self) -> float:
        times = psutil.cpu_times()
        busy = (times.user - self._last.user) + (times.system - self._last.system)
        total = _total(times) - _total(self._last)
        if total > 0:  # two calls within one clock tick: keep the previous figure
            self._percent = min(100.0, max(0.0, 100.0 * busy / total))
            self._last = times
        return self._percent


def _total(times: tuple[float, ...]) -> float:
    total = sum(times)
    if sys.platform.startswith("linux"):  # Linux counts guest time inside user and nice as well
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return total


class IdleMonitor:
    """Eligible once foreground CPU has stayed at or below a threshold for long enough.

    Once eligible, it stays eligible until the CPU goes above threshold +
    hysteresis, so the agent's own bookkeeping or a brief cron job around the
    threshold does not start and stop training; then the idle clock restarts.

    Parameters
    ----------
    max_foreground_percent:
        Threshold for "idle", percent of all CPUs.
    idle_seconds:
        How long the CPU must stay at or below the threshold before training.
    hysteresis_percent:
        How far above the threshold an eligible device may go before it is busy again.
    sample:
        Returns the foreground CPU percent since its previous call; default :class:`ForegroundCpu`.
    """

    name = "idle"

    def __init__(
        self,
        max_foreground_percent: float = 20.0,
        idle_seconds: float = 60.0,
        hysteresis_percent: float = 5.0,
        sample: Sampler | None = None,
    ) -> None:
        self.max_foreground_percent = max_foreground_percent
        self.idle_seconds = idle_seconds
        self.hysteresis_percent = hysteresis_percent
        self._sample = sample if sample is not None else ForegroundCpu()
        self._eligible = False
        self._busy: bool | None = None  # whether the current stretch is busy; None before the first check
        self._since = 0.0  # when the current stretch began
        self._last_check: float | None = None

    def check(self, now: float) -> Verdict:
        """Take one sample and update the idle clock; ``now`` is monotonic seconds."""
        percent = self._sample()
        # The sample covers the time since the previous check, so a new stretch starts there.
        start = self._last_check if self._last_check is not None else now
        self._last_check = now
        was_eligible = self._eligible
        busy = percent > self.max_foreground_percent + (self.hysteresis_percent if was_eligible else 0.0)
        if busy is not self._busy:
            self._busy, self._since = busy, start
        stretch = now - self._since
        self._eligible = not busy and stretch >= self.idle_seconds
        # The threshold that decided: with hysteresis for an eligible device above the plain threshold.
        threshold = self._threshold_text(hysteresis=was_eligible and percent > self.max_foreground_percent)
        measured = {"cpu_load": round(percent, 1)}
        if busy:
            return Verdict(self.name, False, f"foreground CPU {round(percent, 1):g}% > {threshold} for {stretch:.0f} s",
                           measured)
        reason = f"foreground CPU {round(percent, 1):g}% <= {threshold} for {stretch:.0f} s"
        if not self._eligible:
            reason += f", needs {self.idle_seconds:g} s"
        return Verdict(self.name, self._eligible, reason, measured)

    def _threshold_text(self, hysteresis: bool) -> str:
        if not hysteresis:
            return f"{self.max_foreground_percent:g}%"
        ceiling = self.max_foreground_percent + self.hysteresis_percent
        return f"{ceiling:g}% ({self.max_foreground_percent:g}% + {self.hysteresis_percent:g}% hysteresis)"
