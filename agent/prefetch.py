"""When reads start ahead of their ``page_in`` and how long a paged value's RAM may wait for its write.

Both use the room a schedule leaves under its budget, instruction by instruction
(``holding[k]``: the bytes the schedule holds during instruction ``k``, its node's
workspace included):

* **write-behind.**  A ``free`` of a value whose page is still being written
  drops the executor's references at once; the I/O thread's write holds the
  storages until the bytes are on flash and then releases them.  That RAM is
  over the schedule's accounting, so the free may run ahead of the write only
  through the instructions whose room holds the value; before the first that
  cannot, the executor waits for the write (at the ``free`` itself when there
  is no room at all, as a schedule's accounting assumes).
* **read-ahead.**  A prefetch allocates its buffer when the read starts, so a
  read issued before instruction ``q`` for a ``page_in`` at ``p`` holds the
  page's bytes through instructions ``q-1 .. p-1``.  Each read starts at the
  earliest ``q`` where that still fits, and never before the value's previous
  RAM copy was freed (the single I/O thread keeps writes and reads in order).

Write-behind is planned first: it sits right after the page-outs of the forward
pass, where backward read-ahead has no use for the room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from schedules.matrices import Instruction


@dataclass(frozen=True)
class IoPlan:
    """``reads``: position -> nodes whose read starts just before it; ``release_by``: position of a ``free``
    of a paged value -> position before which its write must be done (absent: the free waits for it)."""

    reads: dict[int, list[int]] = field(default_factory=dict)
    release_by: dict[int, int] = field(default_factory=dict)
    held: tuple[int, ...] = ()   # bytes read ahead or written behind during each instruction


def plan_io(
    instructions: Sequence[Instruction],
    node_bytes: Sequence[int],
    holding: Sequence[int],
    limit: int,
) -> IoPlan:
    """Plan write-behind and read-ahead for a schedule; see the module docstring."""
    inflight = [0] * len(instructions)
    release_by: dict[int, int] = {}
    written: set[int] = set()
    for p, (op, node) in enumerate(instructions):
        if op == "page_out":
            written.add(node)
        elif op == "free" and node in written:
            written.discard(node)
            d = p
            while d < len(instructions) and holding[d] + inflight[d] + node_bytes[node] <= limit:
                d += 1
            if d > p:
                release_by[p] = d
                for r in range(p, d):
                    inflight[r] += node_bytes[node]
    reads = plan_prefetch(instructions, node_bytes, holding, limit, inflight)
    return IoPlan(reads, release_by, tuple(inflight))


def plan_prefetch(
    instructions: Sequence[Instruction],
    node_bytes: Sequence[int],
    resident: Sequence[int],
    limit: int,
    inflight: list[int] | None = None,
) -> dict[int, list[int]]:
    """``{position: [nodes]}``: reads to issue just before executing instruction ``position``.

    ``resident[k]`` is the predicted bytes held during instruction ``k``; ``inflight`` (updated in place)
    what is already held on top of it.
    """
    inflight = [0] * len(instructions) if inflight is None else inflight
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
