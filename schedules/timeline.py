"""The executor's paging in time: when reads start ahead, how long RAM waits for writes, the step it makes.

The executor (:mod:`engine.executor`) pages on one I/O thread beside the compute thread.  What it does
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

* **reused read memory.**  Mapping fresh memory in is most of a page-in's CPU
  (a page fault per 4 KiB), and unmapping a freed value most of a free's.  A
  value that is freed -- read back earlier, or computed (not the batch, and
  not one whose page is still being written) -- can keep its memory for a
  later read of the same layout, where the room holds it from its ``free``
  until that read takes it over; the read then fills memory already mapped.
  In a stack of identical layers the value freed by one layer's backward is
  the layout the next page-in needs.

Write-behind is planned first: it sits right after the page-outs of the forward
pass, where backward read-ahead has no use for the room; then read-ahead, then
reused memory in what room is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from schedules.device import DeviceProfile
from schedules.graph import TrainingGraph
from schedules.matrices import Instruction
from schedules.schedule import Schedule
from schedules.simulate import simulate


Donor = tuple[int, int] | tuple[str, int]
"""Memory a read can fill: an earlier read ``(start, node)``, or a computed value's ``("free", position)``."""


@dataclass(frozen=True)
class IoPlan:
    """What the executor does with a schedule's paging.

    ``reads``: position -> nodes whose read starts just before it (read-ahead);
    ``release_by``: position of a ``free`` of a paged value -> position before
    which its write must be done (absent: the free waits for it); ``reuse``:
    a read, named ``(position, node)`` by its start (its ``page_in`` where it
    is not read ahead) -> the memory it reads into: an earlier read's (named
    so) or a computed value's, named ``("free", position)`` by its ``free``;
    ``keep``: those donors, whose memory outlives their value's ``free`` for
    such a later read; ``held``: bytes read ahead, written behind or kept for a
    read during each instruction.
    """

    reads: dict[int, list[int]] = field(default_factory=dict)
    release_by: dict[int, int] = field(default_factory=dict)
    held: tuple[int, ...] = ()
    reuse: dict[tuple[int, int], Donor] = field(default_factory=dict)
    keep: frozenset[Donor] = frozenset()


def plan_io(
    instructions: Sequence[Instruction],
    node_bytes: Sequence[int],
    holding: Sequence[int],
    limit: int,
    compute_ms: Sequence[float] | None = None,
    read_ms: Sequence[float] | None = None,
    layouts: Sequence[Hashable] | None = None,
) -> IoPlan:
    """Plan write-behind, read-ahead and reused read memory for a schedule; see the module docstring.

    ``compute_ms`` and ``read_ms`` (per node: its computation, the read of its page) let a read start later
    than it could, just after a value of its layout is freed, to take over that value's memory, where
    the computations left before its ``page_in`` still cover the read; without them a read takes over only
    memory freed before its earliest start.  ``layouts`` (per node, equal where one value's memory holds
    the other's page: the executor's storage sizes) default to the node bytes.
    """
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
    covers = _lead(instructions, compute_ms, read_ms)
    reads = _plan_reads(instructions, node_bytes, holding, limit, inflight, covers,
                        layouts if layouts is not None else node_bytes)
    reuse = {read.name: read.reuses for read in reads if read.reuses is not None}
    return IoPlan(_starts(reads), release_by, tuple(inflight), reuse, frozenset(reuse.values()))


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
    return _starts(_plan_reads(instructions, node_bytes, resident, limit, inflight))


def _starts(reads: Sequence[_Read]) -> dict[int, list[int]]:
    """``{position: [nodes]}`` of the reads that start ahead of their ``page_in``."""
    starts: dict[int, list[int]] = {}
    for read in reads:
        if read.start < read.page_in:
            starts.setdefault(read.start, []).append(read.node)
    return starts


@dataclass(frozen=True)
class _Read:
    node: int
    page_in: int   # position of its page_in
    start: int     # the read starts just before this position (== page_in: read at the page_in itself)
    free: int | None  # position of the free that ends this copy (None: kept to the step's end)
    reuses: Donor | None = None  # the memory it takes over

    @property
    def name(self) -> tuple[int, int]:
        return self.start, self.node

    @property
    def takes_memory_at(self) -> int:
        """First instruction during which the read's buffer is counted (see :func:`plan_prefetch`)."""
        return max(self.start - 1, 0) if self.start < self.page_in else self.page_in


