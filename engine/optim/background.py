"""Updates of optimizer state on flash, run on a thread of their own while the backward pass goes on.

An update whose state lives on flash spends most of its time waiting for the
state's chunks to be read and written; run on the computing thread it would
hold the backward pass for all of it.  :class:`UpdateWorker` runs such
updates on its own thread, each with a deadline: the backward node whose
computation it must be done by (:meth:`UpdateWorker.wait_for`, which the
executor calls as each backward node is computed).  It always runs the job
with the earliest deadline first, so a parameter's update, due by the end of
the next backward node, goes before the blocks of a streamed weight's
gradient, due only by the end of the step (:meth:`UpdateWorker.drain`).
What the plan holds memory for follows (:mod:`schedules.step_memory`:
``StateGroup.behind_bytes`` over the stages a group's update may run).  The
math is the same code on the same tensors as on the computing thread, so no
bit changes.  A job that fails is re-raised on the computing thread at its
next wait, and the jobs after it are not run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from typing import Any, Callable

END = math.inf  # the deadline of a job that may run until the step ends


class UpdateWorker:
    """One thread running submitted jobs, earliest deadline first; see the module docstring."""

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._lock = threading.Condition()
        self._due: dict[float, int] = {}  # deadline -> jobs not done
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="poet-updates", daemon=True)
        self._thread.start()

    def submit(self, due: float, job: Callable[..., None], *args: Any) -> None:
        """Queue ``job(*args)``, to be done by the computation of backward node ``due`` (:data:`END`: by the end
        of the step)."""
        self.raise_error()
        with self._lock:
            self._due[due] = self._due.get(due, 0) + 1
            heapq.heappush(self._queue, (due, next(self._order), job, args))
            self._lock.notify_all()

    def waiting(self, due: float) -> int:
        """Jobs with deadline ``due`` not done yet."""
        with self._lock:
            return self._due.get(due, 0)

    def wait_until(self, done: Callable[[dict[float, int]], bool]) -> None:
        """Block until ``done(jobs not done, by deadline)`` holds; re-raise a job's error."""
        with self._lock:
            self._lock.wait_for(lambda: self._error is not None or done(self._due))
        self.raise_error()

    def wait_for(self, node: int) -> None:
        """Block until every job due by the computation of backward node ``node`` is done."""
        self.wait_until(lambda due: not any(d <= node for d in due))

    def drain(self) -> None:
        """Block until every job is done; re-raise a job's error."""
        self.wait_until(lambda due: not due)

    def settle(self) -> BaseException | None:
        """Block until every job is done or dropped; return the error instead of raising it (a step that
        already failed needs its updates stopped, not another exception)."""
        with self._lock:
            self._lock.wait_for(lambda: not self._due)
            error, self._error = self._error, None
        return error

    def raise_error(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self.settle()
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                due, _, job, args = heapq.heappop(self._queue)
                failed = self._error is not None
            try:
                if not failed:  # after a failure the step is lost: the rest is dropped
                    job(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the computing thread
                with self._lock:
                    self._error = self._error or exc
            finally:
                with self._lock:
                    self._due[due] -= 1
                    if not self._due[due]:
                        del self._due[due]
                    self._lock.notify_all()
