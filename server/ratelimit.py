"""Attempts per client address in a sliding window: the server's brake on guessing tokens.

Kept in memory, per server process: with several processes behind one
database each counts for itself (the limit is then per process).  Behind a
reverse proxy, uvicorn takes the client's address from ``X-Forwarded-For``
only when the proxy is named with ``poet-edge server run --trusted-proxy``;
otherwise the header is ignored and every client behind the proxy shares its
address and limit.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

MAX_ADDRESSES = 100_000  # addresses tracked at once; idle ones are dropped first


class RateLimiter:
    """At most ``limit`` attempts per key within ``window`` seconds.

    ``clock`` is :func:`time.monotonic` unless a test passes its own.
    """

    def __init__(self, limit: int, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._refused: dict[str, float] = {}  # when each key's current run of refusals began
        self._lock = threading.Lock()

    def retry_after(self, key: str) -> float | None:
        """Seconds until ``key`` may try again, or ``None`` when it may try now (nothing is recorded)."""
        with self._lock:
            now = self._clock()
            hits = self._hits.get(key)
            if hits is None:
                return None
            _trim(hits, now - self.window)
            if len(hits) < self.limit:
                return None
            return max(hits[0] + self.window - now, 0.001)

    def hit(self, key: str) -> float | None:
        """Record an attempt by ``key``; ``None`` when it is allowed, else the seconds until the next is."""
        with self._lock:
            now = self._clock()
            hits = self._hits.setdefault(key, deque())
            _trim(hits, now - self.window)
            if len(hits) >= self.limit:
                return max(hits[0] + self.window - now, 0.001)
            hits.append(now)
            if len(self._hits) > MAX_ADDRESSES:
                self._forget_idle(now)
            return None

    def first_refusal(self, key: str) -> bool:
        """Whether a refusal of ``key`` now starts a new run of refusals (none in the last window): what the
        audit log records, once per run rather than once per refused attempt."""
        with self._lock:
            now = self._clock()
            began = self._refused.get(key)
            if began is not None and began > now - self.window:
                return False
            if len(self._refused) > MAX_ADDRESSES:
                self._refused = {k: t for k, t in self._refused.items() if t > now - self.window}
            self._refused[key] = now
            return True

    def _forget_idle(self, now: float) -> None:
        for key in [k for k, hits in self._hits.items() if not hits or hits[-1] <= now - self.window]:
            del self._hits[key]
        while len(self._hits) > MAX_ADDRESSES:  # all still active: drop the oldest entries
            del self._hits[next(iter(self._hits))]


def _trim(hits: deque[float], before: float) -> None:
    while hits and hits[0] <= before:
        hits.popleft()
