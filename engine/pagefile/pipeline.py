"""The copy/checksum vs disk I/O pipeline: a bounce buffer of four slices and two disk threads per paging thread.

The slots of whole blocks that start on a block boundary are written from and read into their own memory
(:func:`write_in_place`, :func:`read_in_place`): this thread checksums chunk k while the disk threads move
chunks k+1 .. k+3, with no copy.  Reads and writes are queued three ahead on two disk threads, so the disk
has two requests at once and never waits for a thread to wake up and ask for the next chunk.  The other
bytes (a BatchNorm's statistics, a small page, memory not on a block boundary) go through the bounce
buffer: this thread copies a chunk into one slice and checksums it while the disk threads write the others
(reads: copies it out of its slice).  The slices are :data:`CHUNK` bytes: 4 x 1 MiB per paging thread,
mapped in only as far as a page ever fills them, which the memory budget has to leave room for
(:func:`engine.profile.measure_runtime_bytes`).  Figures in docs/benchmarks.md.

Every disk call goes through the :class:`~engine.pagefile.system.SystemCalls` it is given; under
O_DIRECT an ``EINVAL`` from it becomes :class:`DirectRefused`, on which the caller retries buffered.
"""

from __future__ import annotations

import errno
import mmap
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

from crc32c import crc32c

from engine.errors import PageCorruptError
from engine.pagefile.layout import BLOCK, aligned
from engine.pagefile.memory import populate
from engine.pagefile.system import SystemCalls

CHUNK = 1 << 20      # bytes per slice of the bounce buffer: the unit of copy/checksum vs I/O overlap
SLICES = 4           # slices of the bounce buffer: up to three chunks in flight while one is copied
READ_AHEAD = SLICES - 1  # chunks a read keeps queued beyond the one this thread checksums
DISK_THREADS = 2     # requests the disk has at once: under a training step, two in flight hide the wake-ups


class DirectRefused(Exception):
    """The filesystem refused O_DIRECT; the caller retries buffered."""


class Transfer:
    """One paging thread's aligned bounce buffer (:data:`SLICES` slices) and the :data:`DISK_THREADS` threads
    that do its disk I/O."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, SLICES * CHUNK)  # anonymous mmap: page aligned, as O_DIRECT needs
        view = memoryview(self._memory)
        self.whole = view  # all slices as one buffer: a small page goes through it in one I/O
        self.slices = tuple(view[i * CHUNK:(i + 1) * CHUNK] for i in range(SLICES))
        self.disk = ThreadPoolExecutor(max_workers=DISK_THREADS, thread_name_prefix="poet-page-disk")
        self._head = memoryview(mmap.mmap(-1, BLOCK))

    def header(self, size: int) -> memoryview:
        """An aligned buffer of exactly ``size`` bytes (whole blocks) for a header, apart from the slices (a
        read's header is read beside its data)."""
        if len(self._head) < size:
            self._head = memoryview(mmap.mmap(-1, size))
        return self._head[:size]


_local = threading.local()


def transfer() -> Transfer:
    """The calling thread's :class:`Transfer`, made on first use (one bounce buffer per paging thread)."""
    made = getattr(_local, "transfer", None)
    if made is None:
        made = _local.transfer = Transfer()
    return made


class Pipeline:
    """Chunk k's disk I/O runs on a disk thread while this thread works on another chunk in another slice.

    Chunk k uses slice ``k % SLICES``.  Leaving the ``with`` block waits for every submitted I/O, also on an
    error, so no I/O outlives the file descriptor; an O_DIRECT refusal (``EINVAL``) becomes
    :class:`DirectRefused`.
    """

    def __init__(self, transfer: Transfer, direct: bool) -> None:
        self.slices, self._disk, self._direct = transfer.slices, transfer.disk, direct
        self._pending: list[Future | None] = [None] * len(self.slices)

    def slice(self, k: int) -> memoryview:
        """Chunk ``k``'s slice (the caller has waited for whatever used it before)."""
        return self.slices[k % len(self.slices)]

    def take(self, k: int) -> memoryview:
        """Chunk ``k``'s slice, once the disk is done with the chunk that used it before."""
        self.wait(k)
        return self.slice(k)

    def submit(self, k: int, job: Callable, *args) -> None:
        """Run ``job(*args)`` on a disk thread as chunk ``k``'s I/O (its slice's previous I/O waited for)."""
        self._pending[k % len(self.slices)] = self._disk.submit(run_io, self._direct, job, *args)

    def wait(self, k: int):
        """Wait for the I/O last submitted in chunk ``k``'s slice; returns its result (``None`` if none)."""
        at = k % len(self.slices)
        future, self._pending[at] = self._pending[at], None
        return future.result() if future is not None else None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, kind, error, trace) -> None:
        for k in range(len(self.slices)):
            try:
                self.wait(k)
            except Exception:
                if kind is None:
                    raise  # otherwise the first error is the one to report


