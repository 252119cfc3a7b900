"""Griewank's binomial checkpointing (Revolve) on an abstract chain of steps.

A chain of ``l`` steps takes state ``x_0`` to ``x_l``; reversing step ``j``
(its adjoint) needs the state before it, ``x_j``.  With ``s`` snapshots (the
one holding ``x_0`` included), Revolve reverses the chain with the fewest
forward steps possible (Griewank 1992; Griewank & Walther 2000, "Algorithm
799: revolve", ACM TOMS 26(1)): with ``beta(s, r) = C(s + r, s)`` and the
repetition number ``r`` such that ``beta(s, r - 1) < l <= beta(s, r)``, that
minimum is

    t(l, s) = r * l - beta(s + 1, r - 1)

forward steps (the first sweep from ``x_0`` to ``x_{l-1}`` included; each
step's recording for its adjoint not counted).  The schedule is recursive:
advance ``m`` steps, snapshot ``x_m``, reverse the last ``l - m`` steps with
the ``s - 1`` snapshots left, free ``x_m``, reverse the first ``m`` steps with
all ``s``; ``m`` is an optimal split when both parts need no more than their
share of ``t`` (:func:`split`).

Pure arithmetic: :func:`schedules.baselines.revolve` maps the chain onto a
training graph's cut points.
"""

from __future__ import annotations

from math import comb
from typing import Literal

Action = tuple[Literal["advance", "reverse"], int]
"""``("advance", j)``: compute step ``j`` from ``x_j``; ``("reverse", j)``: run step ``j``'s adjoint (it needs ``x_j``)."""


def beta(s: int, r: int) -> int:
    """``C(s + r, s)``: the longest chain ``s`` snapshots reverse with each step advanced at most ``r`` times (0 below 0)."""
    return comb(s + r, s) if s >= 0 and r >= 0 else 0


def repetitions(steps: int, snapshots: int) -> int:
    """The repetition number ``r``: the least with ``steps <= beta(snapshots, r)``."""
    _check(steps, snapshots)
    r = 0
    while beta(snapshots, r) < steps:
        r += 1
    return r


def forward_steps(steps: int, snapshots: int) -> int:
    """Griewank's minimum ``t(l, s) = r l - beta(s + 1, r - 1)`` of forward steps to reverse the chain."""
    r = repetitions(steps, snapshots)
    return r * steps - beta(snapshots + 1, r - 1)


def split(steps: int, snapshots: int) -> int:
    """How many steps to advance before the next snapshot: the largest optimal split.

    ``m`` is optimal, ``m + t(l - m, s - 1) + t(m, s) = t(l, s)``, exactly when
    ``max(beta(s, r-2), l - beta(s-1, r)) <= m <= min(beta(s, r-1), l - beta(s-1, r-1))``:
    neither part needs more repetitions than its place in the chain allows.  The
    largest such ``m`` puts each snapshot as far along the chain as an optimal
    schedule can (on a network, usually where values are smaller).
    """
    if snapshots < 2 or steps < 2:
        raise ValueError(f"a split needs two steps and two snapshots, got {steps} and {snapshots}")
    r = repetitions(steps, snapshots)
    return min(beta(snapshots, r - 1), steps - beta(snapshots - 1, r - 1), steps - 1)


def actions(steps: int, snapshots: int) -> list[Action]:
    """Revolve's schedule for the chain, in order: the advances, and each step's reversal, last step first.

    Snapshots are implicit: a state is held from the advance that makes it
    while a later advance starts from it.  The advances before the first
    reversal are the first sweep ``x_0 .. x_{l-1}``; their count with the
    rest is :func:`forward_steps`.
    """
    _check(steps, snapshots)
    out: list[Action] = []
    pending = [(0, steps, snapshots)]  # reverse steps [a, b) from a snapshot of x_a, with s snapshots (x_a's included)
    while pending:
        a, b, s = pending.pop()
        if b - a == 1:
            out.append(("reverse", a))
        elif s == 1:  # no snapshot to spare: every step from x_a again
            for j in reversed(range(a, b)):
                out += [("advance", i) for i in range(a, j)]
                out.append(("reverse", j))
        else:
            m = split(b - a, s)
            out += [("advance", i) for i in range(a, a + m)]
            pending.append((a, a + m, s))  # second: the first m steps, x_{a+m}'s snapshot free again
            pending.append((a + m, b, s - 1))  # first: the rest, one snapshot holding x_{a+m}
    return out


def _check(steps: int, snapshots: int) -> None:
    if steps < 1 or snapshots < 1:
        raise ValueError(f"Revolve needs at least one step and one snapshot, got {steps} and {snapshots}")


__all__ = ["Action", "actions", "beta", "forward_steps", "repetitions", "split"]
