"""A simulated device's part in each round: the availability trace, drop-outs and stragglers."""

from __future__ import annotations

from agent.federated.virtual import round_part
from common.runconfig import RunConfig


def test_on_the_night_trace_a_device_trains_only_while_its_local_clock_says_night() -> None:
    night = RunConfig(availability="night", round_hours=1.0)
    # device 0 keeps UTC: round r starts at hour r - 1
    available = [not round_part(0, 24, r, night).absent for r in range(1, 25)]
    assert available == [h >= 22 or h < 7 for h in range(24)]
    assert "not charging at 12:00 local time" in round_part(0, 24, 13, night).absent
    # the fleet's time zones spread round the clock: at any hour 9 of 24 devices are plugged in
    assert all(sum(not round_part(d, 24, r, night).absent for d in range(24)) == 9 for r in range(1, 25))
    assert all(not round_part(d, 24, r, RunConfig()).absent for d in range(24) for r in range(1, 5))


def test_drop_outs_and_stragglers_come_at_their_rates_and_the_same_run_draws_the_same() -> None:
    run = RunConfig(dropout=0.2, straggle=0.3, seed=5)
    parts = [round_part(d, 100, r, run) for d in range(100) for r in range(1, 21)]
    dropped = sum(bool(p.absent) for p in parts) / len(parts)
    late = [p.share for p in parts if not p.absent and p.share < 1]
    assert 0.17 < dropped < 0.23 and 0.2 < len(late) / len(parts) < 0.28  # 0.3 of the 0.8 that stayed
    assert all(0.2 <= s <= 0.8 for s in late)
    assert parts == [round_part(d, 100, r, run) for d in range(100) for r in range(1, 21)]
    assert parts != [round_part(d, 100, r, RunConfig(dropout=0.2, straggle=0.3, seed=6))
                     for d in range(100) for r in range(1, 21)]
