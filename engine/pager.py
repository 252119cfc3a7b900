"""The pager: page files in a swap directory, written and read by one background I/O thread.

* ``write`` queues a page-out and returns at once, so the write overlaps the
  compute that follows; the queued write holds the storages until the bytes
  are on flash, so RAM is released only then, whenever the executor drops its
  own references (:mod:`schedules.timeline` plans how long it may run ahead).
* ``prefetch`` queues a read ahead of its ``page_in`` (the executor decides
  how far ahead, within the budget); ``read`` takes the prefetched storages or
  reads at once.  One FIFO thread means a page is never read before it is written.
  A read told to ``keep`` its memory leaves it with the pager once read, for a
  later read told to ``reuse`` it (planned by :func:`schedules.timeline.plan_io`
  where the budget holds it in between): that read fills memory already mapped
  in.  So does a read told to ``reuse`` the storages of a value the executor
  freed and handed over (``donate``).  Memory still holding a storage in use
  is never reused.
* ``reserve`` runs before a step: it checks the filesystem has room for every
  page the schedule writes and allocates the files (``posix_fallocate``), so a
  full disk is reported before any work and never mid-step.  Bytes a file
  already holds on disk count as room.
* Files are named ``poet-<pid>-<token>-n<node>.page``.  ``end_step`` waits for
  the step's I/O and, unless told to keep them, removes the files; the executor
  keeps them between successful steps (the next step overwrites them in place:
  removing written files costs the filesystem an extent free and, on a disk
  mounted with ``discard``, a TRIM each, which adds up to milliseconds a step --
  and the space stays reserved against other writers) and
  removes them after a failed step and at ``close``.  A new pager removes files
  left by dead processes, and a pager that is garbage collected or outlives the
  interpreter removes its own.

Every pager of a process -- and the optimizer state's (:mod:`engine.optim.state_pages`) -- queues its I/O on
one paging thread (:func:`paging_thread`): pages of every kind are moved one after another, and the
process keeps one bounce buffer for all of them.

Nothing here knows torch beyond storages; page format, O_DIRECT and the checksum/I-O pipeline (two disk
threads per I/O thread, transfers straight from and into aligned memory, a 4 MiB bounce buffer for the rest)
in :mod:`engine.pagefile`.  Every page goes through
the pager's :class:`~engine.pagefile.SystemCalls` (the real system unless another is handed in), so a
test can give it a failing disk or a filesystem that refuses O_DIRECT.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping

import torch

from engine import pagefile
from engine.errors import PageError, SwapSpaceError

_NAME = re.compile(r"^poet-(\d+)-[0-9a-f]+-(?:n\d+|s\d+\.\d+)\.page$")  # activation and optimizer-state pages
# Per-page allowance for the header, whose size depends on the slot count (up to 8000 slots), and the
# padding of the data to a whole block (pagefile.page_size).
HEADER_ALLOWANCE = (64 << 10) + pagefile.BLOCK

FreeSpace = Callable[[Path], int]
Memory = pagefile.PageMemory | pagefile.DonatedMemory


_THREAD: ThreadPoolExecutor | None = None
_THREAD_LOCK = threading.Lock()


def paging_thread() -> ThreadPoolExecutor:
    """The process's one paging thread (made at first use; it ends with the interpreter)."""
    global _THREAD
    with _THREAD_LOCK:
        if _THREAD is None:
            _THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poet-pager")
        return _THREAD


def disk_free(path: Path) -> int:
    """Bytes an unprivileged process may still write on ``path``'s filesystem."""
    return shutil.disk_usage(path).free


