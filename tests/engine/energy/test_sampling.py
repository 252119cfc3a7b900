"""Power to energy: trapezoidal integration, the sampling thread, reads between samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from engine.energy.errors import MeterReadError
from engine.energy.sampling import SampledMeter
from tests.engine.energy.fakes import FakeClock


class FakeSupply:
    """The world outside: a supply whose power is a function of time, read through a clock."""

    description = "fake supply"

    def __init__(self, clock: Callable[[], float], watts: Callable[[float], float]) -> None:
        self.clock, self.watts, self.fail, self.reads, self.closed = clock, watts, False, 0, False

    def read_watts(self) -> float:
        self.reads += 1
        if self.fail:
            raise MeterReadError("fake supply did not answer")
        return self.watts(self.clock())

    def close(self) -> None:
        self.closed = True


def test_samples_are_integrated_with_the_trapezoidal_rule(clock: FakeClock) -> None:
    t0 = clock.now
    supply = FakeSupply(clock, lambda t: 2.0 + 3.0 * (t - t0))  # a ramp: exact under the trapezoid
    meter = SampledMeter(supply, name="fake", interval_s=None, clock=clock)
    meter.start()
    for _ in range(3):
        clock.advance(1.0)
        meter.sample_now()
    # integral of 2 + 3t over [0, 3] = 6 + 13.5; the left rectangle rule would give 15, the right 24
    assert meter.sample_now() == pytest.approx(19.5)
    assert meter.samples == 5


def test_measure_samples_both_ends_of_the_block(clock: FakeClock) -> None:
    t0 = clock.now
    supply = FakeSupply(clock, lambda t: 1.0 + (t - t0))
    meter = SampledMeter(supply, name="fake", interval_s=None, clock=clock)
    meter.start()
    clock.advance(2.0)
    with meter.measure() as m:  # power 3 W at entry ...
        clock.advance(4.0)  # ... 7 W at exit, no sample in between
    assert (m.joules, m.seconds, m.done) == (pytest.approx(20.0), 4.0, True)


def test_the_background_thread_samples_at_the_interval() -> None:
    supply = FakeSupply(time.perf_counter, lambda t: 4.0)
    with SampledMeter(supply, name="fake", interval_s=0.005) as meter:
        with meter.measure() as m:
            time.sleep(0.1)
        background = meter.samples - 3  # start() and the two ends of measure() sampled too
    assert background >= 5, f"only {background} background samples in 0.1 s at a 5 ms interval"
    assert m.joules == pytest.approx(4.0 * m.seconds, rel=1e-9)
    assert 0.1 <= m.seconds < 1.0


def test_close_stops_the_thread_and_closes_the_source() -> None:
    supply = FakeSupply(time.perf_counter, lambda t: 1.0)
    meter = SampledMeter(supply, name="fake", interval_s=0.001)
    meter.start()
    meter.close()
    assert supply.closed
    assert not [t for t in threading.enumerate() if t.name == "energy-fake"]
    reads = supply.reads
    time.sleep(0.02)
    assert supply.reads == reads
    with pytest.raises(MeterReadError, match="closed"):
        meter.start()


def test_the_counter_starts_at_start_not_at_an_earlier_probe(clock: FakeClock) -> None:
    meter = SampledMeter(FakeSupply(clock, lambda t: 5.0), name="fake", interval_s=None, clock=clock)
    meter.sample_now()  # detection probes the meter like this
    clock.advance(60.0)
    meter.start()
    assert meter.read_joules() == 0.0
    clock.advance(1.0)
    assert meter.read_joules() == pytest.approx(5.0)


def test_reads_between_samples_extrapolate_and_never_go_back(clock: FakeClock) -> None:
    watts = {"now": 10.0}
    meter = SampledMeter(FakeSupply(clock, lambda t: watts["now"]), name="fake", interval_s=None, clock=clock)
    meter.start()
    clock.advance(0.9)
    assert meter.read_joules() == pytest.approx(9.0)  # no sample since start: 10 W held
    watts["now"] = 0.0
    clock.advance(0.1)
    assert meter.sample_now() == pytest.approx(5.0)  # the trapezoid says 5 J ...
    assert meter.read_joules() == pytest.approx(9.0)  # ... but a counter does not run backwards
    watts["now"] = 10.0
    clock.advance(1.0)
    assert meter.sample_now() == pytest.approx(10.0)
    assert meter.read_joules() == pytest.approx(10.0)  # and it catches up


def test_a_failed_sample_at_the_end_is_bridged_and_counted(clock: FakeClock) -> None:
    supply = FakeSupply(clock, lambda t: 2.0)
    meter = SampledMeter(supply, name="fake", interval_s=None, clock=clock)
    with meter.measure() as m:
        clock.advance(3.0)
        supply.fail = True
    assert m.joules == pytest.approx(6.0)
    assert (meter.failed_samples, str(meter.last_error)) == (1, "fake supply did not answer")


def test_a_source_that_never_answers_fails_at_start(clock: FakeClock) -> None:
    supply = FakeSupply(clock, lambda t: 2.0)
    supply.fail = True
    meter = SampledMeter(supply, name="fake", interval_s=None, clock=clock)
    with pytest.raises(MeterReadError):
        meter.start()


def test_energy_of_a_failed_block_is_still_recorded(clock: FakeClock) -> None:
    meter = SampledMeter(FakeSupply(clock, lambda t: 3.0), name="fake", interval_s=None, clock=clock)
    with pytest.raises(ZeroDivisionError), meter.measure() as m:
        clock.advance(2.0)
        1 / 0
    assert (m.done, m.joules) == (True, pytest.approx(6.0))
