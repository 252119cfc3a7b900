"""The training process: prepares the workload and trains one window, reporting to the daemon as it goes.

The daemon (:mod:`agent.daemon.supervisor`) starts ``python -m
agent.daemon.worker --config FILE --events-fd N`` when the device becomes
eligible, so torch is loaded only while training and its memory goes back to
the device when the window ends.  The worker writes one JSON object per line
to file descriptor N, the typed events of :mod:`agent.daemon.events`
(``state``, ``data``, ``ready``, ``step``, ``checkpoint``, ``eval``,
``stopped``, ``error``); anything printed, by us or a library, goes to
standard error, the daemon's log.

Stopping: ``SIGUSR1`` or ``SIGTERM`` asks it to stop at the next step
boundary; it checkpoints and exits 0.  A step still running
``training.step_cancel_seconds`` after that request is cancelled between
instructions (the model stays as it was before the step).  It also stops,
checkpointing, after ``training.steps_per_window`` steps.  Errors exit with
the project's exit codes after an ``error`` event.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any, TextIO

from agent.daemon.events import (CheckpointEvent, DataEvent, ErrorEvent, EvalEvent, ReadyEvent, StateEvent,
                                 StepEvent, StoppedEvent, WorkerEvent, encode)
from common.errors import PoetEdgeError
from common.exit_codes import ExitCode, exit_code_for


class Events:
    """JSON lines to the daemon, flushed at once (the daemon reads them as they come).

    When the daemon is gone (killed, crashed: the pipe is broken) the worker is an orphan: :attr:`orphaned`
    turns true, the window stops at the next step boundary with a checkpoint, and nothing more is written.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.orphaned = False

    def emit(self, event: WorkerEvent) -> None:
        if self.orphaned:
            return
        try:
            self.stream.write(encode(event) + "\n")
            self.stream.flush()
        except BrokenPipeError:
            self.orphaned = True
            logging.getLogger("poet-agent").warning("the agent daemon is gone: stopping after this step, "
                                                    "with a checkpoint")
            broken, self.stream = self.stream, open(os.devnull, "w")
            try:  # what is still buffered must not fail again, as a traceback, when the stream is collected
                broken.close()
            except OSError:
                pass


class StopRequest:
    """Set by a signal: stop after the step in progress, or cancel it once it has run on too long."""

    def __init__(self, cancel_after: float) -> None:
        self.since: float | None = None
        self.cancel_after = cancel_after

    def handle(self, signum: int, frame: Any) -> None:
        if self.since is None:
            self.since = time.monotonic()

    @property
    def requested(self) -> bool:
        return self.since is not None

    def cancel_now(self) -> bool:
        """Asked by the executor before each instruction."""
        return self.since is not None and time.monotonic() - self.since >= self.cancel_after


