"""Optimizer state on flash: one page file per chunk of a parameter's state, read ahead and written behind.

A parameter whose state the plan puts on flash keeps it in page files in the
swap directory, chunk ``k`` of every state tensor (Adam's ``exp_avg`` and
``exp_avg_sq``) together in one page, so an update reads one page and
writes it back.  :class:`StatePages` does that I/O on the process's paging
thread (:func:`engine.pager.paging_thread`, shared with the activations'
pager, in the order it is asked for): ``prefetch`` queues the read of the next
chunk while the current one is updated, ``write`` queues the write-back and
returns, holding the chunk's memory until it is on flash; at most
:data:`WRITES_BEHIND` writes wait at once, so the state in RAM stays a few
chunks.  Pages are the same files as activation pages (:mod:`engine.pagefile`:
O_DIRECT, CRC-32C, header naming the page), so a damaged chunk is refused
with :class:`~engine.errors.PageCorruptError`, never read as state.

Unlike activation pages these live as long as training does: they *are* the
state between steps.  Their space is reserved when training starts (a full
disk is reported then, not mid-step), a failed step leaves them as they were
(each page is rewritten only after its chunk's update), and they go with
:meth:`StatePages.close` -- or with the process: a new pager removes the
pages of processes that no longer run.  A checkpoint copies them out chunk
by chunk (:meth:`engine.optim.fused.FusedOptimizer.state_sources`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from engine import pagefile
from engine.errors import PageError
from schedules.step_memory import WRITE_BEHIND_CHUNKS
from engine.pager import (HEADER_ALLOWANCE, FreeSpace, _remove_files, disk_free, paging_thread, remove_stale,
                         reserve_files, waited)

WRITES_BEHIND = WRITE_BEHIND_CHUNKS
"""Writes of updated chunks that may wait for flash at once; the next one waits for the oldest (the plan
leaves room for them: :data:`schedules.step_memory.WRITE_BEHIND_CHUNKS`)."""

Key = tuple[int, int]  # (parameter index, chunk)


class StatePages:
    """Optimizer-state pages of one training process in ``swap_dir``; see the module docstring."""

    def __init__(self, swap_dir: str | Path, free_space: FreeSpace = disk_free,
                 system: pagefile.SystemCalls = pagefile.SYSTEM) -> None:
        self.dir = Path(swap_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PageError(f"cannot create swap directory {self.dir}: {exc.strerror or exc}") from exc
        self.free_space = free_space
        self.system = system
        self.token = uuid.uuid4().hex[:8]
        remove_stale(self.dir)
        self._io = paging_thread()
        self._reads: dict[Key, Future] = {}
        self._writes: dict[Key, Future] = {}
        self._lock = threading.Lock()
        self.written: set[Key] = set()  # pages that hold state (the rest: never written, state not made yet)
        self._pattern = f"poet-{os.getpid()}-{self.token}-s*.page"
        self._finalizer = weakref.finalize(self, _remove_files, self.dir, self._pattern)
        self.bytes_in = self.bytes_out = 0
        self.seconds_in = self.seconds_out = self.wait_seconds = 0.0

    def path(self, key: Key) -> Path:
        parameter, chunk = key
        return self.dir / f"poet-{os.getpid()}-{self.token}-s{parameter}.{chunk}.page"

    @staticmethod
    def page_id(key: Key) -> int:
        """The id a page's header carries (a page copied under another chunk's name is refused)."""
        parameter, chunk = key
        return (parameter << 16 | chunk) & 0xFFFFFFFF

    def reserve(self, pages: Mapping[Key, Sequence[int]]) -> None:
        """Allocate every page (key -> slot sizes) before training, or raise :class:`SwapSpaceError`."""
        reserve_files(self.dir, {self.path(key): pagefile.page_size(slots) + HEADER_ALLOWANCE
                                 for key, slots in pages.items()},
                      self.free_space, self.system, "the optimizer state planned for flash (more of it stays in RAM "
                      "at a larger budget)")

    def prefetch(self, key: Key, slot_bytes: Sequence[int]) -> None:
        """Queue the read of ``key``'s page (nothing for a page never written)."""
        if key in self._reads or key not in self.written:
            return
        self._reads[key] = self._io.submit(self._timed, "in", self._read, key, list(slot_bytes))

    def read(self, key: Key, slot_bytes: Sequence[int]) -> list[torch.UntypedStorage] | None:
        """``key``'s storages (the prefetched read, or one now); ``None`` for a page never written."""
        if key in self._writes:  # its last write must land before it is read back
            self._wait(self._writes.pop(key))
        if key not in self.written:
            return None
        self.prefetch(key, slot_bytes)
        return self._wait(self._reads.pop(key))

    def write(self, key: Key, storages: list[torch.UntypedStorage]) -> None:
        """Queue ``key``'s page; its storages stay referenced until written.  Waits for the oldest write
        when :data:`WRITES_BEHIND` are queued."""
        while len(self._writes) >= WRITES_BEHIND:
            oldest = next(iter(self._writes))
            self._wait(self._writes.pop(oldest))
        self._writes[key] = self._io.submit(self._timed, "out", self._write, key, storages)

    def flush(self) -> None:
        """Wait until every queued write is on flash (raises what a failed write raised)."""
        for key in list(self._writes):
            self._wait(self._writes.pop(key))

    def drop_reads(self) -> None:
        """Forget reads queued ahead (a step that ended early); their memory goes with them."""
        for future in self._reads.values():
            future.cancel()
        for future in self._reads.values():
            if not future.cancelled():
                try:
                    future.result()
                except Exception:  # noqa: BLE001 - read ahead for a step that ended: nobody needs it
                    pass
        self._reads.clear()

    def close(self) -> None:
        """Wait for queued I/O and remove the pages."""
        try:
            self.flush()
        finally:
            self.drop_reads()
            _remove_files(self.dir, self._pattern)
            self._finalizer.detach()

    # -- the I/O thread ------------------------------------------------------------
    def _read(self, key: Key, slot_bytes: list[int]) -> list[torch.UntypedStorage]:
        return pagefile.read(self.path(key), self.page_id(key), slot_bytes, system=self.system)

    def _write(self, key: Key, storages: list[torch.UntypedStorage]) -> int:
        written = pagefile.write(self.path(key), self.page_id(key), storages, system=self.system)
        with self._lock:
            self.written.add(key)
        return written

    def _timed(self, direction: str, job: Callable, *args):
        started = time.perf_counter()
        result = job(*args)
        seconds = time.perf_counter() - started
        with self._lock:
            if direction == "out":
                self.seconds_out += seconds
                self.bytes_out += result
            else:
                self.seconds_in += seconds
                self.bytes_in += sum(s.nbytes() for s in result)
        return result

    def _wait(self, future: Future):
        return waited(future, self)
