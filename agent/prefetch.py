"""When to start reading each page ahead of its ``page_in``, without going over the budget.

A prefetch allocates its buffer when the read starts, so a read issued before
instruction ``q`` for a ``page_in`` at ``p`` holds the page's bytes through
instructions ``q-1 .. p-1`` on top of what the schedule keeps resident.  Each
read starts at the earliest ``q`` where that still fits the limit (the
schedule's budget, or its own predicted peak when it has none), and never
before the value's previous RAM copy was freed -- the page was written before
that ``free``, and the single I/O thread keeps writes and reads in order.
"""

from __future__ import annotations

from typing import Sequence

from schedules.matrices import Instruction


def plan_prefetch(
    instructions: Sequence[Instruction],
    node_bytes: Sequence[int],
    resident: Sequence[int],
    limit: int,
) -> dict[int, list[int]]:
    """``{position: [nodes]}``: reads to issue just before executing instruction ``position``.

    ``resident[k]`` is the predicted resident bytes after instruction ``k``.
    """
    inflight = [0] * len(instructions)
    starts: dict[int, list[int]] = {}
    last_free: dict[int, int] = {}
    for p, (op, node) in enumerate(instructions):
        if op == "free":
            last_free[node] = p
        if op != "page_in":
            continue
        q = _earliest(p, last_free.get(node, -1) + 1, node_bytes[node], resident, inflight, limit)
        if q == p:
            continue  # no room ahead: the page_in reads synchronously
        for r in range(max(q - 1, 0), p):
            inflight[r] += node_bytes[node]
        starts.setdefault(q, []).append(node)
    return starts


def _earliest(p: int, lo: int, size: int, resident: Sequence[int], inflight: list[int], limit: int) -> int:
    """Smallest ``q`` in ``[lo, p]`` such that the buffer fits after every instruction ``q-1 .. p-1``."""

    def fits(r: int) -> bool:
        return r < 0 or resident[r] + inflight[r] + size <= limit

    if not fits(p - 1):
        return p
    q = p
    while q - 1 >= lo and fits(q - 2):
        q -= 1
    return q
