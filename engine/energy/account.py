"""Energy of one training step, in total and per node class.

The executor wraps a step in a :class:`StepEnergyAccount` and each
instruction in ``track(activity)``::

    with StepEnergyAccount(meter) as account:
        for instruction in schedule.instructions:
            with account.track(Activity.COMPUTE):      # or PAGE_IN / PAGE_OUT
                run(instruction)
    stats.energy = account.result                       # a StepEnergy

The step total comes from ``meter.measure()`` (exact to the meter's ability);
the per-class figures from ``meter.read_joules()`` at instruction boundaries.
For RAPL and the estimate both are exact, for a sampled meter a node shorter
than the sampling interval is charged the power seen last, so the classes
are as fine-grained as the interval.  ``track`` also tells the meter what the
device is doing, which is how the estimate picks its nominal power.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from engine.energy.meter import DEFAULT_CLOCK, Activity, Clock, EnergyMeter, Measurement

NODE_CLASSES = (Activity.COMPUTE, Activity.PAGE_IN, Activity.PAGE_OUT)


@dataclass(frozen=True)
class StepEnergy:
    """What one step cost, J and s.

    Attributes
    ----------
    total_joules, total_seconds:
        The whole step.
    joules, seconds:
        Per node class (``"compute"``, ``"page_in"``, ``"page_out"``; always
        all three keys).
    untracked_joules:
        ``total_joules`` minus the classes: the executor's own overhead between
        instructions.  With a sampled meter it can come out slightly negative.
    source, is_estimate:
        The meter's, so a report says where each figure came from.
    """

    total_joules: float
    total_seconds: float
    joules: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    untracked_joules: float = 0.0
    source: str = ""
    is_estimate: bool = False

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready form, for the executor's stats and heartbeats."""
        return {
            "total_joules": self.total_joules,
            "total_seconds": self.total_seconds,
            "joules": dict(self.joules),
            "seconds": dict(self.seconds),
            "untracked_joules": self.untracked_joules,
            "source": self.source,
            "is_estimate": self.is_estimate,
        }


class StepEnergyAccount:
    """Accumulates a step's energy per node class; see the module docstring.

    Parameters
    ----------
    meter:
        Any :class:`~engine.energy.meter.EnergyMeter`; started here if it is not.
    clock:
        Clock for the per-class durations; use the meter's own clock in tests.

    Attributes
    ----------
    result:
        The :class:`StepEnergy`, set when the ``with`` block exits.
    """

    def __init__(self, meter: EnergyMeter, *, clock: Clock = DEFAULT_CLOCK) -> None:
        self.meter = meter
        self.result: StepEnergy | None = None
        self._clock = clock
        self._joules = {activity.value: 0.0 for activity in NODE_CLASSES}
        self._seconds = {activity.value: 0.0 for activity in NODE_CLASSES}
        self._tracking = threading.Lock()  # held while one instruction is tracked
        self._step: AbstractContextManager[Measurement] | None = None
        self._total: Measurement | None = None

    def __enter__(self) -> StepEnergyAccount:
        self.meter.start()
        self._step = self.meter.measure()
        self._total = self._step.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._step is not None and self._total is not None
        self._step.__exit__(None, None, None)  # a failed step still drew its energy: record it
        total = self._total
        self.result = StepEnergy(
            total_joules=total.joules,
            total_seconds=total.seconds,
            joules=dict(self._joules),
            seconds=dict(self._seconds),
            untracked_joules=total.joules - sum(self._joules.values()),
            source=total.source,
            is_estimate=total.is_estimate,
        )

    @contextmanager
    def track(self, activity: Activity) -> Iterator[None]:
        """Charge the wrapped instruction to ``activity``'s class.

        Raises
        ------
        RuntimeError
            When another instruction is being tracked: overlapping intervals
            would count the same joules twice.
        """
        activity = Activity(activity)
        if activity not in NODE_CLASSES:
            classes = ", ".join(a.value for a in NODE_CLASSES)
            raise ValueError(f"track() takes a node class ({classes}), not {activity.value}")
        if not self._tracking.acquire(blocking=False):
            raise RuntimeError("track() blocks cannot overlap: the same joules would be charged twice")
        try:
            self.meter.set_activity(activity)
            # the timed interval nests inside the metered one: a thread preempted between the two reads
            # must not leave more seconds than joules were read for (above-idle figures would go negative)
            j0 = self.meter.read_joules()
            t0 = self._clock()
            try:
                yield
            finally:
                seconds = self._clock() - t0
                self._joules[activity.value] += self.meter.read_joules() - j0
                self._seconds[activity.value] += seconds
                self.meter.set_activity(Activity.IDLE)
        finally:
            self._tracking.release()
