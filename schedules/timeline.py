"""The executor's paging in time: when reads start ahead, how long RAM waits for writes, the step it makes.

The executor (:mod:`agent.executor`) pages on one I/O thread beside the compute thread.  What it does
with a schedule's paging is decided here, from the schedule alone, so that the planner can replay it
too (:func:`timeline_step_ms`: ``plan`` checks overlapped plans against it).  Both decisions use
the room a schedule leaves under its budget, instruction by instruction (``holding[k]``: the bytes
the schedule holds during instruction ``k``, its node's workspace included):

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

from schedules.device import DeviceProfile
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction
from schedules.schedule import Schedule
from schedules.simulate import simulate


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


def timeline_step_ms(graph: TrainingGraph, schedule: Schedule, device: DeviceProfile,
                     hidden_fraction: float | None = None) -> float:
    """Step time replayed with the executor's single I/O thread beside the compute thread, ms.

    The planner's model either ignores paging time (overlap) or adds all of it
    (none).  The executor does neither: a ``page_out`` queues a write and the
    step goes on, a paged value's RAM waits for its write (at the ``free``, or
    where the room for writing it behind ends), a ``page_in`` waits for a read
    issued at the prefetch point (both planned by :func:`plan_io`,
    as the executor does), and transfers queue one after another.  The
    step waits only where the I/O thread is behind.  Transfers that do run
    beside compute still slow it by ``1 - hidden_fraction`` of their time (the
    share the profile measured was not hidden; by default the device's
    ``paging_hidden_fraction``, or 1 or 0 from ``paging_overlaps_compute``).
    """
    if hidden_fraction is None:
        hidden_fraction = 1.0 - device.exposed_paging_fraction
    instructions = list(schedule.instructions)
    report = simulate(graph, instructions)
    limit = schedule.memory_budget if schedule.memory_budget is not None else report.peak_memory_bytes
    io = plan_io(instructions, [n.bytes for n in graph.nodes], report.working_bytes, limit)
    line = _Timeline(graph, device)
    for position, (op, node) in enumerate(instructions):
        line.settle(position)
        for ahead in io.reads.get(position, ()):
            line.queue_read(ahead)
        line.run(op, node, io.release_by.get(position))
    return line.now + (1.0 - hidden_fraction) * line.io_beside_compute_ms


class _Timeline:
    """Clock of the compute thread and of the one I/O thread, in ms."""

    def __init__(self, graph: TrainingGraph, device: DeviceProfile) -> None:
        self.graph, self.device = graph, device
        self.now = 0.0            # compute thread
        self.io_free = 0.0        # when the I/O thread finishes its queue
        self.io_beside_compute_ms = 0.0
        self.written: dict[int, float] = {}
        self.read: dict[int, float] = {}
        self.behind: dict[int, int] = {}  # value written behind -> position before which its write must be done
        self._busy: list[tuple[float, float]] = []  # I/O intervals, to tell how much ran beside compute

    def queue(self, duration_ms: float) -> float:
        start = max(self.io_free, self.now)
        self.io_free = start + duration_ms
        self._busy.append((start, self.io_free))
        return self.io_free

    def queue_read(self, node: int) -> None:
        self.read[node] = self.queue(self.device.pagein_seconds(self.graph.nodes[node].bytes) * 1e3)

    def settle(self, position: int) -> None:
        """Wait for the writes whose room to run behind ends before instruction ``position``."""
        for node, deadline in list(self.behind.items()):
            if deadline <= position:
                self.now = max(self.now, self.written[node])
                del self.behind[node]

    def run(self, op: str, node: int, release_by: int | None = None) -> None:
        if op == "compute":
            start = self.now
            self.now += self.graph.nodes[node].compute_ms
            self.io_beside_compute_ms += self._io_within(start, self.now)
        elif op == "page_out":
            self.written[node] = self.queue(self.device.pageout_seconds(self.graph.nodes[node].bytes) * 1e3)
        elif op == "free" and node in self.written:
            if release_by is None:
                self.now = max(self.now, self.written[node])  # RAM is released once the bytes are on flash
            else:
                self.behind[node] = release_by
        elif op == "page_in":
            if node not in self.read:
                self.queue_read(node)
            self.now = max(self.now, self.read.pop(node))

    def _io_within(self, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self._busy)
