"""When to start a supervised child again after it failed: one exponential backoff for every supervisor.

The agent's daemon (its training process), the SuperNode and its warm ClientApp runner on a device, and the
server's SuperLink and planner processes all restart a child that failed.  Each waits ``first`` seconds after
a failure, twice as long after each failure that follows, never more than ``maximum``, and starts over once
the child has shown it works (:meth:`Backoff.reset`, or a run of ``stable_after`` seconds).
"""

from __future__ import annotations


class Backoff:
    """Exponential backoff for restarting one child process.

    ``now`` is any monotonic clock the caller keeps (the daemon's is injectable in tests).
    """

    def __init__(self, first: float, maximum: float, *, stable_after: float | None = None) -> None:
        if not 0 < first <= maximum:
            raise ValueError(f"backoff needs 0 < first <= maximum, got first={first!r}, maximum={maximum!r}")
        self.first = first
        self.maximum = maximum
        self.stable_after = stable_after
        self.delay = first  # what the next failure waits
        self.retry_at = 0.0  # when the child may be started again
        self._started_at: float | None = None

    def due(self, now: float) -> bool:
        """Whether the wait after the last failure is over (always, before any failure)."""
        return now >= self.retry_at

    def started(self, now: float) -> None:
        """The child was started at ``now``: a run of ``stable_after`` seconds from here starts the backoff over."""
        self._started_at = now

    def failed(self, now: float, *, wait: float | None = None) -> float:
        """The child failed at ``now``: it may start again after the returned number of seconds (``wait`` when
        given, for a failure that retrying soon cannot mend; else the current delay), and the next failure
        waits twice as long, up to ``maximum``."""
        if self.stable_after is not None and self._started_at is not None \
                and now - self._started_at >= self.stable_after:
            self.delay = self.first
        self._started_at = None
        seconds = self.delay if wait is None else wait
        self.retry_at = now + seconds
        self.delay = min(self.maximum, 2 * max(self.delay, seconds))
        return seconds

    def reset(self) -> None:
        """The child did its work (or supervising it ended): the next failure waits ``first`` again, and
        nothing holds a start back."""
        self.delay = self.first
        self.retry_at = 0.0
