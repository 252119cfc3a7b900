"""The agent daemon: waits for the device to be idle, charging and cool, then trains in a worker process.

States (``status.STATES``): *waiting* (not eligible, or the window's steps are
done), *preparing* and *training* (a worker process is running: it profiles
and gets a schedule, then trains), *backing off* (the last window failed; the
next try waits longer each time), *stopped*.  Every change is logged with its
reason and written to the status file.

While a worker trains, eligibility is checked every
``eligibility.training_poll_seconds``; when it is lost the worker is asked to
stop at its next step boundary (it checkpoints, then exits).  SIGTERM does the
same and then the daemon exits, well within systemd's stop timeout.  This
process never imports torch: it holds monitors, the status and the worker's
pipe, so a waiting agent costs the device little memory.

With ``[flower] enabled`` the device's Flower SuperNode follows the same
checks (:mod:`agent.federated.supernode`): it runs while the device is eligible
and is stopped, its whole process group, as soon as a check says it is not.
Such a device trains when the federation's rounds ask it to (its ClientApps
train the agent's model on its data under its schedule), never in local
windows of its own: two trainings at once would each take the memory budget.
Its state is *training* while a ClientApp forked by its warm runner runs (as
seen at each eligibility check), *waiting* otherwise.

systemd: ``READY=1`` once running, ``STATUS=`` at every state change,
``WATCHDOG=1`` at half the watchdog interval, ``STOPPING=1`` on the way out.

The reporter (the fleet's heartbeats, :mod:`agent.fleet`) gets the
status at every state change and every ``server.heartbeat_seconds``; it only
queues, so it never holds up this loop.
"""

from __future__ import annotations

import hashlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Protocol

from agent.daemon.events import (CheckpointEvent, DataEvent, ErrorEvent, EvalEvent, ReadyEvent, StateEvent,
                                 StepEvent, StoppedEvent, WorkerEvent, decode)
from agent.daemon import history
from agent.config import AgentConfig
from agent.daemon.notify import Notifier
from agent.schedule_sources import NoReporter, Reporter
from agent.daemon.status import initial_status, unsaved_steps, write_status
from agent.provenance import kept_summary
from agent.monitors import Decision, Eligibility
from common.backoff import Backoff

log = logging.getLogger("poet-agent")

BACKOFF_MAX_SECONDS = 1800.0
STOP_TIMEOUT_SECONDS = 45.0  # below the unit's TimeoutStopSec=60s: the worker's last checkpoint fits
HARD_BOUND_FACTOR = 1.25  # the worker checks each step's peak itself; this catches a runaway between checks


def eligibility_from_config(config: AgentConfig) -> Eligibility:
    """The monitors the config asks for, reading the configured sysfs root."""
    from agent.monitors import IdleMonitor, PowerMonitor, QuietHours, StorageMonitor, ThermalMonitor

    e = config.eligibility
    monitors: list[Any] = [
        PowerMonitor(sysfs_root=config.device.sysfs_root, require_charging=e.require_charging,
                     min_battery_percent=e.min_battery_percent),
        IdleMonitor(max_foreground_percent=e.max_foreground_cpu_percent, idle_seconds=e.idle_seconds,
                    hysteresis_percent=e.cpu_hysteresis_percent),
        ThermalMonitor(limit_c=e.max_temperature_c, hysteresis_c=e.temperature_hysteresis_c,
                       sysfs_root=config.device.sysfs_root),
    ]
    if e.min_free_storage:
        monitors.append(StorageMonitor([config.device.state_dir, config.swap_dir], e.min_free_storage))
    if e.quiet_hours:
        monitors.append(QuietHours(e.quiet_hours))
    return Eligibility(monitors)


def start_jitter(device_name: str, most: float) -> float:
    """This device's wait after becoming eligible: a share of ``most`` fixed by its name, so a fleet's devices
    spread over the interval and each device waits the same every time (its behaviour can be reasoned about)."""
    share = int.from_bytes(hashlib.sha256(device_name.encode()).digest()[:8], "big") / 2 ** 64
    return most * share


