"""Planning in worker processes: the solve queue's dispatcher, its time limit, and resuming after a restart.

The API only writes a request into the database (:mod:`server.solve_requests`)
and wakes the dispatcher; it never waits for a solve.  The dispatcher, one
thread, hands queued requests to *slots*: each slot is a
:class:`concurrent.futures.ProcessPoolExecutor` of one ``spawn``-ed worker
process (:mod:`server.solve_worker`), ``solve_workers`` slots in all.  One
worker per executor lets the server stop exactly one solve: a worker killed
breaks its executor, and only that slot is replaced.

Each solve gets :attr:`ServerSettings.solve_time_limit` for
:func:`schedules.plan`, which returns its best plan by then.  Planning can
overrun that limit (building the MILP of a large graph is not interruptible),
so a solve not back ``solve_timeout_margin`` seconds later is stopped: its
worker is killed and replaced, and the request reported ``timed_out``, never
left hanging.  A worker is warm before it is given work (its imports take
seconds), so the deadline measures the solve, not the start-up.

Finished plans are signed with the server key here, in the server process,
and stored once.  A server that stops hands its running solves back to the
queue.  A server killed mid-solve leaves its request ``solving``:

- on SQLite, the embedded one-process deployment, the next start queues every
  such request again at once;
- on PostgreSQL several processes share the database and a ``solving``
  request may be another process's running solve, so it is queued again (by
  whichever process looks first) only once its time limit, margin and
  :data:`ABANDON_GRACE` have passed (:func:`solve_requests.requeue_abandoned`:
  only then can no live process still be solving it).  Every process looks at
  start and every :data:`ABANDONED_SWEEP_SECONDS` (on SQLite too, for a
  second process over the same file).

Each process claims a request atomically, so no request is solved by two of
them at once.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable

from common.backoff import Backoff
from schedules.errors import FormatError, PlannerError
from schedules.schedule import Schedule
from server import solve_requests, solve_worker
from server.config import ServerSettings
from server.db.engine import Database
from server.keys import ServerKey

log = logging.getLogger("poet-server")

IDLE_POLL_SECONDS = 1.0  # how often the dispatcher looks at the queue when nothing wakes it
SLOT_RESTART_FIRST = 5.0  # seconds before a worker that failed to start is started again, doubling ...
SLOT_RESTART_MAX = 300.0  # ... up to this while starts keep failing
ABANDON_GRACE = 30.0  # seconds past a solve's time limit and margin before it counts as abandoned (clock skew)
ABANDONED_SWEEP_SECONDS = 30.0  # how often the dispatcher looks for abandoned solves

SolveObserver = Callable[[str, float], None]  # (final status, seconds) after each solve


@dataclass
class _Running:
    request_id: str
    future: Future
    started: float  # time.monotonic()
    deadline: float  # time.monotonic()


@dataclass
class _Slot:
    executor: ProcessPoolExecutor
    ready: Future  # the warm-up; its result is the worker's process id
    job: _Running | None = None
    start_failed: bool = False  # its failure to start is counted, and a new one waits for the backoff

    @property
    def free(self) -> bool:
        return self.job is None and self.ready.done() and self.ready.exception() is None

    def kill(self) -> None:
        """Stop the worker now (SIGKILL). Its pool breaks and the pool's manager thread ends on its own; the
        executor is shut down (and that thread joined) only at :meth:`SolveService.stop`, because
        ``shutdown(wait=False)`` would forget the thread, and one still running at interpreter exit races
        ``concurrent.futures``' exit hook for its wake-up pipe (EBADF traceback on SIGTERM)."""
        if self.ready.done() and self.ready.exception() is None:
            try:
                os.kill(self.ready.result(), signal.SIGKILL)
            except ProcessLookupError:
                pass


