"""The pager: page files in a swap directory, written and read by one background I/O thread.

* ``write`` queues a page-out and returns at once, so the write overlaps the
  compute that follows; the RAM copy stays until the executor's ``free``, which
  waits for the write to finish first (memory is released only once the bytes
  are safely on flash).
* ``prefetch`` queues a read ahead of its ``page_in`` (the executor decides
  how far ahead, within the budget); ``read`` takes the prefetched storages or
  reads at once.  One FIFO thread means a page is never read before it is written.
* ``reserve`` runs before a step: it checks the filesystem has room for every
  page the schedule writes and allocates the files (``posix_fallocate``), so a
  full disk is reported before any work and never mid-step.
* Files are named ``poet-<pid>-<token>-n<node>.page``; ``end_step`` removes
  this step's files, and a new pager removes files left by dead processes.

Nothing here knows torch beyond storages; page format, O_DIRECT and the copy/I-O pipeline (a helper
thread with a 2 MiB bounce buffer per I/O thread) in :mod:`agent.pagefile`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Mapping

import torch

from agent import pagefile
from agent.errors import PageError, SwapSpaceError

_NAME = re.compile(r"^poet-(\d+)-[0-9a-f]+-n\d+\.page$")
# Per-page allowance for the header, whose size depends on the slot count (up to 8000 slots), and the
# padding of the data to a whole block (pagefile.page_size).
HEADER_ALLOWANCE = (64 << 10) + pagefile.BLOCK

FreeSpace = Callable[[Path], int]


def disk_free(path: Path) -> int:
    """Bytes an unprivileged process may still write on ``path``'s filesystem."""
    return shutil.disk_usage(path).free


class Pager:
    """Page files of one executor in ``swap_dir``; see the module docstring."""

    def __init__(self, swap_dir: str | Path, free_space: FreeSpace = disk_free) -> None:
        self.dir = Path(swap_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PageError(f"cannot create swap directory {self.dir}: {exc.strerror or exc}") from exc
        self.free_space = free_space
        self.token = uuid.uuid4().hex[:8]
        self.removed_stale = remove_stale(self.dir)
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="poet-pager")
        self._writes: dict[int, Future] = {}
        self._reads: dict[int, Future] = {}
        self._lock = threading.Lock()
        self.reset_counters()

    # -- step ------------------------------------------------------------------
    def reserve(self, page_bytes: Mapping[int, int]) -> None:
        """Make room for one page per node in ``page_bytes`` (node -> value bytes) before the step."""
        sizes = {node: nbytes + HEADER_ALLOWANCE for node, nbytes in page_bytes.items()}
        needed = sum(sizes.values())
        available = self.free_space(self.dir)
        if needed > available:
            raise SwapSpaceError(
                f"swap directory {self.dir} has {available:,} bytes free but this schedule pages {needed:,} "
                f"bytes ({len(sizes)} pages); free {needed - available:,} bytes there, point swap_dir at a "
                "larger filesystem, or plan with a larger memory budget", needed, available)
        try:
            for node, size in sizes.items():
                pagefile.reserve(self.path(node), size)
        except OSError as exc:
            self.end_step()
            raise SwapSpaceError(f"could not reserve {needed:,} bytes in {self.dir}: {exc.strerror or exc}",
                                 needed, available) from exc

    def end_step(self) -> None:
        """Wait for queued I/O, then remove this executor's page files."""
        for future in [*self._writes.values(), *self._reads.values()]:
            try:
                future.result()
            except Exception:  # the step already failed or succeeded; only cleanup is left
                pass
        self._writes.clear()
        self._reads.clear()
        for path in self.dir.glob(f"poet-{os.getpid()}-{self.token}-n*.page"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """End the I/O thread (after :meth:`end_step`)."""
        self.end_step()
        self._io.shutdown(wait=True)

    def reset_counters(self) -> None:
        self.bytes_out = self.bytes_in = 0
        self.io_seconds = self.wait_seconds = 0.0
        self.seconds = {"out": 0.0, "in": 0.0}  # I/O thread time per direction
        self.node_io_seconds: dict[int, float] = {}
        self.inflight_bytes = 0

    # -- pages -----------------------------------------------------------------
    def path(self, node: int) -> Path:
        return self.dir / f"poet-{os.getpid()}-{self.token}-n{node}.page"

    def has_page(self, node: int) -> bool:
        """True once a page-out of ``node`` was queued this step."""
        return node in self._writes

    def write(self, node: int, storages: list[torch.UntypedStorage]) -> None:
        """Queue the page-out of ``node`` (the storages stay referenced until it is written)."""
        self._writes[node] = self._io.submit(self._timed, node, "out", pagefile.write, self.path(node), node, storages)

    def wait_written(self, node: int) -> None:
        """Block until ``node``'s page is on flash (raises what the write raised)."""
        self._wait(self._writes[node])

    def prefetch(self, node: int, slot_bytes: list[int]) -> None:
        """Queue the read of ``node``'s page ahead of its page-in."""
        with self._lock:
            self.inflight_bytes += sum(slot_bytes)
        self._reads[node] = self._io.submit(self._timed, node, "in", pagefile.read, self.path(node), node, slot_bytes)

    def read(self, node: int, slot_bytes: list[int]) -> list[torch.UntypedStorage]:
        """``node``'s storages from flash: the prefetched ones, or read now."""
        if node not in self._reads:
            self.prefetch(node, slot_bytes)
        try:
            return self._wait(self._reads.pop(node))
        finally:
            with self._lock:
                self.inflight_bytes -= sum(slot_bytes)

    def _wait(self, future: Future):
        started = time.perf_counter()
        try:
            return future.result()
        finally:
            self.wait_seconds += time.perf_counter() - started

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
                self.bytes_in += sum(s.nbytes() for s in result)
        return result


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