class Worker:
    """One training process and the pipe its events come through."""

    def __init__(self, config: AgentConfig, command: list[str] | None, started_at: float,
                 energy_at_start: float) -> None:
        self.started_at = started_at  # the daemon's clock
        self.started_wall = time.time()
        self.energy_at_start = energy_at_start  # the status's energy_j when the window began
        self.steps_from = 0  # what the checkpoint held at the start (from the ready event)
        self.capped = False  # stopped for training.max_window_seconds
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        args = command or [sys.executable, "-m", "agent.daemon.worker"]
        self.process = subprocess.Popen([*args, "--config", str(config.path), "--events-fd", str(write_fd)],
                                        pass_fds=(write_fd,), stdin=subprocess.DEVNULL)
        os.close(write_fd)
        self.fd = read_fd
        self._buffer = b""
        self.stop_sent_at: float | None = None
        self.stop_reason = ""  # why the daemon asked it to stop (eligibility lost, the agent stopping)
        self.killed_reason: str | None = None

    def read_events(self) -> list[WorkerEvent]:
        """Events written since the last call (whole lines only; a line that is no event is logged and left)."""
        try:
            while chunk := os.read(self.fd, 65536):
                self._buffer += chunk
        except BlockingIOError:
            pass
        *lines, self._buffer = self._buffer.split(b"\n")
        return [event for line in lines if line.strip() and (event := decode(line)) is not None]

    def request_stop(self, now: float, why: str) -> None:
        if self.stop_sent_at is None and self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            self.stop_sent_at, self.stop_reason = now, why

    def kill(self, reason: str) -> None:
        self.killed_reason = reason
        if self.process.poll() is None:
            self.process.kill()

    def rss_bytes(self) -> int | None:
        try:
            with open(f"/proc/{self.process.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        os.close(self.fd)


class Federation(Protocol):
    """The device's link to a federation (its Flower SuperNode, :mod:`agent.federated.supernode`), which the
    daemon keeps connected only while the device may train and use its network (:mod:`agent.application`
    hands it over)."""

    state: str

    def follow(self, eligible: bool, now: float) -> None:
        """Connect or stay connected while ``eligible``, else disconnect."""

    def clientapps(self) -> int:
        """How many of its ClientApps are running now (a round's work the daemon waits for)."""

    def stop(self, state: str = "stopped") -> None:
        """Disconnect for good, with ``state`` as its last word."""


class Daemon:
    """``poet-edge agent run``: see the module docstring.  ``federation``: where ``[flower] enabled``, the
    SuperNode it keeps connected while eligible (:func:`agent.application.build_daemon` makes it)."""

    def __init__(self, config: AgentConfig, *, eligibility: Eligibility | None = None,
                 notifier: Notifier | None = None, reporter: Reporter | None = None,
                 worker_command: list[str] | None = None, clock: Callable[[], float] = time.monotonic,
                 metrics: Any = None, federation: Federation | None = None) -> None:
        self.config = config
        self.eligibility = eligibility or eligibility_from_config(config)
        self.notifier = notifier or Notifier()
        self.reporter = reporter or NoReporter()
        self.worker_command = worker_command
        self.clock = clock
        self.metrics = metrics
        self.status = initial_status(config.device.name)
        self.supernode = federation
        self.network = config.network_monitor()
        self.worker: Worker | None = None
        self.next_window_at = 0.0
        first = config.training.backoff_seconds
        self.backoff = Backoff(first, max(BACKOFF_MAX_SECONDS, first))  # after a failed window
        self.last_decision: Decision | None = None
        self._terminate = False
        self._last_poll = -1e18
        self._last_watchdog = -1e18
        self._last_write = -1e18
        self._last_report = -1e18
        self._reporter_problem: str | None = None
        self._window_stop_reason = ""
        self._checkpointed_steps = 0  # steps the newest checkpoint holds, as the worker reported
        self._eligible_since: float | None = None  # when the device last became eligible (jitter counts from it)
        self._start_jitter = start_jitter(config.device.name, config.eligibility.start_jitter_seconds)

    # -- the loop --------------------------------------------------------------------
    def run(self) -> int:
        """Run until SIGTERM or SIGINT; returns the exit code."""
        selector = selectors.DefaultSelector()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        old_wakeup = signal.set_wakeup_fd(wake_write)
        selector.register(wake_read, selectors.EVENT_READ)
        try:
            self._set_state("waiting", "starting: checking eligibility")
            self.notifier.ready(self._status_line())
            while not self._terminate:
                self._tick(self.clock())
                if self.worker is not None and self.worker.fd not in selector.get_map():
                    selector.register(self.worker.fd, selectors.EVENT_READ)
                for key, _ in selector.select(self._timeout(self.clock())):
                    if key.fd == wake_read:
                        _drain(wake_read)
                self._read_worker(selector)
            self._shutdown(selector)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            selector.close()
            os.close(wake_read)
            os.close(wake_write)
        return 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._terminate = True

    def _timeout(self, now: float) -> float:
        poll = self._poll_interval()
        wait = self._last_poll + poll - now
        if self.notifier.watchdog_interval:
            wait = min(wait, self._last_watchdog + self.notifier.watchdog_interval - now)
        wait = min(wait, self._last_report + self.config.server.heartbeat_seconds - now)
        return max(0.0, min(wait, poll))

    def _poll_interval(self) -> float:
        e = self.config.eligibility
        return e.training_poll_seconds if self.worker is not None else e.poll_seconds

    def _tick(self, now: float) -> None:
        if self.notifier.watchdog_interval and now - self._last_watchdog >= self.notifier.watchdog_interval:
            self.notifier.watchdog()
            self._last_watchdog = now
        if now - self._last_report >= self.config.server.heartbeat_seconds:
            self._report(now)  # periodic too: a training device's steps reach the fleet between state changes
        if now - self._last_poll < self._poll_interval():
            return
        self._last_poll = now
        decision = self.eligibility.check(now)
        self.last_decision = decision
        self.status["eligible"] = decision.eligible
        self.status["eligibility"] = [{"name": v.name, "eligible": v.eligible, "reason": v.reason}
                                      for v in decision.verdicts]
        for verdict in decision.verdicts:
            self.status.update(verdict.readings)
        network = self.network.check(now)
        self.status["network"] = network.reason
        if self.supernode is not None:  # connected only while it may train and may use this network
            self.supernode.follow(decision.eligible and network.eligible, now)
            self.status["supernode"] = self.supernode.state
        if self.worker is None:
            self._between_windows(now, decision)
        else:
            self._during_window(now, decision)
        self._write(now)

    def _between_windows(self, now: float, decision: Decision) -> None:
        state = self.status["state"]
        if now < self.next_window_at:
            left = self.next_window_at - now
            if state == "backing off":
                self._set_state(state, f"{self._window_stop_reason}; next try in {left:.0f} s")
            else:
                self._set_state("waiting", f"{self._window_stop_reason}; next window in {left:.0f} s")
            return
        if not decision.eligible:
            self._eligible_since = None
            self._set_state("waiting", decision.reason)
            return
        if self._eligible_since is None:
            self._eligible_since = now
        wait = self._eligible_since + self._start_jitter - now
        if wait > 0:
            self._set_state("waiting", f"eligible ({decision.reason}); starting in {wait:.0f} s (start jitter: a "
                                       "fleet plugged in at once does not start at once)")
            return
        if self.supernode is not None:
            if self.supernode.clientapps():
                self._set_state("training", "answering a federated round's message (a ClientApp is running)")
            else:
                self._set_state("waiting", f"eligible ({decision.reason}); federated: trains when a Flower round "
                                           f"asks (SuperNode {self.supernode.state})")
            return
        self.worker = Worker(self.config, self.worker_command, now, self.status.get("energy_j") or 0.0)
        self._set_state("preparing", f"eligible ({decision.reason}); starting the training process")

    def _during_window(self, now: float, decision: Decision) -> None:
        worker = self.worker
        if not decision.eligible and worker.stop_sent_at is None:
            log.info("eligibility lost (%s): stopping after the step in progress", decision.reason)
            self.status["reason"] = f"stopping after the step in progress: {decision.reason}"
            worker.request_stop(now, decision.reason)
        cap = self.config.training.max_window_seconds
        if cap and worker.stop_sent_at is None and now - worker.started_at >= cap:
            why = f"the window reached its cap of {cap:g} s (training.max_window_seconds)"
            log.info("%s: stopping after the step in progress", why)
            self.status["reason"] = f"stopping after the step in progress: {why}"
            worker.capped = True
            worker.request_stop(now, why)
        bound, baseline = self.status.get("bound_bytes"), self.status.get("rss_baseline_bytes")
        rss = worker.rss_bytes()
        if bound and baseline and rss and rss > HARD_BOUND_FACTOR * (baseline + bound):
            worker.kill(f"the training process used {rss:,} B, over {HARD_BOUND_FACTOR:g}x its model's "
                        f"{baseline:,} B and its training's bound of {bound:,} B")

    def _read_worker(self, selector: selectors.BaseSelector) -> None:
        worker = self.worker
        if worker is None:
            return
        for event in worker.read_events():
            self._on_event(event)
        code = worker.process.poll()
        if code is None:
            return
        for event in worker.read_events():
            self._on_event(event)
        selector.unregister(worker.fd)
        worker.close()
        self.worker = None
        self._window_ended(code, worker)

    def _on_event(self, event: WorkerEvent) -> None:
        s = self.status
        match event:
            case StateEvent():
                self._set_state(event.state, event.reason)
            case DataEvent():
                s["data"], s["samples_skipped"] = event.description, event.skipped
            case ReadyEvent():
                self._checkpointed_steps = event.steps_done
                if self.worker is not None:
                    self.worker.steps_from = event.steps_done
                s.update(schedule_id=event.schedule_id, schedule_from=event.schedule_from,
                         memory_budget_bytes=event.memory_budget, steps_done=event.steps_done,
                         steps_saved=event.steps_done,
                         energy_source=event.energy_source, rss_baseline_bytes=event.baseline_rss,
                         planned_parts=event.predicted_parts)
                s["checkpoints_passed_over"] = list(event.skipped_checkpoints) or None
                if self.worker is not None and self.worker.stop_sent_at is None:
                    resumed = f", resumed at step {event.steps_done}" if event.resumed_from else ""
                    if event.skipped_checkpoints:
                        resumed += f" (passed over {len(event.skipped_checkpoints)} damaged checkpoint(s))"
                    self._set_state("training", f"schedule {event.schedule_id} from {event.schedule_from}{resumed}")
                for skipped in event.skipped_checkpoints:
                    log.warning("checkpoint passed over: %s", skipped)
            case StepEvent():
                s.update(steps_done=event.steps_done, loss=event.loss, peak_bytes=event.peak_bytes,
                         bound_bytes=event.bound_bytes, step_seconds=event.seconds, memory_parts=event.parts)
                s["energy_j"] = (s.get("energy_j") or 0.0) + (event.energy_j or 0.0)
            case CheckpointEvent():
                s["last_checkpoint_seconds"] = event.seconds
                self._checkpointed_steps = s["steps_saved"] = event.steps_done
                self.backoff.reset()  # work was kept: errors start over (a step alone keeps nothing)
            case EvalEvent():
                s["holdout_loss"], s["holdout_accuracy"] = event.loss, event.accuracy
            case StoppedEvent():
                asked = self.worker.stop_reason if self.worker is not None else ""
                # the worker knows only that a stop came; the daemon knows why it asked
                reason = f"stopped: {asked}" if asked and event.reason.startswith("stop requested") else event.reason
                self._window_stop_reason = f"{reason} at step {event.steps_done}"
                s["last_stop_after_step_seconds"] = event.seconds_after_step
            case ErrorEvent():
                s["last_error"] = event.message
        self._write(self.clock(), throttle=isinstance(event, StepEvent))

    def _window_ended(self, code: int, worker: Worker) -> None:
        now = self.clock()
        if code == 0:
            reason = self._window_stop_reason or "training process ended"
            if worker.stop_sent_at is not None:
                log.info("training stopped %.2f s after the stop request", now - worker.stop_sent_at)
                self.next_window_at = now + (self.config.training.window_gap_seconds if worker.capped else 0.0)
            else:
                self.next_window_at = now + self.config.training.window_gap_seconds
            self._window_stop_reason = reason
            self._set_state("waiting", reason)
        else:
            why = worker.killed_reason or self.status.get("last_error") or _exit_text(code)
            self.status["last_error"] = why
            lost = (self.status.get("steps_done") or 0) - self._checkpointed_steps
            if lost > 0:  # the status shows what the checkpoint holds: those steps are trained again
                why += f" ({lost} step{'s' * (lost != 1)} after the last checkpoint are trained again)"
                self.status["steps_done"] = self._checkpointed_steps
            self._window_stop_reason = f"training failed: {why}"
            wait = self.backoff.failed(now)
            self.next_window_at = now + wait
            self._set_state("backing off", f"{self._window_stop_reason}; next try in {wait:.0f} s")
        self._record(worker, now, "stopped" if code == 0 else "failed")
        self._write(now)

    def _record(self, worker: Worker, now: float, outcome: str) -> None:
        """Add the window that ended to the device's history; a disk that refuses it costs only the record."""
        s = self.status
        window = history.Window(
            started_at=worker.started_wall, seconds=now - worker.started_at, outcome=outcome,
            reason=self._window_stop_reason, steps_from=worker.steps_from, steps_to=self._checkpointed_steps,
            loss=s.get("loss"), energy_j=(s.get("energy_j") or 0.0) - worker.energy_at_start)
        try:
            history.append(self.config.history_path, window)
        except OSError as exc:
            log.warning("cannot record the window in %s: %s", self.config.history_path, exc)

    def _shutdown(self, selector: selectors.BaseSelector) -> None:
        self.notifier.stopping("stopping: " + ("checkpointing the training window" if self.worker else "idle"))
        if self.supernode is not None:
            self.supernode.stop("stopped with the agent")
            self.status["supernode"] = self.supernode.state
        worker = self.worker
        if worker is not None:
            log.info("stop requested: the training process checkpoints after the step in progress")
            worker.request_stop(self.clock(), "the agent is stopping")
            try:
                worker.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                worker.kill(f"did not stop within {STOP_TIMEOUT_SECONDS:g} s")
                worker.process.wait()
            self._read_worker(selector)
        self._set_state("stopped", "stopped by a signal (SIGTERM or SIGINT)")
        self._write(self.clock())

    # -- status ----------------------------------------------------------------------
    def _set_state(self, state: str, reason: str) -> None:
        old = self.status["state"]
        self.status["reason"] = reason
        if state != old:
            self.status["state"], self.status["since"] = state, time.time()
            log.info("%s -> %s: %s", old, state, reason)
            self.notifier.status(self._status_line())
            self._report(self.clock())
            self._write(self.clock())

    def _report(self, now: float) -> None:
        """Hand the status to the reporter; a problem the reporter has (revoked by the fleet) becomes last_error."""
        problem = getattr(self.reporter, "problem", None)
        if problem and problem != self._reporter_problem:
            self._reporter_problem = self.status["last_error"] = problem
            self._write(now)
        self.status.update(kept_summary(self.config.device.state_dir))  # a federated run may have kept a model
        self.reporter.report(dict(self.status))
        self._last_report = now

    def _status_line(self) -> str:
        unsaved = unsaved_steps(self.status)
        return (f"{self.status['state']}: {self.status['reason']} ({self.status['steps_done']} steps"
                f"{f', {unsaved} not yet in a checkpoint' if unsaved else ''})")

    def _write(self, now: float, throttle: bool = False) -> None:
        if throttle and now - self._last_write < 1.0:
            return
        self._last_write = now
        write_status(self.config.status_path, self.status)
        if self.metrics is not None:
            self.metrics.update(self.status)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _exit_text(code: int) -> str:
    if code < 0:
        return f"training process killed by signal {signal.Signals(-code).name}"
    return f"training process exited with code {code}"


class JournalFormatter(logging.Formatter):
    """``<N>`` syslog priority prefixes that journald turns into the entry's priority (when under journald)."""

    PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        return f"<{self.PRIORITIES.get(record.levelno, 6)}>{super().format(record)}"


def configure_logging() -> None:
    """Log to standard error; with journald behind it (``$JOURNAL_STREAM``), priorities as ``<N>`` prefixes."""
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("poet-agent")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False

