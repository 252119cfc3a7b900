"""Turn a power reading into an energy counter: sample on a thread, integrate.

A :class:`PowerSource` answers "how many watts right now" (an INA3221 rail, a
USB meter, a CSV line from a microcontroller).  :class:`SampledMeter` polls it
every ``interval_s`` seconds on a daemon thread and integrates the samples
with the trapezoidal rule, which is exact for power that changes linearly
between samples and never worse than the rectangle rule otherwise.

Reading the counter between samples
-----------------------------------
``read_joules()`` must be cheap (the executor calls it around every
instruction), so it never talks to the device: it returns the integral up to
the last sample plus the last power times the time since (a zero-order hold
for the open interval).  When the next sample shows the power fell, that
extrapolation overshot; the counter then holds still until the integral
catches up rather than go backwards.  ``measure()`` does talk to the device:
it takes a fresh sample at both ends, so a block's energy is the exact
trapezoidal integral over the block.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from engine.energy.errors import EnergyMeterError, MeterReadError
from engine.energy.meter import DEFAULT_CLOCK, Activity, Clock, Measurement

DEFAULT_INTERVAL_S = 0.05


@runtime_checkable
class PowerSource(Protocol):
    """Anything that reports instantaneous power.

    Attributes
    ----------
    description:
        Human-readable origin, used as the meter's ``source``.
    """

    description: str

    def read_watts(self) -> float:
        """Power now, W; raises :class:`MeterReadError` when the read fails."""

    def close(self) -> None:
        """Release the device (idempotent)."""


class SampledMeter:
    """An :class:`~engine.energy.meter.EnergyMeter` over a :class:`PowerSource`.

    Parameters
    ----------
    source:
        Where the watts come from.
    name:
        Short identifier of the meter kind (``"ina3221"``, ``"um25c"``).
    interval_s:
        Seconds between background samples; ``None`` samples only when
        ``measure()`` or :meth:`sample_now` asks (no thread).
    clock:
        Monotonic clock in seconds; each sample is stamped when its request
        starts, since a USB meter measures when the command arrives and then
        spends ~135 ms sending the answer at 9600 baud.
    """

    is_estimate = False

    def __init__(
        self,
        source: PowerSource,
        *,
        name: str,
        interval_s: float | None = DEFAULT_INTERVAL_S,
        clock: Clock = DEFAULT_CLOCK,
    ) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError(f"interval_s must be positive or None, not {interval_s!r}")
        self.name = name
        self.source = source.description
        self._power = source
        self._interval_s = interval_s
        self._clock = clock
        self._device_lock = threading.Lock()  # one request on the wire at a time
        self._state_lock = threading.Lock()  # guards the integral, never held during I/O
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._t_last = 0.0
        self._w_last = 0.0
        self._integral = 0.0  # J up to _t_last
        self._reported = 0.0  # largest value read_joules() has returned
        self.samples = 0
        self.failed_samples = 0
        self.last_error: EnergyMeterError | None = None

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> None:
        """Take the first sample (errors surface here) and start the sampling thread."""
        with self._start_lock:
            if self._stop.is_set():
                raise MeterReadError(f"{self.source}: this meter was closed; open a new one")
            if self._started:
                return
            self.sample_now()
            with self._state_lock:  # the counter starts here, not at an earlier probe
                self._integral = self._reported = 0.0
            self._started = True
            if self._interval_s is not None:
                self._thread = threading.Thread(target=self._run, name=f"energy-{self.name}", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the thread and close the source; a closed meter cannot be restarted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._power.close()

    def __enter__(self) -> SampledMeter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- sampling -----------------------------------------------------------------
    def sample_now(self) -> float:
        """Read the source once and fold the sample into the integral.

        Returns
        -------
        float
            The cumulative energy at this sample, J.
        """
        return self._sample()[1]

    def _sample(self) -> tuple[float, float]:
        """Read once; return (sample time, cumulative J at that time)."""
        with self._device_lock:
            t = self._clock()
            watts = self._power.read_watts()
            # Still under the device lock, so samples enter the integral in time order.
            with self._state_lock:
                if self.samples:
                    self._integral += 0.5 * (self._w_last + watts) * (t - self._t_last)
                self._t_last, self._w_last = t, watts
                self.samples += 1
                return t, self._integral

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample_or_note_failure()

    def _sample_or_note_failure(self) -> tuple[float, float] | None:
        """Sample; on failure count it and return None (the trapezoid then spans the gap)."""
        try:
            return self._sample()
        except EnergyMeterError as exc:
            with self._state_lock:
                self.failed_samples += 1
                self.last_error = exc
            return None

    # -- reading ------------------------------------------------------------------
    def read_joules(self) -> float:
        """Cumulative energy since ``start()``, J; cheap, never decreases."""
        self.start()
        with self._state_lock:
            tail = self._w_last * max(0.0, self._clock() - self._t_last)
            self._reported = max(self._reported, self._integral + tail)
            return self._reported

    @contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Measure the wrapped block with a fresh sample at each end.

        Yields
        ------
        Measurement
            Filled in when the block exits (also when it raises).

        Raises
        ------
        MeterReadError
            When neither end could be sampled and there is no earlier sample.
        """
        self.start()
        result = Measurement(source=self.source, is_estimate=False)
        t0, j0 = self._boundary()
        try:
            yield result
        finally:
            t1, j1 = self._boundary()
            result.joules, result.seconds, result.done = j1 - j0, t1 - t0, True

    def _boundary(self) -> tuple[float, float]:
        """(time, cumulative J) at a block boundary; extrapolates if the sample fails."""
        sampled = self._sample_or_note_failure()
        if sampled is not None:
            return sampled
        if not self.samples:
            raise MeterReadError(f"{self.source}: no sample could be read ({self.last_error})")
        now = self._clock()
        with self._state_lock:
            return now, self._integral + self._w_last * (now - self._t_last)

    def set_activity(self, activity: Activity) -> None:
        """Ignored: a sensor measures whatever the device does."""