def run_io(direct: bool, job: Callable, *args):
    """Run one I/O call; under O_DIRECT an ``EINVAL`` means the filesystem refuses direct I/O."""
    try:
        return job(*args)
    except OSError as exc:
        if direct and exc.errno == errno.EINVAL:
            raise DirectRefused() from exc
        raise


def open_page(system: SystemCalls, path: Path, flags: int, direct: bool) -> int:
    """Open a page file, with O_DIRECT where ``direct`` (:class:`DirectRefused` where the filesystem refuses)."""
    return run_io(direct, system.open, path, flags, direct)


def _pieces(views: Sequence[memoryview], position: int) -> list[tuple[memoryview, int]]:
    """The views cut in chunks of at most :data:`CHUNK` bytes, with the file position of each: the views lie
    back to back in the file from ``position``."""
    pieces = []
    for view in views:
        pieces += [(view[start:start + CHUNK], position + start) for start in range(0, len(view), CHUNK)]
        position += len(view)
    return pieces


def read_in_place(system: SystemCalls, fd: int, transfer: Transfer, path: Path, into: Sequence[memoryview],
                  position: int, direct: bool, mapped: bool) -> int:
    """Read the bytes of the views ``into`` (whole blocks each, on block boundaries), back to back in the file
    from ``position``, straight into them, in chunks queued :data:`READ_AHEAD` ahead on the disk threads: while
    they read, this thread maps in the memory of the chunks it queues next (unless it is ``mapped`` already)
    and checksums those read.  Returns the CRC of what was read.

    Against the bounce buffer this saves a copy of every byte, and mapping the fresh memory beside the reads
    instead of before them takes it off the page-in's critical path."""
    pieces = _pieces(into, position)
    pending: dict[int, Future] = {}

    def read(k: int) -> None:
        piece, at = pieces[k]
        if not mapped:
            populate(piece, system)
        pending[k] = transfer.disk.submit(run_io, direct, read_all, system, fd, piece, at, path)

    crc = 0
    try:
        for k in range(min(READ_AHEAD, len(pieces))):
            read(k)
        for k, (piece, _) in enumerate(pieces):
            pending.pop(k).result()
            if k + READ_AHEAD < len(pieces):
                read(k + READ_AHEAD)  # its memory mapped in beside the reads queued before it
            crc = crc32c(piece, crc)  # beside the reads queued after it
    finally:
        for future in pending.values():  # after an error: no read may outlive the file descriptor
            future.exception()
    return crc