class Pager:
    """Page files of one executor in ``swap_dir``; see the module docstring.

    Parameters
    ----------
    swap_dir:
        Directory on the flash the device pages to (created if missing).
    free_space:
        How many bytes the swap directory's filesystem has free (:func:`disk_free` by default).
    system:
        The system calls every page file goes through (:data:`engine.pagefile.SYSTEM` by default).
    """

    def __init__(self, swap_dir: str | Path, free_space: FreeSpace = disk_free,
                 system: pagefile.SystemCalls = pagefile.SYSTEM) -> None:
        self.dir = Path(swap_dir)
        self._make_dir()
        self.free_space = free_space
        self.system = system
        self.token = uuid.uuid4().hex[:8]
        self.removed_stale = remove_stale(self.dir)
        self._io = paging_thread()
        self._writes: dict[int, Future] = {}
        self._reads: dict[int, Future] = {}
        # read or freed value -> its memory, for a later read
        self._kept: dict[Hashable, Memory] = {}
        self._lock = threading.Lock()
        self._pattern = f"poet-{os.getpid()}-{self.token}-n*.page"
        self._finalizer = weakref.finalize(self, _remove_files, self.dir, self._pattern)
        self.reset_counters()

    def _make_dir(self) -> None:
        """Create the swap directory (again: a cleaner of /tmp or /var/tmp may have removed it between steps)."""
        if self.dir.exists() and not self.dir.is_dir():
            raise PageError(f"swap directory {self.dir} is a file, not a directory; point swap_dir at a directory "
                            "on the flash the device pages to")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PageError(f"cannot create swap directory {self.dir}: {exc.strerror or exc}") from exc

    # -- step ------------------------------------------------------------------
    def reserve(self, page_bytes: Mapping[int, int]) -> None:
        """Make room for one page per node in ``page_bytes`` (node -> value bytes) before the step."""
        self._make_dir()
        try:
            reserve_files(self.dir, {self.path(node): nbytes + HEADER_ALLOWANCE for node, nbytes in page_bytes.items()},
                          self.free_space, self.system, f"this schedule's {len(page_bytes)} pages")
        except SwapSpaceError:
            self.end_step()
            raise

    def end_step(self, keep_files: bool = False) -> None:
        """Wait for queued I/O, then remove this pager's page files unless ``keep_files``."""
        for future in [*self._writes.values(), *self._reads.values()]:
            try:
                future.result()
            except Exception:  # the step already failed or succeeded; only cleanup is left
                pass
        self._writes.clear()
        self._reads.clear()
        self._kept.clear()
        if not keep_files:
            _remove_files(self.dir, self._pattern)

    def close(self) -> None:
        """Wait for queued I/O and remove the page files (the paging thread stays for the next pager)."""
        self.end_step()
        self._finalizer.detach()

    def reset_counters(self) -> None:
        self.bytes_out = self.bytes_in = 0
        self.io_seconds = self.wait_seconds = 0.0
        self.seconds = {"out": 0.0, "in": 0.0}  # I/O thread time per direction
        self.node_io_seconds: dict[int, float] = {}
        self.inflight_bytes = 0
        self.reads_into_kept = 0  # reads that filled kept memory (an earlier read's, or a freed value's)
        self.kept_bytes_in, self.kept_in_seconds = 0, 0.0  # ... their bytes and I/O thread time
        self._into_kept: set[int] = set()  # nodes whose read this step filled kept memory

    # -- pages -----------------------------------------------------------------
    def path(self, node: int) -> Path:
        return self.dir / f"poet-{os.getpid()}-{self.token}-n{node}.page"

    def has_page(self, node: int) -> bool:
        """True once a page-out of ``node`` was queued this step."""
        return node in self._writes

    def write(self, node: int, storages: list[torch.UntypedStorage]) -> None:
        """Queue the page-out of ``node`` (the storages stay referenced until it is written)."""
        self._writes[node] = self._io.submit(self._timed, node, "out", self._write_page, node, storages)

    def is_written(self, node: int) -> bool:
        """True once ``node``'s queued write has finished (or failed: :meth:`wait_written` raises it)."""
        return self._writes[node].done()

    def wait_written(self, node: int) -> None:
        """Block until ``node``'s page is on flash (raises what the write raised)."""
        self._wait(self._writes[node])

    def donate(self, name: Hashable, storages: list[torch.UntypedStorage]) -> None:
        """Keep the storages of a value being freed under ``name``, for a later read told to ``reuse`` it."""
        with self._lock:
            self._kept[name] = pagefile.DonatedMemory(storages)

    def prefetch(self, node: int, slot_bytes: list[int], reuse: Hashable | None = None,
                 keep: Hashable | None = None) -> None:
        """Queue the read of ``node``'s page ahead of its page-in, into the memory kept as ``reuse`` if there is
        one; with ``keep``, its memory is kept under that name once read (until a read reuses it or the step
        ends)."""
        memory = self._kept.pop(reuse, None) if reuse is not None else None
        with self._lock:
            self.inflight_bytes += sum(slot_bytes)
        self._reads[node] = self._io.submit(self._timed, node, "in", self._read_page, node, slot_bytes, memory, keep)

    def read(self, node: int, slot_bytes: list[int], reuse: Hashable | None = None,
             keep: Hashable | None = None) -> list[torch.UntypedStorage]:
        """``node``'s storages from flash: the prefetched ones, or read now (``reuse``, ``keep``: as for
        :meth:`prefetch`)."""
        if node not in self._reads:
            self.prefetch(node, slot_bytes, reuse, keep)
        try:
            return self._wait(self._reads.pop(node))
        finally:
            with self._lock:
                self.inflight_bytes -= sum(slot_bytes)

    def _write_page(self, node: int, storages: list[torch.UntypedStorage]) -> int:
        return pagefile.write(self.path(node), node, storages, system=self.system)

    def _read_page(self, node: int, slot_bytes: list[int], memory: Memory | None,
                   keep: Hashable | None) -> list[torch.UntypedStorage]:
        reused = memory is not None and memory.fits(slot_bytes)
        if not reused:
            memory = pagefile.PageMemory(slot_bytes)
        storages = pagefile.read(self.path(node), node, slot_bytes, memory, system=self.system)
        with self._lock:
            self.reads_into_kept += reused
            if reused:
                self._into_kept.add(node)
            if keep is not None:
                self._kept[keep] = memory
        return storages

    def _wait(self, future: Future):
        return waited(future, self)

    def _timed(self, node: int, direction: str, job: Callable, *args):
        started = time.perf_counter()
        result = job(*args)
        seconds = time.perf_counter() - started
        with self._lock:
            self.io_seconds += seconds
            self.seconds[direction] += seconds
            self.node_io_seconds[node] = self.node_io_seconds.get(node, 0.0) + seconds
            if direction == "out":
                self.bytes_out += result
            else:
                nbytes = sum(s.nbytes() for s in result)
                self.bytes_in += nbytes
                if node in self._into_kept:  # memory mapped in already: the read alone, no fresh pages
                    self.kept_bytes_in += nbytes
                    self.kept_in_seconds += seconds
        return result


