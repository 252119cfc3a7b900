"""Schedule requests in the database: parsed, deduplicated, queued, claimed, finished.

Identical requests share one row and so one solve and one stored schedule.
Identical means the same *dedupe key*: the SHA-256 of the canonical JSON of
the graph's fingerprint (its structure: :attr:`TrainingGraph.fingerprint`),
the whole device profile, the memory budget's class (the budget rounded down
to 7 significant bits: classes 1.6 % apart), the runtime budget and the
training the step is planned for (optimizer, accumulation, clipping: a whole
step's plan; none for activations alone).  A fleet
of many devices in a few device classes therefore costs a few solves.

A request moves ``queued`` -> ``solving`` -> ``done`` | ``failed`` |
``timed_out`` (:data:`server.db.models.SOLVE_STATUSES`), or is ``cancelled``
while queued or solving (by the device that asked, or an operator: the
process solving it stops its worker).  An identical request to one that is
``done`` or ``failed`` (infeasible) gets that answer at once; one that
``timed_out`` is queued again only when the server's time limit has grown
since, one ``cancelled`` at once.

Several server processes may share the database (PostgreSQL), so every step
is safe against another process doing the same at the same moment: identical
requests inserted at once end as one row (the unique ``dedupe_key``; the loser
of the insert takes the winner's row), a request is claimed by one atomic
``UPDATE ... WHERE status = 'queued'``, and a ``solving`` request is taken
back into the queue only when no live process can still be solving it (its
time limit and margin are long past: :func:`requeue_abandoned`).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from common.canonical import canonical_json
from schedules.budgets import budget_class
from schedules.device import DeviceProfile
from schedules.errors import FormatError, PlannerError
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.step_memory import TrainingSpec
from server.db.engine import Database
from server.db.models import SolveRequest
from server.errors import (RequestRejectedError, SolveCancelRefusedError, SolveQueueFullError, SolveQuotaError,
                           UnknownSolveRequestError)
from server.registry import store_schedule

QUEUED, SOLVING, DONE, FAILED, TIMED_OUT, CANCELLED = "queued", "solving", "done", "failed", "timed_out", "cancelled"


@dataclass(frozen=True)
class SolveInput:
    """What a schedule is asked for: graph, device profile, memory budget (bytes), runtime budget (factor), and
    the training a whole step is planned for (``None``: activations alone)."""

    graph: TrainingGraph
    device: DeviceProfile
    memory_budget: int
    runtime_budget: float | None
    training: TrainingSpec | None = None

    @property
    def dedupe_key(self) -> str:
        """64 hex digits naming the request; equal for identical requests (module docstring)."""
        identity = {"graph": self.graph.fingerprint, "device": self.device.to_dict(),
                    "memory_budget": self.memory_budget, "runtime_budget": self.runtime_budget}
        if self.training is not None:  # absent for activations alone: such requests keep their keys
            identity["training"] = self.training.to_dict()
        return hashlib.sha256(canonical_json(identity)).hexdigest()


def parse_solve_input(graph: Any, device: Any, memory_budget: int, runtime_budget: float | None,
                      max_nodes: int, training: Any = None) -> SolveInput:
    """Load the graph and device profile with the planner's own loaders; the memory budget is rounded down to
    its class (:func:`schedules.budgets.budget_class`), so that devices asking for nearly the same budget share
    one solve, and each gets a schedule that fits its own budget.

    Raises
    ------
    RequestRejectedError
        Either does not load (the loader's message, naming the part), holds a NUL character, or the graph
        has more than ``max_nodes`` nodes, or a budget is not a positive finite number.
    """
    if memory_budget <= 0:
        raise RequestRejectedError(f"memory_budget must be > 0 bytes, got {memory_budget}")
    if runtime_budget is not None and not (math.isfinite(runtime_budget) and runtime_budget > 0):
        raise RequestRejectedError(f"runtime_budget must be a finite factor > 0 or null, got {runtime_budget}")
    for part, data in (("graph", graph), ("device", device)):
        if _holds_nul(data):  # PostgreSQL's text cannot store it (names reach text columns and error messages)
            raise RequestRejectedError(f"{part}: text may not contain NUL characters")
    loaded_graph = _load("graph", TrainingGraph.from_dict, graph)
    if loaded_graph.size > max_nodes:
        raise RequestRejectedError(f"graph has {loaded_graph.size} nodes; this server plans graphs of at most "
                                   f"{max_nodes} (cut the model into fewer segments)")
    loaded_device = _load("device", DeviceProfile.from_dict, device)
    spec = None if training is None else _load("training", TrainingSpec.from_dict, training)
    if spec is not None and not loaded_graph.parameters:
        raise RequestRejectedError("training: the graph has no parameter layout to plan a whole step with; "
                                   "profile the model again with this release")
    return SolveInput(loaded_graph, loaded_device, budget_class(memory_budget), runtime_budget, spec)


def _holds_nul(data: Any) -> bool:
    pending = [data]
    while pending:  # a loop, not recursion: the body's nesting depth is the sender's choice
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _load(part: str, loader: Any, data: Any) -> Any:
    try:
        return loader(data)
    except (PlannerError, FormatError) as exc:
        raise RequestRejectedError(f"{part}: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:  # shapes a loader did not expect
        raise RequestRejectedError(f"{part}: malformed ({type(exc).__name__}: {exc})") from exc


def enqueue(db: Database, item: SolveInput, *, time_limit: float, max_queued: int, now: float,
            requested_by: int | None = None, max_per_device: int | None = None) -> tuple[SolveRequest, bool]:
    """The request for ``item``: the existing identical one, or a new queued one; and whether it is new to the queue.

    Raises
    ------
    SolveQueueFullError
        ``max_queued`` requests are waiting already.
    SolveQuotaError
        The device ``requested_by`` has ``max_per_device`` new requests waiting already (asking for one that
        exists, its own or another device's, is always answered).
    """
    key = item.dedupe_key
    try:
        with db.write() as session:
            existing = session.scalar(select(SolveRequest).where(SolveRequest.dedupe_key == key))
            if existing is not None:
                return existing, _queue_again_if_due(existing, time_limit, requested_by)
            if requested_by is not None and max_per_device is not None:
                own = session.scalar(select(func.count()).select_from(SolveRequest).where(
                    SolveRequest.status.in_((QUEUED, SOLVING)), SolveRequest.requested_by == requested_by))
                if own >= max_per_device:
                    raise SolveQuotaError(f"this device has {own} schedule requests waiting or solving already; ask "
                                          "again when one is answered")
            waiting = session.scalar(select(func.count()).select_from(SolveRequest)
                                     .where(SolveRequest.status == QUEUED))
            if waiting >= max_queued:
                raise SolveQueueFullError(f"{waiting} schedule requests are waiting already; ask again later")
            row = _new_request(item, key, time_limit, now, requested_by)
            session.add(row)
            return row, True
    except IntegrityError:  # an identical request was inserted at the same moment (here or in another process)
        with db.read() as session:
            existing = session.scalar(select(SolveRequest).where(SolveRequest.dedupe_key == key))
        if existing is None:  # the conflict was not the dedupe key: not ours to hide
            raise
        return existing, False


def _new_request(item: SolveInput, key: str, time_limit: float, now: float, requested_by: int | None) -> SolveRequest:
    return SolveRequest(
        id=uuid.uuid4().hex, dedupe_key=key, graph_fingerprint=item.graph.fingerprint, model=item.graph.model[:200],
        device_profile_name=item.device.name[:200], graph=canonical_json(item.graph.to_dict()),
        device_profile=item.device.to_dict(), memory_budget=item.memory_budget, runtime_budget=item.runtime_budget,
        training=None if item.training is None else item.training.to_dict(),
        status=QUEUED, time_limit=time_limit, created_at=now, requested_by=requested_by,
    )


def _queue_again_if_due(row: SolveRequest, time_limit: float, requested_by: int | None) -> bool:
    """Queue an identical request again when it was cancelled, or timed out under a smaller time limit."""
    if not (row.status == CANCELLED or (row.status == TIMED_OUT and time_limit > row.time_limit)):
        return False
    row.status, row.error, row.solve_seconds, row.started_at, row.finished_at = QUEUED, None, None, None, None
    row.time_limit, row.requested_by = max(time_limit, row.time_limit), requested_by
    return True


def cancel(db: Database, request_id: str, now: float, *, reason: str, device_id: int | None = None) -> SolveRequest:
    """Cancel a queued or solving request (the process solving it stops its worker); the request as it now is.

    ``device_id``: a device cancels, and only its own request (the device that asked first); ``None``: an
    operator.  A device that asked for an identical request later finds it ``cancelled`` and asks again, which
    queues it again.

    Raises
    ------
    UnknownSolveRequestError
        No request has this id.
    SolveCancelRefusedError
        The request is finished (its answer stays), or another device asked for it.
    """
    with db.write() as session:
        row = session.get(SolveRequest, request_id)
        if row is None:
            raise UnknownSolveRequestError("no schedule request has this id")
        if device_id is not None and row.requested_by != device_id:
            raise SolveCancelRefusedError("another device asked for this schedule request; a device cancels only "
                                          "its own")
        if row.status not in (QUEUED, SOLVING):
            raise SolveCancelRefusedError(f"this schedule request is {row.status.replace('_', ' ')} already; "
                                          "only a queued or solving one can be cancelled")
        row.status, row.error, row.finished_at = CANCELLED, f"cancelled by {reason}", now
        if row.started_at is not None:
            row.solve_seconds = max(now - row.started_at, 0.0)
        return row


def cancelled_among(db: Database, request_ids: list[str]) -> list[str]:
    """Which of these requests are cancelled."""
    if not request_ids:
        return []
    with db.read() as session:
        return list(session.scalars(select(SolveRequest.id).where(SolveRequest.id.in_(request_ids),
                                                                  SolveRequest.status == CANCELLED)))


def find(db: Database, request_id: str) -> SolveRequest | None:
    """The request with that id, or ``None``."""
    with db.read() as session:
        return session.get(SolveRequest, request_id)


def waiting(db: Database, limit: int) -> list[str]:
    """Ids of up to ``limit`` queued requests, oldest first."""
    with db.read() as session:
        return list(session.scalars(select(SolveRequest.id).where(SolveRequest.status == QUEUED)
                                    .order_by(SolveRequest.created_at, SolveRequest.id).limit(limit)))


def claim(db: Database, request_id: str, time_limit: float, now: float) -> bytes | None:
    """Mark a queued request ``solving``; return its job (:mod:`server.solve_worker`), or ``None`` if it is taken."""
    with db.write() as session:
        claimed = session.execute(update(SolveRequest).where(SolveRequest.id == request_id,
                                                             SolveRequest.status == QUEUED)
                                  .values(status=SOLVING, started_at=now, time_limit=time_limit))
        if claimed.rowcount != 1:
            return None
        row = session.get(SolveRequest, request_id)
        return canonical_json({"graph": json.loads(row.graph), "device": row.device_profile,
                               "memory_budget": row.memory_budget, "runtime_budget": row.runtime_budget,
                               "training": row.training, "time_limit": time_limit})


def finish(db: Database, request_id: str, status: str, *, now: float, solve_seconds: float,
           error: str | None = None, schedule: Schedule | None = None) -> None:
    """Record a request's end; a ``done`` one with its (signed) schedule, stored once."""
    try:
        _finish(db, request_id, status, now, solve_seconds, error, schedule)
    except IntegrityError:  # another process stored the same schedule at the same moment: now it is there to share
        _finish(db, request_id, status, now, solve_seconds, error, schedule)


def _finish(db: Database, request_id: str, status: str, now: float, solve_seconds: float, error: str | None,
            schedule: Schedule | None) -> None:
    with db.write() as session:
        row = session.get(SolveRequest, request_id)
        if row is None or row.status == CANCELLED:  # cancelled while it ran: the answer is not wanted
            return
        if schedule is not None:
            row.schedule_id = store_schedule(session, schedule, now).schedule_id
        row.status, row.error, row.solve_seconds, row.finished_at = status, error, solve_seconds, now


def requeue(db: Database, request_ids: list[str] | None = None) -> int:
    """Put these ``solving`` requests back in the queue (this process stopped while solving them); all of them
    when ``request_ids`` is ``None`` (safe only where no other process can be solving: see :mod:`server.solves`)."""
    query = update(SolveRequest).where(SolveRequest.status == SOLVING)
    if request_ids is not None:
        query = query.where(SolveRequest.id.in_(request_ids))
    with db.write() as session:
        return session.execute(query.values(status=QUEUED, started_at=None)).rowcount


def requeue_abandoned(db: Database, now: float, grace: float) -> int:
    """Queue again the ``solving`` requests no process can still be solving: claimed more than their time limit
    plus ``grace`` seconds ago (a process that stopped mid-solve without handing them back: killed, or lost).

    A live process stops each of its solves at the time limit and its margin, so ``grace`` at least that margin
    (plus clock skew between machines) never takes a solve from under a running process.
    """
    abandoned = (SolveRequest.status == SOLVING) & (SolveRequest.started_at + SolveRequest.time_limit + grace < now)
    with db.write() as session:
        return session.execute(update(SolveRequest).where(abandoned).values(status=QUEUED, started_at=None)
                               .execution_options(synchronize_session=False)).rowcount


def count_by_status(db: Database) -> dict[str, int]:
    """How many requests are in each status (every status present, zeros included)."""
    with db.read() as session:
        counts = dict(session.execute(select(SolveRequest.status, func.count()).group_by(SolveRequest.status)).all())
    return {status: counts.get(status, 0) for status in (QUEUED, SOLVING, DONE, FAILED, TIMED_OUT, CANCELLED)}
