"""The worker's events: what one side writes, the other reads back as the same typed event; anything else is
dropped with a log line and never stops the daemon."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from agent.daemon import events
from agent.daemon.events import (CheckpointEvent, DataEvent, ErrorEvent, EvalEvent, ReadyEvent, StateEvent,
                                 StepEvent, StoppedEvent, decode, encode)

SAMPLES = [
    StateEvent("preparing", "loading the data and the schedule"),
    DataEvent(description="digits.npz: 512 samples", skipped=3),
    ReadyEvent(schedule_id="s-1", schedule_from="server", memory_budget=9_200_000, predicted_peak=9_100_000,
               baseline_rss=60_000_000, steps_done=12, predicted_parts={"activations": 5, "runtime": 7},
               resumed_from="/var/lib/poet/ckpt-12", skipped_checkpoints=["ckpt-14: bad checksum"],
               energy_source="ina219"),
    StepEvent(steps_done=13, loss=0.25, seconds=0.5, peak_bytes=None, bound_bytes=9_300_000,
              parts={"activations": 1}, energy_j=0.75),
    CheckpointEvent(steps_done=13, seconds=0.02),
    EvalEvent(loss=0.3, accuracy=0.875, samples=64),
    StoppedEvent(steps_done=13, reason="stop requested", seconds_after_step=0.1, wall_time=1.7e9),
    ErrorEvent(message="disk full", exit_code=7, error_class="CheckpointError"),
]


def test_every_kind_of_event_has_a_sample_here() -> None:
    assert {type(e).kind for e in SAMPLES} == set(events.EVENT_TYPES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).kind)
def test_an_event_reads_back_as_what_was_written(event: events.WorkerEvent) -> None:
    line = encode(event)
    assert "\n" not in line and json.loads(line)["event"] == type(event).kind
    assert decode(line) == event
    assert decode(line.encode()) == event


@pytest.mark.parametrize("line", [
    b"not json at all",
    b"[1, 2]",
    b'{"event": "launch", "steps_done": 1}',  # a kind this release does not know
    b'{"steps_done": 1}',  # no kind
    b'{"event": "checkpoint", "steps_done": 1}',  # a field missing
    b'{"event": "checkpoint", "steps_done": 1, "seconds": 0.1, "extra": 2}',  # a field unknown
    b'{"event": "checkpoint", "steps_done": "1", "seconds": 0.1}',  # a field of the wrong type
    b'{"event": "checkpoint", "steps_done": true, "seconds": 0.1}',  # a bool is not a count
    b'{"event": "step", "steps_done": 1, "loss": 0.1, "seconds": 1, "peak_bytes": 5, "bound_bytes": 4, "parts": []}',
])
def test_a_line_that_is_no_event_is_logged_and_dropped(line: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="poet-agent"):
        assert decode(line) is None
    assert "training process wrote" in caplog.text


def test_every_field_type_is_one_the_reader_checks() -> None:
    for cls in events.EVENT_TYPES.values():
        for f in dataclasses.fields(cls):
            assert str(f.type) in events._SIMPLE, f"{cls.__name__}.{f.name}: {f.type}"