def waited(future: Future, counter: Any) -> Any:
    """``future``'s result (or its error), the seconds waited for it added to ``counter.wait_seconds``."""
    started = time.perf_counter()
    try:
        return future.result()
    finally:
        counter.wait_seconds += time.perf_counter() - started


def reserve_files(directory: Path, sizes: Mapping[Path, int], free_space: FreeSpace, system: pagefile.SystemCalls,
                  what: str) -> None:
    """Allocate each file in ``sizes`` (path -> bytes) in ``directory``, or raise :class:`SwapSpaceError` saying
    how much ``what`` needs beyond what the files hold already and the filesystem has free."""
    needed = sum(max(0, size - _allocated(path)) for path, size in sizes.items())
    available = free_space(directory)
    if needed > available:
        raise SwapSpaceError(
            f"swap directory {directory} has {available:,} bytes free but {what} need {needed:,} bytes more; free "
            f"{needed - available:,} bytes there, point swap_dir at a larger filesystem, or plan with a larger "
            "memory budget", needed, available)
    try:
        for path, size in sizes.items():
            pagefile.reserve(path, size, system=system)
    except OSError as exc:
        raise SwapSpaceError(f"could not reserve {needed:,} bytes in {directory}: {exc.strerror or exc}",
                             needed, available) from exc


def _allocated(path: Path) -> int:
    """Bytes ``path`` holds on disk (0 when it does not exist)."""
    try:
        return path.stat().st_blocks * 512
    except FileNotFoundError:
        return 0


def _remove_files(directory: Path, pattern: str) -> None:
    for path in directory.glob(pattern):
        path.unlink(missing_ok=True)


def remove_stale(swap_dir: Path) -> list[Path]:
    """Remove page files left by processes that no longer run; returns what was removed."""
    removed = []
    for path in swap_dir.glob("poet-*.page"):
        match = _NAME.match(path.name)
        if match and not _alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
