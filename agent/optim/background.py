"""Updates of optimizer state on flash, run on a thread of their own while the backward pass goes on.

An update whose state lives on flash spends most of its time waiting for the
state's chunks to be read and written; run on the computing thread it would
hold the backward pass for all of it.  :class:`UpdateWorker` runs such
updates one after another on its own thread, tagged with the backward node
that made their gradients final.  The executor says when a backward node has
been computed (:meth:`UpdateWorker.wait_before`): every update tagged with an
earlier node must then be done, so an update runs beside the computation of
the next backward node and no longer -- which is what the plan holds memory
for (:mod:`schedules.step_memory`: ``StateGroup.behind_bytes``).  The math is
the same code on the same tensors as on the computing thread, so no bit
changes.  An update that fails is re-raised on the computing thread at its
next wait.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Hashable


class UpdateWorker:
    """One thread running submitted updates in order; see the module docstring."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Hashable, Callable[..., None], tuple[Any, ...]] | None] = \
            queue.SimpleQueue()
        self._done = threading.Condition()
        self._pending: dict[Hashable, int] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="poet-updates", daemon=True)
        self._thread.start()

    def submit(self, tag: Hashable, job: Callable[..., None], *args: Any) -> None:
        """Queue ``job(*args)``, done after every job queued before it."""
        self.raise_error()
        with self._done:
            self._pending[tag] = self._pending.get(tag, 0) + 1
        self._jobs.put((tag, job, args))

    def pending(self, tag: Hashable) -> int:
        """Jobs with ``tag`` not done yet."""
        with self._done:
            return self._pending.get(tag, 0)

    def wait_until(self, done: Callable[[dict[Hashable, int]], bool]) -> None:
        """Block until ``done(pending jobs by tag)`` holds; re-raise a job's error."""
        with self._done:
            self._done.wait_for(lambda: self._error is not None or done(self._pending))
        self.raise_error()

    def wait_before(self, node: int) -> None:
        """Block until every job tagged with a backward node before ``node`` is done."""
        self.wait_until(lambda pending: not any(isinstance(t, int) and t < node for t in pending))

    def drain(self) -> None:
        """Block until every job is done; re-raise a job's error."""
        self.wait_until(lambda pending: not pending)

    def settle(self) -> BaseException | None:
        """Block until every job is done or failed; return the error instead of raising it (a step that
        already failed needs its updates stopped, not another exception)."""
        with self._done:
            self._done.wait_for(lambda: not self._pending)
            error, self._error = self._error, None
        return error

    def raise_error(self) -> None:
        with self._done:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        self.settle()
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            tag, job, args = item
            try:
                if self._error is None:  # after a failure the step is lost: the rest is not run
                    job(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the computing thread
                with self._done:
                    self._error = self._error or exc
            finally:
                with self._done:
                    self._pending[tag] -= 1
                    if not self._pending[tag]:
                        del self._pending[tag]
                    self._done.notify_all()