class SolveService:
    """The dispatcher and its worker slots; :meth:`start` and :meth:`stop` follow the server's lifespan."""

    def __init__(self, settings: ServerSettings, database: Database, key: ServerKey,
                 observe: SolveObserver | None = None) -> None:
        self.settings = settings
        self.db = database
        self.key = key
        self._observe = observe or (lambda status, seconds: None)
        self._context = multiprocessing.get_context("spawn")
        self._slots: list[_Slot] = []
        self._retired: list[ProcessPoolExecutor] = []  # executors of killed workers, waited for at stop
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_sweep = 0.0  # time.monotonic() of the next look for abandoned solves
        self._start_backoff = Backoff(SLOT_RESTART_FIRST, SLOT_RESTART_MAX)  # planner processes that fail to start

    # -- lifespan -------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers and the dispatcher; on SQLite, first queue again what a killed server left solving."""
        if self.db.is_sqlite:  # one process: whatever is "solving" now was this server's (module docstring)
            resumed = solve_requests.requeue(self.db)
            if resumed:
                log.info("resuming %d schedule request(s) interrupted when the server stopped", resumed)
        self._slots = [self._new_slot() for _ in range(self.settings.solve_workers)]
        self._thread = threading.Thread(target=self._run, name="poet-solve-dispatcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop dispatching, kill the workers; a solve cut short is queued again for the next start."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        interrupted = [slot.job.request_id for slot in self._slots if slot.job is not None]
        for slot in self._slots:
            slot.kill()
        # a pool's manager thread still running at interpreter exit races its own pipe: wait for every one,
        # those of workers killed and replaced earlier (cancelled, timed out, died) too; a worker still
        # warming up (not yet killable) finishes that and exits on the shutdown's sentinel
        for executor in [*(slot.executor for slot in self._slots), *self._retired]:
            executor.shutdown(wait=True, cancel_futures=True)
        self._slots, self._retired = [], []
        if interrupted:
            solve_requests.requeue(self.db, interrupted)

    def wake(self) -> None:
        """Tell the dispatcher that a request was queued."""
        self._wake.set()

    # -- the dispatcher thread --------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._collect()
                self._stop_cancelled()
                self._expire()
                self._sweep_abandoned()
                self._dispatch()
            except Exception:  # a database hiccup must not end dispatching for good
                log.exception("the solve dispatcher failed; retrying")
                self._stopping.wait(IDLE_POLL_SECONDS)
            self._wake.wait(self._next_timeout())
            self._wake.clear()

    def _next_timeout(self) -> float:
        deadlines = [slot.job.deadline for slot in self._slots if slot.job is not None]
        if not deadlines:
            return IDLE_POLL_SECONDS
        return min(max(min(deadlines) - time.monotonic(), 0.0), IDLE_POLL_SECONDS)

    def _sweep_abandoned(self) -> None:
        if time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + ABANDONED_SWEEP_SECONDS
        grace = self.settings.solve_timeout_margin + ABANDON_GRACE
        resumed = solve_requests.requeue_abandoned(self.db, time.time(), grace)
        if resumed:
            log.info("resuming %d schedule request(s) abandoned by a server that stopped mid-solve", resumed)

    def _new_slot(self) -> _Slot:
        executor = ProcessPoolExecutor(max_workers=1, mp_context=self._context,
                                       initializer=solve_worker.initialise, initargs=(os.getpid(),))
        slot = _Slot(executor, executor.submit(solve_worker.ready))
        slot.ready.add_done_callback(lambda _: self._wake.set())
        return slot

    def _replace(self, slot: _Slot) -> None:
        slot.kill()
        self._retired.append(slot.executor)
        self._slots[self._slots.index(slot)] = self._new_slot()

    def _collect(self) -> None:
        for slot in list(self._slots):
            if slot.ready.done() and slot.ready.exception() is not None and slot.job is None:
                self._restart_failed(slot)
            elif slot.job is not None and slot.job.future.done():
                job, slot.job = slot.job, None
                seconds = time.monotonic() - job.started
                try:
                    self._finish(job.request_id, job.future.result(), seconds)
                except BrokenProcessPool:
                    self._end(job.request_id, solve_requests.FAILED, seconds,
                              "the planner process died while solving (out of memory?); ask with a smaller graph")
                    self._replace(slot)
                except Exception:
                    log.exception("solve of request %s failed", job.request_id)
                    self._end(job.request_id, solve_requests.FAILED, seconds,
                              "the planner failed unexpectedly; the server log has the details")

    def _restart_failed(self, slot: _Slot) -> None:
        now = time.monotonic()
        if not slot.start_failed:
            slot.start_failed = True
            log.error("a planner process failed to start: %s; starting another in %.0f s", slot.ready.exception(),
                      self._start_backoff.failed(now))
        if self._start_backoff.due(now):
            self._replace(slot)

    def _stop_cancelled(self) -> None:
        """Kill the workers of running solves that were cancelled (by their device or an operator, in any
        process); cancelling recorded their end already."""
        running = {slot.job.request_id: slot for slot in self._slots if slot.job is not None}
        for request_id in solve_requests.cancelled_among(self.db, list(running)):
            slot = running[request_id]
            job, slot.job = slot.job, None
            self._replace(slot)
            self._observe(solve_requests.CANCELLED, time.monotonic() - job.started)
            log.info("request %s: cancelled while solving; its planner process was stopped", request_id)

    def _expire(self) -> None:
        now = time.monotonic()
        for slot in list(self._slots):
            if slot.job is not None and now >= slot.job.deadline and not slot.job.future.done():
                job, slot.job = slot.job, None
                self._replace(slot)
                limit = self.settings.solve_time_limit
                self._end(job.request_id, solve_requests.TIMED_OUT, now - job.started,
                          f"the solve ran past its time limit of {limit:g} s (and {self.settings.solve_timeout_margin:g} s "
                          "more) and was stopped; the graph may be too large to plan on this server: ask with fewer "
                          "nodes, or raise --solve-time-limit")

    def _dispatch(self) -> None:
        free = [slot for slot in self._slots if slot.free]
        if not free:
            return
        for request_id in solve_requests.waiting(self.db, len(free)):
            limit = self.settings.solve_time_limit
            job = solve_requests.claim(self.db, request_id, limit, time.time())
            if job is None:
                continue
            slot = free.pop(0)
            self._start_backoff.reset()  # a planner process started and takes work
            started = time.monotonic()
            future = slot.executor.submit(solve_worker.solve, job)
            future.add_done_callback(lambda _: self._wake.set())
            slot.job = _Running(request_id, future, started, started + limit + self.settings.solve_timeout_margin)

    # -- results -------------------------------------------------------------------------
    def _finish(self, request_id: str, result_json: bytes, seconds: float) -> None:
        result = json.loads(result_json)
        if result["outcome"] != solve_requests.DONE:
            self._end(request_id, result["outcome"], seconds, result["error"])
            return
        try:
            schedule = self.key.sign(Schedule.from_json(result["schedule"]))
        except (PlannerError, FormatError) as exc:  # the planner's own output did not load: a bug, reported as such
            log.error("request %s: the planner's schedule does not load: %s", request_id, exc)
            self._end(request_id, solve_requests.FAILED, seconds, f"the planner returned a bad schedule: {exc}")
            return
        solve_requests.finish(self.db, request_id, solve_requests.DONE, now=time.time(), solve_seconds=seconds,
                              schedule=schedule)
        self._observe(solve_requests.DONE, seconds)
        log.info("request %s: schedule %s in %.1f s", request_id, schedule.schedule_id, seconds)

    def _end(self, request_id: str, status: str, seconds: float, error: str) -> None:
        solve_requests.finish(self.db, request_id, status, now=time.time(), solve_seconds=seconds, error=error)
        self._observe(status, seconds)
        log.info("request %s: %s after %.1f s: %s", request_id, status, seconds, error)
