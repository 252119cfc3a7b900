"""The executor: one training step of a real ``nn.Module``, following a POET schedule.

::

    graph, segments = extract(model, (inputs, targets), loss_fn)
    schedule = schedules.plan(graph, device, memory_budget=...).schedule
    ex = Executor(model, segments, graph, schedule, swap_dir="/var/lib/poet-agent/swap")
    loss = ex.step(inputs, targets)   # .grad exactly as loss_fn(model(inputs), targets).backward()
    optimizer.step()
    ex.last_stats                     # ledger, peak RSS, bytes paged, I/O and per-node times

Each instruction of ``schedule.instructions`` is done for real: ``compute``
runs a unit (or its backward) through :class:`~engine.runtime.Runtime`,
``free`` drops the value's storages, ``page_out`` / ``page_in`` move them to
and from a page file through :class:`~engine.pager.Pager`, reading ahead,
writing behind and reading into memory kept from an earlier page-in or from a
value just freed, where the budget has room (:func:`schedules.timeline.plan_io`;
once a step has measured the page-in bandwidth and seen each value's storage
sizes, reads may start later to take over such memory where the computations
left still hide them).  Before the first
step the executor refuses a schedule planned for another graph, one the
simulator rejects (over budget, missing inputs) and one whose first
computations of forward nodes are not in stage order (the RNG stream would
not match plain training).  During a step the ledger checks resident bytes
after every instruction.  Any failure rolls the model back (gradients,
buffers, RNG) and removes the step's page files before the error propagates.

Updates: given a :class:`~engine.optim.FusedOptimizer` (``updates=``), each
parameter is updated inside the backward node that makes its gradient final
and the gradient freed there (large linear weights a block of columns at a
time, :mod:`engine.optim.streamed`), so gradients never all live at once; the
caller brackets the step with the optimizer's ``begin_step`` /
``begin_micro_batch`` / ``finish_step`` (:mod:`engine.training` does).  A step
that fails before its first update is rolled back as above and leaves its
gradients to the caller (``discard_step``); one that fails after it raises
:class:`~engine.errors.UpdateInterrupted` (the model is between two steps).
A cancel request that comes after the first update is not honoured: the step
runs to its end.  For a schedule planned for the step's whole memory
(``schedule.step``) the ledger bounds the activations by what the budget
leaves beside the step's other parts at each instruction.

Energy: given an :class:`~engine.energy.EnergyMeter`, the executor runs each
step's instructions inside a :class:`~engine.energy.StepEnergyAccount` and
``last_stats.energy`` holds the step's total and per node class.  Each
instruction of the main thread is charged to the class of what it does or
waits for: ``compute`` to compute; ``page_in`` and the queueing of its
prefetch to page-in; ``page_out`` (queueing the write) and a wait for that
write to reach flash to page-out (at the ``free``, or later where the schedule
leaves room to hold the value while it is written: :mod:`schedules.timeline`).
Any other ``free`` waits for nothing; it stays untracked, with the executor's
other overhead (``StepEnergy.untracked_joules``).  The I/O thread's own reading
and writing is not attributed apart: it overlaps whatever the main thread does
and every meter sees the whole device (or CPU package), so the joules it
draws beside a computation land in compute.  The page-in and page-out classes
are therefore the paging the step *waited for*, not all paging work; the I/O
thread's busy time per direction is ``io_in_seconds`` / ``io_out_seconds``.
The nominal-power estimate charges overlapped I/O at compute power for the
same reason.  Tracking costs two meter reads per instruction (microseconds with
the estimate).  The caller owns the meter (starts
it, or lets the account start it, and closes it).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from engine import allocator, rss
from engine.energy import Activity, EnergyMeter, StepEnergy, StepEnergyAccount
from engine.errors import ScheduleRefusedError, StepCancelled, UpdateInterrupted
from engine.ledger import Ledger, StepStats
from engine.optim import FusedOptimizer
from engine.optim.streamed import streamed_names, streaming
from engine.pager import FreeSpace, Pager, disk_free
from engine.runtime import ModelState, Runtime
from engine.segments import Segments
from schedules.errors import PlannerError
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.simulate import simulate
from schedules.timeline import Donor, plan_io


class Executor:
    """Runs training steps of ``model`` as ``schedule`` says; see the module docstring.

    Parameters
    ----------
    model, segments, graph:
        The model and what :func:`engine.extract` returned for it.
    schedule:
        A schedule planned for ``graph``.
    swap_dir:
        Directory on the device's flash/SD for page files; needed when the
        schedule pages.  Stale page files of dead processes there are removed.
        The executor's own files stay between successful steps (each step
        overwrites them in place; their space stays reserved) and go at
        :meth:`close` or after a failed step.
    measure_rss:
        Measure the process's peak RSS over each step (resets ``VmHWM``).
    free_space:
        How to read the swap filesystem's free bytes (tests inject a reading).
    meter:
        Energy meter; with one, each step's energy per node class is in
        ``last_stats.energy`` (see the module docstring for the attribution).
    updates:
        The optimizer whose updates run inside the backward pass (see the module docstring); without it the
        step leaves parameter ``.grad`` as plain autograd would.
    """

    def __init__(
        self,
        model: nn.Module,
        segments: Segments,
        graph: TrainingGraph,
        schedule: Schedule,
        swap_dir: str | Path | None = None,
        *,
        measure_rss: bool = True,
        free_space: FreeSpace = disk_free,
        meter: EnergyMeter | None = None,
        updates: FusedOptimizer | None = None,
    ) -> None:
        self.report = _check(segments, graph, schedule)
        self.updates = updates
        self._streamed = streamed_names(model, updates.streamed_weights) if updates is not None else []
        self.graph, self.schedule = graph, schedule
        self.instructions = tuple(schedule.instructions)
        self.runtime = Runtime(model, segments)
        self.measure_rss = measure_rss
        self.meter = meter
        self.paged_nodes = sorted({n for op, n in self.instructions if op == "page_out"})
        self.pager: Pager | None = None
        if self.paged_nodes:
            if swap_dir is None:
                raise ScheduleRefusedError("this schedule pages values out; give the executor a swap_dir on flash")
            self.pager = Pager(swap_dir, free_space)
        limit = schedule.memory_budget if schedule.memory_budget is not None else self.report.peak_memory_bytes
        # read-ahead buffers, values written behind and memory kept for a later read go on top of what each
        # instruction holds, its node's workspace included
        self._limit = limit
        self._layouts: dict[int, tuple[int, ...]] = {}  # node -> its storage sizes, as last freed
        self._plan_io()
        # A freed activation must leave the process, or the budget binds the ledger but not the device's RAM:
        # glibc otherwise keeps freed tensors for reuse, and RSS grows well past the ledger.  The price is a page
        # fault per fresh page.
        rss.return_freed_memory()
        # Large blocks freed by a step are kept for reuse instead (engine.allocator) as long as all it holds stays
        # within what the step plans to hold: no fault to map them again, and RSS still within the plan
        # (extraction times nodes from that cache too).  The runtime's own memory (the pager's buffers, what the
        # model's first run left) is not the allocator's to fill, nor what malloc holds for small parameters.
        self.allocator = allocator.for_step(max(0, schedule.predicted_peak_bytes - graph.runtime_bytes
                                                - planned_in_heap(graph, schedule)))
        # the limit is the process's: each step puts back its own (another executor may have run in between)
        self._cache_limit = self.allocator.limit_bytes if self.allocator is not None else 0
        # ... and what still landed in the heap goes back once TRIM_SHARE of the budget is free there
        self._heap = rss.HeapTrimmer(max(1, int(TRIM_SHARE * limit)),
                                     self.allocator.heap_freed_bytes if self.allocator is not None else None)
        self._behind: dict[int, int] = {}     # value freed while its write runs -> bytes the write still holds
        self._deadlines: dict[int, int] = {}  # ... -> position before which the write must be done
        self._read_of: dict[int, tuple[int, int]] = {}  # paged-in value -> the read that brought it
        self._kept: dict[Donor, int] = {}               # freed value whose memory waits for a read -> bytes
        self.last_stats: StepStats | None = None

    def step(self, inputs: Any, targets: Any, cancel: Callable[[], bool] | None = None) -> torch.Tensor:
        """Run one training step; returns the loss, leaves parameter ``.grad`` as plain autograd would.

        ``cancel`` is asked before every instruction; when it answers True the
        step stops there, the model is rolled back to where it was before the
        step, and :class:`~engine.errors.StepCancelled` is raised.
        """
        updates = self.updates
        state = ModelState(self.runtime.model, keep_grads=updates is not None,
                           outside_rng=self.runtime.replay.watches_outside)  # no NumPy state copied each step
        ledger = Ledger(self.report.resident_bytes, self.schedule.memory_budget, self._activation_limits())
        node_seconds = [0.0] * self.graph.size
        try:
            if self.allocator is not None:
                self.allocator.set_limit(self._cache_limit)
            self.runtime.start(inputs, targets)
            if self.pager is not None:
                self.pager.reset_counters()
                self.pager.reserve({n: self.graph.nodes[n].bytes for n in self.paged_nodes})
            rss_before = rss.start_window() if self.measure_rss else None
            if rss_before is not None and self.allocator is not None:  # blocks cached for this step are its own
                rss_before -= self.allocator.stats().cached_bytes
            account = StepEnergyAccount(self.meter) if self.meter is not None else None
            streamed = streaming(self.runtime.model, self._streamed, updates) if self._streamed else nullcontext()
            with account if account is not None else nullcontext(), streamed:  # its window holds the step's
                started = time.perf_counter()
                for position, (op, node) in enumerate(self.instructions):
                    if cancel is not None and cancel() and not (updates is not None and updates.started):
                        raise StepCancelled(f"step cancelled at instruction {position} of {len(self.instructions)}")
                    if self._behind:
                        self._settle_writes(position, account)
                    for ahead in self.prefetch.get(position, ()):
                        with self._track(account, "page_in", ahead):
                            self._prefetch(ahead, position)
                    began = time.perf_counter()
                    if op == "free":
                        with self._track(account, op, node, position):
                            self._free(node, position)
                    elif op == "page_in":
                        with self._track(account, op, node):
                            self._page_in(node, position)
                    else:
                        with self._track(account, op, node):
                            getattr(self, f"_{op}")(node)
                    node_seconds[node] += time.perf_counter() - began
                    inflight = self.pager.inflight_bytes + sum(self._behind.values()) + sum(self._kept.values()) \
                        if self.pager else 0
                    ledger.record(position, self.runtime.store.resident_bytes, inflight)
                seconds = time.perf_counter() - started
            loss = self.runtime.loss
        except BaseException as exc:
            self._end_step(keep_files=False)
            if updates is not None and updates.started:
                updates.settle()
                raise UpdateInterrupted(
                    f"the step failed after updating {updates.updates} of {len(updates.slots)} parameters ({exc}); "
                    "the model is between two steps: restore it from the last checkpoint") from exc
            state.rollback()
            raise
        peak = rss.peak_since_start() if rss_before is not None else None
        self._end_step(keep_files=True)
        state.commit()
        energy = account.result if account is not None else None
        self.last_stats = self._stats(ledger, node_seconds, seconds, rss_before, peak, energy)
        if self._read_ms is None and self.last_stats.pagein_bandwidth_bps:
            self._plan_io(self.last_stats.pagein_bandwidth_bps)
        return loss

    def _activation_limits(self) -> list[int] | None:
        """Per instruction, the bytes a whole-step schedule leaves the activations beside its other parts."""
        budget, fixed = self.schedule.memory_budget, self.report.fixed_bytes
        if budget is None or not fixed:
            return None
        return [budget - f for f in fixed]

    def _plan_io(self, read_bps: float | None = None) -> None:
        """Plan read-ahead, write-behind and reused read memory (:func:`schedules.timeline.plan_io`); with the
        page-in bandwidth a step measured, a read may start later to take over a freed value's memory where
        the computations before its ``page_in`` still cover it."""
        nodes = self.graph.nodes
        self._read_ms = [n.bytes / read_bps * 1e3 for n in nodes] if read_bps else None
        # a step has seen the storages: a read takes over only memory of its own layout (before, of its bytes)
        layouts = [self._layouts.get(i, n.bytes) for i, n in enumerate(nodes)] if read_bps else None
        self.io_plan = plan_io(self.instructions, [n.bytes for n in nodes], self.report.working_bytes, self._limit,
                               [n.compute_ms for n in nodes], self._read_ms, layouts)
        self.prefetch = self.io_plan.reads

    def close(self) -> None:
        """Stop the pager's I/O thread and remove its page files (kept between successful steps)."""
        if self.pager is not None:
            self.pager.close()

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- instructions ------------------------------------------------------------
    def _compute(self, node: int) -> None:
        backward = self.updates is not None and self.graph.is_backward(node)
        if backward:
            self.updates.computing(node)
        self.runtime.compute(node)
        if backward:
            self.updates.computed(node)  # the background updates of the node before it are done now

    def _free(self, node: int, position: int) -> None:
        paged = self.pager is not None and self.pager.has_page(node)
        if paged:
            deadline = self.io_plan.release_by.get(position)
            if deadline is None or self.pager.is_written(node):
                self.pager.wait_written(node)  # no room to hold the value beyond its free: wait for its write
            else:  # the write holds the storages until the bytes are on flash, within the room planned
                self._behind[node] = self.runtime.value_bytes(node)
                self._deadlines[node] = deadline
        if self._read_ms is None:  # until the step that lets _plan_io match layouts
            self._layouts[node] = tuple(sorted(self.runtime.store.value(node).slot_bytes))
        read = self._read_of.pop(node, None)
        if read in self.io_plan.keep:  # its memory waits for a later read (pager), within the room planned
            self._kept[read] = self.runtime.value_bytes(node)
        elif ("free", position) in self.io_plan.keep:  # so do the storages of this computed value
            self._kept[("free", position)] = self.runtime.value_bytes(node)
            self.pager.donate(("free", position), self.runtime.storages(node))
        self.runtime.free(node, keep_skeleton=paged)
        self._heap.after_free()

    def _settle_writes(self, position: int, account: StepEnergyAccount | None) -> None:
        """Forget values written behind whose writes are done; wait for those whose room ends here."""
        for node in list(self._behind):
            done = self.pager.is_written(node)
            if done or self._deadlines[node] <= position:
                waits = account is not None and not done
                with account.track(Activity.PAGE_OUT) if waits else nullcontext():
                    self.pager.wait_written(node)  # raises what a failed write raised
                del self._behind[node]

    def _page_out(self, node: int) -> None:
        self.pager.write(node, self.runtime.storages(node))

    def _page_in(self, node: int, position: int) -> None:
        slots = self.runtime.store.values[node].slot_bytes
        if node in self._read_of:  # read ahead
            self.runtime.install(node, self.pager.read(node, slots))
        else:  # the read is this page_in's
            self._read_of[node] = (position, node)
            self.runtime.install(node, self.pager.read(node, slots, *self._memory_for((position, node))))

    def _prefetch(self, node: int, position: int) -> None:
        self._read_of[node] = (position, node)
        self.pager.prefetch(node, self.runtime.store.values[node].slot_bytes, *self._memory_for((position, node)))

    def _memory_for(self, read: tuple[int, int]) -> tuple[Donor | None, tuple[int, int] | None]:
        """(kept memory to read into, name to keep this read's memory under) for the pager."""
        reuse = self.io_plan.reuse.get(read)
        if reuse is not None:
            self._kept.pop(reuse, None)  # from here on the read counts it
        return reuse, read if read in self.io_plan.keep else None

    # -- bookkeeping -------------------------------------------------------------
    def _track(self, account: StepEnergyAccount | None, op: str, node: int,
               position: int | None = None) -> AbstractContextManager[None]:
        """Charge the instruction ``(op, node)`` to its node class (see the module docstring)."""
        if account is None:
            return nullcontext()
        if op == "free":
            if self.pager is None or not self.pager.has_page(node) or position in self.io_plan.release_by:
                return nullcontext()  # waits for nothing (at most for a write that is all but done): overhead
            return account.track(Activity.PAGE_OUT)  # waits for the write to reach flash
        return account.track(_ACTIVITY[op])

    def _end_step(self, keep_files: bool) -> None:
        self._behind.clear()
        self._read_of.clear()
        self._kept.clear()
        if self.pager is not None:
            self.pager.end_step(keep_files)
        self.runtime.finish()

    def _stats(self, ledger: Ledger, node_seconds: list[float], seconds: float,
               rss_before: int | None, peak: int | None, energy: StepEnergy | None) -> StepStats:
        pager = self.pager
        return StepStats(
            ledger=tuple(ledger.entries), predicted=tuple(self.report.resident_bytes),
            budget=self.schedule.memory_budget, peak_with_inflight_bytes=ledger.peak_with_inflight,
            step_seconds=seconds, node_seconds=tuple(node_seconds),
            node_io_seconds=tuple(pager.node_io_seconds.get(n, 0.0) for n in range(self.graph.size)) if pager else (),
            bytes_paged_out=pager.bytes_out if pager else 0, bytes_paged_in=pager.bytes_in if pager else 0,
            io_seconds=pager.io_seconds if pager else 0.0, io_wait_seconds=pager.wait_seconds if pager else 0.0,
            io_out_seconds=pager.seconds["out"] if pager else 0.0, io_in_seconds=pager.seconds["in"] if pager else 0.0,
            reads_into_kept=pager.reads_into_kept if pager else 0,
            bytes_read_into_kept=pager.kept_bytes_in if pager else 0,
            io_in_kept_seconds=pager.kept_in_seconds if pager else 0.0,
            rss_before_bytes=rss_before, peak_rss_bytes=peak, energy=energy,
        )