LeadCovers = Callable[[int, int, Sequence[int]], bool]
"""``covers(start, page_in, nodes)``: whether the reads of ``nodes``, one after another from just before
``start``, are done by ``page_in``."""


def _lead(instructions: Sequence[Instruction], compute_ms: Sequence[float] | None,
          read_ms: Sequence[float] | None) -> LeadCovers | None:
    if compute_ms is None or read_ms is None:
        return None
    elapsed = [0.0]
    for op, node in instructions:
        elapsed.append(elapsed[-1] + (compute_ms[node] if op == "compute" else 0.0))
    return lambda start, page_in, nodes: elapsed[page_in] - elapsed[start] >= sum(read_ms[n] for n in nodes)


def _plan_reads(instructions: Sequence[Instruction], node_bytes: Sequence[int], resident: Sequence[int], limit: int,
                inflight: list[int] | None, covers: LeadCovers | None = None,
                layouts: Sequence[Hashable] | None = None) -> list[_Read]:
    """Every ``page_in``'s read: started as early as the room allows, and reading into the memory of a value
    of its layout freed before it starts (the latest such free first: the shortest wait) where the room
    holds that memory in between -- or, given ``covers``, freed before its ``page_in`` where the read still
    ends in time when started just after that free, behind the reads queued before it.  ``inflight``
    (updated in place) is what is held on top of ``resident``; ``layouts`` default to ``node_bytes``."""
    inflight = [0] * len(instructions) if inflight is None else inflight
    layouts = node_bytes if layouts is None else layouts
    computed = _computed_frees(instructions)
    reads: list[_Read] = []
    last_free: dict[int, int] = {}
    for p, (op, node) in enumerate(instructions):
        if op == "free":
            last_free[node] = p
        if op != "page_in":
            continue
        size = node_bytes[node]
        end = next((k for k in range(p + 1, len(instructions)) if instructions[k] == ("free", node)), None)
        earliest = _earliest(p, last_free.get(node, -1) + 1, size, resident, inflight, limit)
        read = _Read(node, p, earliest, end)
        taken = {r.reuses for r in reads}
        donors = [(d.name, d.free) for d in reads if d.free is not None and d.free < p]
        donors += [(("free", f), f) for f in computed if f < p]
        donors = [(name, free) for name, free in donors if name not in taken and size > 0
                  and layouts[instructions[free][1]] == layouts[node]]
        for name, free in sorted(donors, key=lambda d: -d[1]):
            start = max(earliest, free + 1)
            # the one I/O thread reads in order: reads started earlier and not yet taken go first
            queued = [r.node for r in reads if r.start <= start < r.page_in]
            if start > earliest and (covers is None or not covers(start, p, [*queued, node])):
                continue
            candidate = _Read(node, p, start, end, name)
            idle = range(free, candidate.takes_memory_at)  # the memory waits, counted, for the read
            if all(resident[r] + inflight[r] + size <= limit for r in idle):
                for r in idle:
                    inflight[r] += size
                read = candidate
                break
        if read.start < p:  # else no room ahead: the page_in reads synchronously
            for r in range(read.takes_memory_at, p):
                inflight[r] += size
        reads.append(read)
    return reads


def _computed_frees(instructions: Sequence[Instruction]) -> list[int]:
    """Positions of the ``free`` instructions that drop a value computed in RAM: not the batch (node 0: the caller's
    memory), not a copy read back (a read donates its own memory), not one whose page may still be written."""
    state: dict[int, str] = {}
    frees = []
    for p, (op, node) in enumerate(instructions):
        if op in ("compute", "page_out", "page_in"):
            state[node] = op
        elif op == "free":
            if state.pop(node, None) == "compute" and node != 0:
                frees.append(p)
    return frees


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
    report = simulate(graph, schedule if schedule.step is not None else instructions)
    limit = schedule.memory_budget if schedule.memory_budget is not None else report.peak_memory_bytes
    io = plan_io(instructions, [n.bytes for n in graph.nodes], report.working_bytes, limit,
                 [n.compute_ms for n in graph.nodes], [device.pagein_seconds(n.bytes) * 1e3 for n in graph.nodes])
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
