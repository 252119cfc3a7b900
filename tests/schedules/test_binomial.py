"""Revolve on an abstract chain: Griewank's closed form is the optimum, and the schedule keeps to it and to its snapshots."""

import math
from functools import lru_cache

import pytest

from schedules import binomial

SNAPSHOTS = range(1, 8)
LENGTHS = range(1, 61)


@lru_cache(maxsize=None)
def fewest_forward_steps(steps: int, snapshots: int) -> int:
    """The optimum by exhaustive search over the first snapshot's place (Griewank's recursion, no closed form)."""
    if steps <= 1:
        return 0
    if snapshots == 1:
        return steps * (steps - 1) // 2  # every reversal advances again from x_0
    return min(m + fewest_forward_steps(steps - m, snapshots - 1) + fewest_forward_steps(m, snapshots)
               for m in range(1, steps))


def closed_form(steps: int, snapshots: int) -> int:
    """``t(l, s) = r l - beta(s + 1, r - 1)`` with ``beta(s, r - 1) < l <= beta(s, r)``, written out here."""
    r = 0
    while math.comb(snapshots + r, snapshots) < steps:
        r += 1
    return r * steps - (math.comb(snapshots + r, snapshots + 1) if r >= 1 else 0)


def replay(actions: list[binomial.Action], steps: int) -> tuple[int, int]:
    """Walk the actions on a chain; return (advances, the most snapshots held at once besides ``x_0``).

    ``advance j`` and ``reverse j`` both need ``x_j``; ``advance j`` makes ``x_{j+1}``.  A state is held from
    its making to the last action it serves; it takes a snapshot unless only the very next action uses it.
    """
    made: dict[int, int] = {0: -1}  # state -> the action that made it last (x_0 is always at hand)
    served: dict[tuple[int, int], list[int]] = {}  # (state, making) -> the actions it serves
    reversals = []
    for k, (kind, j) in enumerate(actions):
        assert j in made, f"action {k} ({kind} {j}) needs x_{j}, which nothing has made"
        served.setdefault((j, made[j]), []).append(k)
        if kind == "advance":
            made[j + 1] = k
        else:
            reversals.append(j)
    assert reversals == list(reversed(range(steps)))  # every step reversed once, the last first
    held = [0] * (len(actions) + 1)
    for (state, making), uses in served.items():
        if state == 0 or uses == [making + 1]:
            continue
        for boundary in range(making + 1, max(uses) + 1):  # between action boundary - 1 and boundary
            held[boundary] += 1
    return sum(kind == "advance" for kind, _ in actions), max(held)


@pytest.mark.parametrize("snapshots", SNAPSHOTS)
def test_revolve_closed_form_is_the_optimum(snapshots):
    for steps in LENGTHS:
        r = binomial.repetitions(steps, snapshots)
        assert binomial.beta(snapshots, r - 1) < steps <= binomial.beta(snapshots, r)
        assert binomial.forward_steps(steps, snapshots) == closed_form(steps, snapshots)
        assert closed_form(steps, snapshots) == fewest_forward_steps(steps, snapshots)


@pytest.mark.parametrize("snapshots", SNAPSHOTS)
def test_revolve_schedule_advances_the_optimum_within_its_snapshots(snapshots):
    for steps in LENGTHS:
        advances, held = replay(binomial.actions(steps, snapshots), steps)
        assert advances == fewest_forward_steps(steps, snapshots)
        assert held <= snapshots - 1


@pytest.mark.parametrize("snapshots", range(2, 8))
def test_revolve_split_is_the_largest_optimal_one(snapshots):
    t = fewest_forward_steps
    for steps in range(2, 61):
        m = binomial.split(steps, snapshots)
        optimal = [k for k in range(1, steps) if k + t(steps - k, snapshots - 1) + t(k, snapshots) == t(steps, snapshots)]
        assert m == max(optimal)


def test_revolve_first_sweep_is_the_forward_pass():
    actions = binomial.actions(10, 3)
    first = actions.index(("reverse", 9))
    assert actions[:first] == [("advance", j) for j in range(9)]


def test_revolve_needs_a_step_and_a_snapshot():
    with pytest.raises(ValueError):
        binomial.actions(0, 2)
    with pytest.raises(ValueError):
        binomial.forward_steps(5, 0)