def run_window(config_path: str, events: Events) -> int:
    """Prepare, restore, train up to a window of steps; returns the exit code."""
    from agent.config import load_config

    config = load_config(config_path)
    stop = StopRequest(config.training.step_cancel_seconds)
    signal.signal(signal.SIGUSR1, stop.handle)
    signal.signal(signal.SIGTERM, stop.handle)
    _lower_priority(config.training.nice)

    import torch

    from engine import rss
    from agent.prepare import prepare
    from agent.daemon.trainer import Trainer
    from agent.data import open_dataset
    from engine.errors import StepCancelled
    from agent.zoo import token_vocabulary

    torch.set_num_threads(config.workload.compute_threads)
    rss.return_freed_memory()  # as profile and validate do: the step's RSS then follows the budget
    events.emit(StateEvent("preparing", "loading the data and the schedule"))
    prepared = prepare(config, say=lambda text: events.emit(StateEvent("preparing", text)))
    shape = tuple(prepared.workload.inputs.shape) if isinstance(prepared.workload.inputs, torch.Tensor) \
        else tuple(prepared.workload.inputs[0].shape)
    data = open_dataset(config.data.path, shape, holdout=config.data.holdout, seed=config.workload.seed,
                        tokenizer=config.data.tokenizer, vocabulary=token_vocabulary(prepared.workload.model))
    events.emit(DataEvent(description=data.describe(), skipped=data.skipped))
    with _meter(config, prepared) as meter:
        trainer = Trainer(config, prepared, data, meter=meter)
        try:
            loaded = trainer.restore()
            events.emit(ReadyEvent(
                schedule_id=prepared.schedule.schedule_id, schedule_from=prepared.schedule_from,
                memory_budget=prepared.schedule.memory_budget, predicted_peak=prepared.schedule.predicted_peak_bytes,
                predicted_parts=prepared.schedule.step.parts(), baseline_rss=trainer.training.baseline_rss,
                steps_done=trainer.steps_done, resumed_from=str(loaded.path) if loaded and loaded.steps_done else None,
                skipped_checkpoints=list(loaded.skipped) if loaded else [],
                energy_source=getattr(meter, "source", None)))
            reason, step_ended = _train(config, trainer, stop, events, StepCancelled)
            seconds = trainer.checkpoint()
            events.emit(CheckpointEvent(steps_done=trainer.steps_done, seconds=seconds))
            if not stop.requested:  # a device no longer idle gets its CPU back now, not after an evaluation
                evaluation = trainer.evaluate()
                if evaluation is not None:
                    events.emit(EvalEvent(loss=evaluation.loss, accuracy=evaluation.accuracy,
                                          samples=evaluation.samples))
            events.emit(StoppedEvent(steps_done=trainer.steps_done, reason=reason,
                                     seconds_after_step=time.monotonic() - step_ended, wall_time=time.time()))
        finally:
            trainer.close()
    return ExitCode.OK


def _train(config: Any, trainer: Any, stop: StopRequest, events: Events, cancelled: type) -> tuple[str, float]:
    """Steps until the window is done or a stop is asked for; returns why training stopped, and when (monotonic
    clock) the last step, committed or cancelled, ended."""
    ended = time.monotonic()
    for _ in range(config.training.steps_per_window):
        if stop.requested:
            return "stop requested", ended
        if events.orphaned:
            return "the agent daemon is gone", ended
        try:
            result = trainer.step(cancel=stop.cancel_now)
        except cancelled as exc:
            return f"stop requested; {exc} after {config.training.step_cancel_seconds:g} s", time.monotonic()
        ended = time.monotonic()
        events.emit(StepEvent(steps_done=result.steps_done, loss=result.loss, seconds=result.seconds,
                              peak_bytes=result.memory_bytes,
                              bound_bytes=result.budget_bytes + config.training.memory_tolerance,
                              parts=result.parts, energy_j=result.energy_j))
        if result.steps_done % config.training.checkpoint_every == 0 and not stop.requested:
            events.emit(CheckpointEvent(steps_done=result.steps_done, seconds=trainer.checkpoint()))
    return f"window done ({config.training.steps_per_window} steps)", ended


def _meter(config: Any, prepared: Any) -> Any:
    """The configured energy meter (the profile's nominal-power estimate as a fallback), opened for the window."""
    from contextlib import nullcontext

    from engine.energy import EnergyMeterError, detect_meter
    from engine.profile import device_estimate

    try:
        return detect_meter(config.energy, powers=device_estimate(prepared.device).powers,
                            sysfs_root=config.device.sysfs_root / "sys").meter
    except EnergyMeterError as exc:
        logging.getLogger("poet-agent").warning("no energy figures: %s", exc)
        return nullcontext(None)


def _lower_priority(nice: int) -> None:
    """Run at ``nice`` or lower priority: the idle monitor counts niced work as the device's own."""
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="poet-agent-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--events-fd", type=int, default=1, help="where the JSON events go (default stdout)")
    args = parser.parse_args(argv)
    events = Events(os.fdopen(os.dup(args.events_fd), "w", buffering=1))
    if args.events_fd != 1:  # a library's print must not land between events
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return run_window(args.config, events)
    except (PoetEdgeError, OSError) as exc:
        code = exit_code_for(exc)
        events.emit(ErrorEvent(message=str(exc), exit_code=int(code), error_class=type(exc).__name__))
        return code


if __name__ == "__main__":
    sys.exit(main())
