"""The sliding window: attempts beyond the limit wait until the oldest one leaves the window."""

from __future__ import annotations

from server.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_slides_and_keys_are_counted_apart() -> None:
    clock = Clock()
    limiter = RateLimiter(2, window=60, clock=clock)
    assert limiter.hit("a") is None
    clock.now += 10
    assert limiter.hit("a") is None
    assert limiter.hit("a") == 50  # the first attempt leaves the window in 50 s
    assert limiter.retry_after("a") == 50 and limiter.hit("b") is None
    clock.now += 50
    assert limiter.retry_after("a") is None and limiter.hit("a") is None
    assert limiter.hit("a") == 10


def test_checking_an_address_never_seen_records_nothing() -> None:
    limiter = RateLimiter(1, clock=Clock())
    assert all(limiter.retry_after(f"10.0.0.{i}") is None for i in range(100))
    assert limiter._hits == {}
