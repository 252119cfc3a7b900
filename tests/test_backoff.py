"""The one restart backoff every supervisor uses: waits that double up to a cap, and start over when the child
has shown it works."""

from __future__ import annotations

import pytest

from common.backoff import Backoff


def test_waits_double_after_each_failure_up_to_the_cap() -> None:
    backoff = Backoff(5, 30)
    waits = []
    now = 0.0
    for _ in range(5):
        waits.append(backoff.failed(now))
        assert not backoff.due(now + waits[-1] - 0.01) and backoff.due(now + waits[-1])
        now += waits[-1]
    assert waits == [5, 10, 20, 30, 30]


def test_a_reset_starts_over_and_holds_nothing_back() -> None:
    backoff = Backoff(1, 60)
    for now in range(4):
        backoff.failed(float(now))
    backoff.reset()
    assert backoff.due(3.0)
    assert backoff.failed(10.0) == 1


def test_a_run_longer_than_stable_after_starts_the_waits_over() -> None:
    backoff = Backoff(1, 60, stable_after=60)
    backoff.started(0.0)
    assert backoff.failed(1.0) == 1
    backoff.started(2.0)
    assert backoff.failed(3.0) == 2  # a short run: still failing
    backoff.started(5.0)
    assert backoff.failed(70.0) == 1  # it ran a minute: that was a new failure, not the same one


def test_a_given_wait_holds_the_next_start_and_later_failures_wait_at_least_as_long() -> None:
    backoff = Backoff(5, 300)
    assert backoff.failed(0.0, wait=300) == 300
    assert not backoff.due(299.0) and backoff.due(300.0)
    assert backoff.failed(300.0) == 300


@pytest.mark.parametrize("first, maximum", [(0, 10), (-1, 10), (20, 10)])
def test_a_backoff_that_cannot_wait_is_refused(first: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="first"):
        Backoff(first, maximum)