TRIM_SHARE = 0.02
"""Free heap bytes, as a share of the budget, that make the executor trim the heap (:class:`engine.rss.HeapTrimmer`)."""

_ACTIVITY = {"compute": Activity.COMPUTE, "page_in": Activity.PAGE_IN, "page_out": Activity.PAGE_OUT}


def planned_in_heap(graph: TrainingGraph, schedule: Schedule) -> int:
    """What a whole-step plan counts for tensors below the caching allocator's threshold
    (:data:`engine.allocator.LARGE_BYTES`), which malloc's heap holds, not the allocator: the gradients of
    small parameters and, where kept in RAM, their optimizer state.

    Left in the allocator's limit, these bytes would let its cache keep blocks resident beyond the plan while
    the heap holds them too: a kernel that asks for a block and never writes it (a BatchNorm backward on CPU
    makes its input gradient twice and writes one) can take a cached, resident block while the block it writes
    faults in afresh, and the digits model's steps read up to 0.7 MB above their plan in some processes.
    """
    if schedule.step is None:
        return 0
    on_flash, state_tensors = set(schedule.step.state_on_flash), schedule.step.training.state_tensors
    return sum(p.bytes * (1 + (0 if i in on_flash else state_tensors))
               for i, p in enumerate(graph.parameters) if p.bytes < allocator.LARGE_BYTES)


def _check(segments: Segments, graph: TrainingGraph, schedule: Schedule):
    """Refuse what cannot run exactly and within budget; returns the simulator's report."""
    try:
        schedule.check_graph(graph)
        report = simulate(graph, schedule)
    except PlannerError as exc:
        raise ScheduleRefusedError(f"schedule refused: {exc}") from exc
    segments.check_graph([n.name for n in graph.nodes])
    first = [n for op, n in _first_computes(schedule.instructions) if 0 < n < segments.loss_node + 1]
    if first != sorted(first):
        raise ScheduleRefusedError(
            f"the schedule first computes forward nodes in the order {first[:12]}...; exact replay of random "
            "draws needs stage order (each forward node first computed at its own stage)")
    return report


def _first_computes(instructions) -> list[tuple[str, int]]:
    seen: set[int] = set()
    out = []
    for op, node in instructions:
        if op == "compute" and node not in seen:
            seen.add(node)
            out.append((op, node))
    return out