def write_in_place(system: SystemCalls, fd: int, transfer: Transfer, views: Sequence[memoryview],
                   position: int, direct: bool) -> int:
    """Write the views (whole blocks each, on block boundaries) back to back from ``position``, straight from
    their memory: this thread checksums each chunk and queues its write, at most :data:`READ_AHEAD` writes
    ahead of it on the disk threads.  Returns the CRC of the bytes.  Against the bounce buffer this saves
    a copy of every byte (and the copy's hold on the interpreter).  Every write is done when it returns: the
    caller's storages may be freed then."""
    pending: deque[Future] = deque()
    crc = 0
    try:
        for piece, at in _pieces(views, position):
            crc = crc32c(piece, crc)
            pending.append(transfer.disk.submit(run_io, direct, write_all, system, fd, piece, at))
            if len(pending) > READ_AHEAD:
                pending.popleft().result()
        while pending:
            pending.popleft().result()
    finally:
        for future in pending:  # after an error: no write may outlive the file descriptor
            future.exception()
    return crc


class BouncedRead:
    """Read the bytes of ``views``, back to back from ``position``, through the bounce buffer: made, it queues
    the first :data:`READ_AHEAD` chunks; :meth:`finish` copies each out as it arrives (checksumming it) while
    the disk threads read the chunks after it."""

    def __init__(self, system: SystemCalls, pipe: Pipeline, fd: int, path: Path, views: Sequence[memoryview],
                 position: int, mapped: bool) -> None:
        self._system, self._pipe, self._fd, self._path = system, pipe, fd, path
        self._views, self._position = views, position
        self._chunks = list(chunks(position, sum(map(len, views))))
        if not mapped:
            for view in views:  # in one go: a copy faulting fresh memory in as it writes is slower than the disk
                populate(view, system)
        for k in range(min(READ_AHEAD, len(self._chunks))):
            self._read(k)

    def _read(self, k: int) -> None:
        at, length = self._chunks[k]
        self._pipe.submit(k, read_all, self._system, self._fd, self._pipe.take(k)[:aligned(length)], at, self._path)

    def finish(self, crc: int) -> int:
        """Wait for every chunk and copy it out; returns ``crc`` extended over the bytes."""
        for k, (at, length) in enumerate(self._chunks):
            self._pipe.wait(k)
            if k + READ_AHEAD < len(self._chunks):
                self._read(k + READ_AHEAD)
            data = self._pipe.slice(k)[:length]
            crc = crc32c(data, crc)
            scatter(data, self._views, at - self._position)
        return crc


def write_all(system: SystemCalls, fd: int, view: memoryview, position: int) -> int:
    """Write all of ``view`` at ``position``, however many calls the system takes."""
    done = 0
    while done < len(view):
        done += system.pwrite(fd, view[done:], position + done)
    return done


def read_all(system: SystemCalls, fd: int, view: memoryview, position: int, path: Path) -> int:
    """Fill ``view`` from ``position``; a page that ends early is truncated."""
    done = 0
    while done < len(view):
        got = system.pread(fd, view[done:], position + done)
        if got == 0:
            raise PageCorruptError(f"page {path} is truncated at byte {position + done}")
        done += got
    return done


def chunks(offset: int, total: int) -> Iterator[tuple[int, int]]:
    """(file position, data bytes) of each chunk of a page's data; every chunk but the last is whole."""
    for start in range(0, total, CHUNK):
        yield offset + start, min(CHUNK, total - start)


def gather(views: Sequence[memoryview], start: int, into: memoryview) -> None:
    """Copy the slots' bytes ``start .. start + len(into)`` of their concatenation into ``into``."""
    for view, at, low, high in _spans(views, start, len(into)):
        into[at:at + high - low] = view[low:high]


def scatter(data: memoryview, views: Sequence[memoryview], start: int) -> None:
    """Copy ``data`` into the slots at ``start`` of their concatenation."""
    for view, at, low, high in _spans(views, start, len(data)):
        view[low:high] = data[at:at + high - low]


def _spans(views: Sequence[memoryview], start: int, length: int) -> Iterator[tuple[memoryview, int, int, int]]:
    """The slots' parts in ``start .. start + length`` of their concatenation: (slot, offset in range, low, high)."""
    base = 0
    for view in views:
        low, high = max(start, base), min(start + length, base + len(view))
        if low < high:
            yield view, low - start, low - base, high - base
        base += len(view)
