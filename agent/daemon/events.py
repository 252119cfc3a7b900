"""What the training process tells the daemon: one typed event per JSON line, written and read here alone.

The worker (:mod:`agent.daemon.worker`) writes events with :func:`encode`; the daemon
(:mod:`agent.daemon.supervisor`) reads them back with :func:`decode`.  Each event is a frozen dataclass whose
fields are the line's keys, and ``event`` names its kind, so adding a field is one edit that both sides see.
A line that is not an event this release knows (a library's stray print, a field missing or of the wrong
type) decodes to ``None`` and is logged, never raised: the daemon must outlive whatever its child writes.

Torch-free on purpose: the waiting daemon imports this and must stay small.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

log = logging.getLogger("poet-agent")


@dataclass(frozen=True)
class StateEvent:
    """The worker's phase changed (``preparing`` while it loads data and the schedule)."""

    kind: ClassVar[str] = "state"
    state: str
    reason: str


@dataclass(frozen=True)
class DataEvent:
    """The local data set opened: what it holds, and how many samples were unreadable and skipped."""

    kind: ClassVar[str] = "data"
    description: str
    skipped: int


@dataclass(frozen=True)
class ReadyEvent:
    """The schedule is verified and the checkpoint restored: training starts at ``steps_done``."""

    kind: ClassVar[str] = "ready"
    schedule_id: str
    schedule_from: str
    memory_budget: int
    predicted_peak: int
    baseline_rss: int
    steps_done: int
    predicted_parts: dict[str, int] | None = None
    resumed_from: str | None = None
    skipped_checkpoints: list[str] = field(default_factory=list)
    energy_source: str | None = None


@dataclass(frozen=True)
class StepEvent:
    """One training step committed: its loss, time, peak memory against the bound, and energy."""

    kind: ClassVar[str] = "step"
    steps_done: int
    loss: float
    seconds: float
    peak_bytes: int | None  # None where the process's RSS could not be read
    bound_bytes: int
    parts: dict[str, int] | None = None
    energy_j: float | None = None


@dataclass(frozen=True)
class CheckpointEvent:
    """A checkpoint holding ``steps_done`` steps is on disk; writing it took ``seconds``."""

    kind: ClassVar[str] = "checkpoint"
    steps_done: int
    seconds: float


@dataclass(frozen=True)
class EvalEvent:
    """The model's loss and accuracy on the device's held-out samples at the end of a window."""

    kind: ClassVar[str] = "eval"
    loss: float
    accuracy: float
    samples: int


@dataclass(frozen=True)
class StoppedEvent:
    """The window ended cleanly: why, after how many steps, and how long after the last step ended."""

    kind: ClassVar[str] = "stopped"
    steps_done: int
    reason: str
    seconds_after_step: float
    wall_time: float


@dataclass(frozen=True)
class ErrorEvent:
    """The window failed: the message, the exit code the worker ends with, and the error's class name."""

    kind: ClassVar[str] = "error"
    message: str
    exit_code: int
    error_class: str


WorkerEvent = Union[StateEvent, DataEvent, ReadyEvent, StepEvent, CheckpointEvent, EvalEvent, StoppedEvent,
                    ErrorEvent]
EVENT_TYPES: dict[str, type] = {cls.kind: cls for cls in WorkerEvent.__args__}  # type: ignore[attr-defined]


def encode(event: WorkerEvent) -> str:
    """One JSON line (without the newline) for ``event``: its fields, and ``event`` naming its kind."""
    return json.dumps({"event": event.kind, **dataclasses.asdict(event)})


def decode(line: bytes | str) -> WorkerEvent | None:
    """The event on ``line``, or ``None`` (logged) when it is not one this release knows."""
    try:
        data = json.loads(line)
    except ValueError:
        log.warning("training process wrote a line that is not an event: %.200r", line)
        return None
    cls = EVENT_TYPES.get(data.get("event")) if isinstance(data, dict) else None
    if cls is None:
        log.warning("training process wrote an unknown event: %.200r", line)
        return None
    data.pop("event")
    try:
        event = cls(**data)
        _check_types(event)
    except (TypeError, ValueError) as exc:
        log.warning("training process wrote a malformed %s event (%s): %.200r", cls.kind, exc, line)
        return None
    return event


_SIMPLE = {"str": str, "int": int, "float": (int, float), "dict[str, int] | None": (dict, type(None)),
           "str | None": (str, type(None)),
           "int | None": (int, type(None)), "float | None": (int, float, type(None)), "list[str]": list}


def _check_types(event: Any) -> None:
    """Refuse a field of the wrong JSON type (``bool`` is never a number here)."""
    for f in dataclasses.fields(event):
        value, hint = getattr(event, f.name), str(f.type)  # a string: annotations are not evaluated
        expected = _SIMPLE[hint]
        if isinstance(value, bool) or not isinstance(value, expected):
            raise TypeError(f"{f.name} must be {hint}, got {type(value).__name__}")


__all__ = ["CheckpointEvent", "DataEvent", "EVENT_TYPES", "ErrorEvent", "EvalEvent", "ReadyEvent", "StateEvent",
           "StepEvent", "StoppedEvent", "WorkerEvent", "decode", "encode"]
