"""One page file: a node's value on flash, checksummed, kept out of the page cache.

Layout (little endian)::

    magic    8 bytes   b"POETPAGE"
    version  u32       3
    slots    u32       number of storages
    crc32c   u32       CRC-32C (Castagnoli) over all data bytes, in file order
    node     u32       graph node id (a page copied under another node's name is refused)
    sizes    u64 x slots, in slot order
    padding  to BLOCK
    data     the slots' bytes, back to back in file order (:func:`file_order`: the slots of whole
             blocks first, then the others), zero-padded to a whole BLOCK

Why it is built this way (measured with ``benchmarks/paging.py``, see docs/benchmarks.md):

* **O_DIRECT.**  The bytes go between the disk and an aligned bounce buffer
  without the page cache, so nothing has to be written back, waited for and
  dropped (``fdatasync`` + ``posix_fadvise(DONTNEED)``, which cost more than the
  transfer itself for pages of a few MB).  A direct write has reached the
  device when it returns, which is all a page needs: it is read back in the
  same boot, and a crash ends the step (stale pages are deleted).  Where the
  filesystem refuses O_DIRECT (``EINVAL``: tmpfs on older kernels, some FUSE
  filesystems) the same code runs buffered and ends each page with
  ``fdatasync`` and ``DONTNEED``, as version 1 did.
* **A pipeline over a bounce buffer of four slices.**  The calling thread
  copies a chunk of the storages into one slice and checksums it while the disk
  threads write the others (reads: the disk threads read chunks k+1 .. k+3
  while this thread checksums chunk k and copies it into the storages).  Reads
  are queued three ahead on two disk threads, so the disk has two requests at
  once and never waits for a thread to wake up and ask for the next chunk; a
  read's header, and the first chunks of its slots that go through the bounce
  buffer, are queued with its data, not read before it.  Beside a BERT
  training loop on the development VM (10 and 32 MB pages, interleaved with
  the earlier code in one process), a read into a freed value's memory went
  from 0.54-0.65 of the idle disk's raw bandwidth (one chunk queued, one disk
  thread) to 0.86-1.04, into memory read before from 0.70-0.79 (4 MiB pieces,
  one queued) to 0.89-0.95; a 2.6 MB page of 13 slots from 525 to 963 MB/s
  with its header and small slots queued.  The slices are ``_CHUNK`` bytes:
  4 x 1 MiB of RAM per paging thread, which the memory budget has to leave
  room for.
* **Reads in place.**  The slots of whole blocks (activations nearly always
  are) come first in the file and lie back to back in memory too, so a direct
  read goes straight into the fresh storages chunk by chunk, their memory
  mapped in chunk by chunk (:func:`_populate`) as the chunks are queued: no
  bounce copy, and the mapping off the critical path (a 32 MB page-in
  1.04-1.24 -> 1.37-1.46 GB/s on the development VM, whose disk reads 2.0
  GB/s into reused memory).  Only the other slots (a BatchNorm's saved
  statistics: a few hundred bytes) go through the bounce buffer.  Version 2
  kept slot order, so one such slot early in a value sent all of it through
  the bounce buffer (every page of resnet18's stem and first blocks).
* **CRC-32C in hardware** (the ``crc32c`` package: SSE4.2 / ARMv8 CRC
  instructions, ~15 GB/s here against ~3 GB/s for ``zlib.crc32``, and it
  releases the GIL).  It still catches every flipped bit and every burst of up
  to 32 bits.  Version 1 pages (zlib CRC-32) are refused as not this node's page.

Every failure becomes a :class:`~agent.errors.PageError` naming the file; a
missing, short or mismatching page is a :class:`~agent.errors.PageCorruptError`.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
from crc32c import crc32c

from agent.errors import PageCorruptError, PageError

MAGIC = b"POETPAGE"
VERSION = 3
BLOCK = 4096          # O_DIRECT alignment of offsets, lengths and memory (the largest logical block in use)
DATA_ALIGN = BLOCK
_HEAD = struct.Struct("<8sIIII")
_CHUNK = 1 << 20      # bytes per slice of the bounce buffer: the unit of copy/checksum vs I/O overlap
_SLICES = 4           # slices of the bounce buffer: up to three chunks in flight while one is copied
_READ_AHEAD = _SLICES - 1  # chunks a read keeps queued beyond the one this thread checksums
_DISK_THREADS = 2     # requests the disk has at once: under a training step, two in flight hide the wake-ups
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none: the buffered path


def data_offset(slots: int) -> int:
    """Where the data starts in a page with ``slots`` storages."""
    return _aligned(_HEAD.size + 8 * slots)


def file_order(slot_bytes: Sequence[int]) -> list[int]:
    """The slots in the order a page holds their bytes: those of whole blocks first, then the rest."""
    return sorted(range(len(slot_bytes)), key=lambda i: slot_bytes[i] % BLOCK != 0)


def page_size(slot_bytes: Sequence[int]) -> int:
    """Bytes a page with these slot sizes takes on disk (the data is padded to a whole block)."""
    return data_offset(len(slot_bytes)) + _aligned(sum(slot_bytes))


def reserve(path: Path, size: int) -> None:
    """Create ``path`` with ``size`` bytes allocated on disk (``posix_fallocate``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def write(path: Path, node: int, storages: Sequence[torch.UntypedStorage]) -> int:
    """Write ``storages`` as the page of ``node``; returns the data bytes written."""
    views = [_bytes_of(s) for s in storages]
    try:
        try:
            _write_data(path, node, views, direct=True)
        except _DirectRefused:
            _write_data(path, node, views, direct=False)
    except OSError as exc:
        raise PageError(f"cannot write page {path}: {exc.strerror or exc}; check the swap directory's "
                        "filesystem") from exc
    return sum(map(len, views))


def read(path: Path, node: int, slot_bytes: Sequence[int],
         memory: PageMemory | DonatedMemory | None = None) -> list[torch.UntypedStorage]:
    """Read the page of ``node`` back into storages, verifying header, sizes and checksum.

    The storages lie in ``memory`` where it is given, unused and of exactly the page's layout (a kept
    :class:`PageMemory` or a freed value's :class:`DonatedMemory`: already mapped in, so no page faults),
    otherwise in fresh memory.
    """
    if memory is None or not memory.fits(slot_bytes):
        memory = PageMemory(slot_bytes)
    buffers, whole, rest = memory.views(slot_bytes)
    try:
        try:
            crc, actual = _read_data(path, node, slot_bytes, whole, rest, direct=True, mapped=memory.mapped)
        except _DirectRefused:
            crc, actual = _read_data(path, node, slot_bytes, whole, rest, direct=False, mapped=memory.mapped)
    except FileNotFoundError as exc:
        raise PageCorruptError(f"page {path} for node {node} is missing; the step is aborted") from exc
    except OSError as exc:
        raise PageError(f"cannot read page {path}: {exc.strerror or exc}") from exc
    if actual != crc:
        raise PageCorruptError(f"page {path} for node {node} fails its checksum (crc32c {actual:#010x}, "
                               f"written {crc:#010x}): the swap medium returned different bytes; the step is aborted")
    memory.mapped = True
    return [b.untyped_storage() for b in buffers]


class PageMemory:
    """Anonymous memory a page-in reads into: one mapping, each slot at a page-aligned offset and its own
    storage.  The storages keep the mapping alive; with the last one (and this object) gone it is unmapped.

    A page-in fills memory nobody has touched, and mapping it in is most of its CPU (the copy faulting it in
    as it first wrote ran at 0.6 GB/s on the development VM, below the disk).  Kept past its value's life,
    the same memory takes a later page of the same layout with no page fault (:mod:`schedules.timeline`
    plans where the budget has room for that).  Mapping and unmapping take the process's memory map for
    writing, which every tensor allocation on mmap (:func:`agent.rss.return_freed_memory`) on the computing
    thread needs too, so a value gets one mapping, not one per slot.  (Huge pages, ``MADV_HUGEPAGE``, map in
    at 10 GB/s on their own, but made BERT's step at 50% 30% slower on the development VM.)
    """

    def __init__(self, slot_bytes: Sequence[int]) -> None:
        self.nbytes = self.layout_bytes(slot_bytes)
        self.mapped = False  # every page of the slots mapped in (by a read that filled them)
        self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if self.nbytes else None

    @staticmethod
    def layout_bytes(slot_bytes: Sequence[int]) -> int:
        """Bytes of memory a page with these slots takes (each slot rounded up to whole blocks)."""
        return sum(_aligned(size) for size in slot_bytes)

    def buffers(self, slot_bytes: Sequence[int]) -> list[torch.Tensor]:
        """Byte tensors of the slots, in slot order; they lie back to back in file order at block-aligned
        offsets, so the slots of whole blocks are one range, as in the file."""
        out: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * len(slot_bytes)
        at = 0
        for slot in file_order(slot_bytes):
            if slot_bytes[slot]:
                out[slot] = torch.frombuffer(self._map, dtype=torch.uint8, count=slot_bytes[slot], offset=at)
            at += _aligned(slot_bytes[slot])
        return out

    def head(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` of the memory, where :meth:`buffers` puts the slots of whole blocks."""
        return memoryview(self._map)[:nbytes] if self._map is not None else memoryview(b"")

    def views(self, slot_bytes: Sequence[int]) -> tuple[list[torch.Tensor], memoryview, list[memoryview]]:
        """What a read fills: the slots' byte tensors (slot order), the whole-block slots as one range (read
        in place) and the other slots in file order (read through the bounce buffer)."""
        buffers = self.buffers(slot_bytes)
        order = file_order(slot_bytes)
        whole = self.head(sum(slot_bytes[slot] for slot in order if slot_bytes[slot] % BLOCK == 0))
        return buffers, whole, [_byte_view(buffers[slot]) for slot in order if slot_bytes[slot] % BLOCK]

    def fits(self, slot_bytes: Sequence[int]) -> bool:
        """Whether a page of these slots can be read here: the same layout size, and nothing of it in use."""
        return self.nbytes == self.layout_bytes(slot_bytes) and not self.in_use()

    def in_use(self) -> bool:
        """Whether a storage of an earlier page still lies here (it holds the mapping through the buffer
        protocol: one reference each)."""
        return self._map is not None and sys.getrefcount(self._map) > 2  # this object's, and the call's argument


class DonatedMemory:
    """The storages of a value just freed, taken over by a later page-in of the same layout
    (:func:`schedules.timeline.plan_io` plans which, where the budget holds them in between).

    Like kept :class:`PageMemory` it is mapped in already, and the free that gave it unmapped nothing.
    The storages lie wherever the allocator put them, not at block-aligned offsets of one range, so every
    slot is read through the bounce buffer: one copy into mapped memory, cheaper than mapping fresh
    memory in on the development VM.  A storage anything else still refers to (a view, a parameter's
    gradient that is the same tensor) is never read into: the read then takes fresh memory.
    """

    mapped = True

    def __init__(self, storages: Sequence[torch.UntypedStorage]) -> None:
        self.storages = list(storages)

    def fits(self, slot_bytes: Sequence[int]) -> bool:
        """Whether a page of these slots can be read here: storages of the same sizes, none in use."""
        return sorted(s.nbytes() for s in self.storages) == sorted(slot_bytes) and not self.in_use()

    def in_use(self) -> bool:
        """Whether anything but this object refers to one of the storages (always, where torch cannot say)."""
        return _USE_COUNT is None or any(_USE_COUNT(s._cdata) > 1 for s in self.storages)

    def views(self, slot_bytes: Sequence[int]) -> tuple[list[torch.Tensor], memoryview, list[memoryview]]:
        """As :meth:`PageMemory.views`, with every slot in the bounce-buffer part (nothing read in place)."""
        by_size: dict[int, list[torch.UntypedStorage]] = {}
        for storage in self.storages:
            by_size.setdefault(storage.nbytes(), []).append(storage)
        buffers = [torch.empty(0, dtype=torch.uint8).set_(by_size[size].pop()) for size in slot_bytes]
        return buffers, memoryview(b""), [_byte_view(buffers[slot]) for slot in file_order(slot_bytes)]


# ``torch._C._storage_Use_Count``: the references to a storage (torch's own CUDA-graph trees use it likewise)
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _byte_view(buffer: torch.Tensor) -> memoryview:
    return memoryview(buffer.numpy()).cast("B")


# -- the two directions ------------------------------------------------------------------------------
class _DirectRefused(Exception):
    """The filesystem refused O_DIRECT; the caller retries buffered."""


def _write_data(path: Path, node: int, views: Sequence[memoryview], direct: bool) -> None:
    """Stream the slots, in file order, through the bounce buffer to ``path``, then write the header."""
    transfer = _transfer()
    offset = data_offset(len(views))
    stream = [views[slot] for slot in file_order([len(v) for v in views])]
    fd = _open(path, os.O_WRONLY | os.O_CREAT, direct)
    crc = 0
    try:
        with _Pipeline(transfer, direct) as pipe:
            for k, (position, length) in enumerate(_chunks(offset, sum(map(len, views)))):
                buffer = pipe.take(k)
                _gather(stream, position - offset, buffer[:length])
                crc = crc32c(buffer[:length], crc)
                buffer[length:_aligned(length)] = bytes(_aligned(length) - length)  # the last block's padding
                pipe.submit(k, _pwrite_all, fd, buffer[:_aligned(length)], position)
        head = _HEAD.pack(MAGIC, VERSION, len(views), crc, node) + struct.pack(f"<{len(views)}Q", *map(len, views))
        _write_head(fd, transfer, head, offset, direct)
        if not direct:  # buffered fallback: on flash, then out of the page cache
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read_data(path: Path, node: int, slot_bytes: Sequence[int], whole: memoryview, rest: Sequence[memoryview],
               direct: bool, mapped: bool) -> tuple[int, int]:
    """Read the header, the slots of whole blocks straight into ``whole`` (their memory, back to back) and the
    ``rest`` (the other slots, in file order) through the bounce buffer; returns (written CRC, CRC of what was
    read).  The header and the first chunks of the rest are queued with the data, not read before it: a page
    of a few MB is a handful of requests, and a round trip each for the header and the rest weighs on it."""
    transfer = _transfer()
    offset = data_offset(len(slot_bytes))
    head = transfer.header(offset)
    fd = _open(path, os.O_RDONLY, direct)
    try:
        with _Pipeline(transfer, direct) as pipe:
            head_read = transfer.disk.submit(_io, direct, os.preadv, fd, [head], 0)
            try:
                rest_read = _BouncedRead(pipe, fd, path, rest, offset + len(whole), mapped)
                actual = _read_in_place(fd, transfer, path, whole, offset, direct, mapped)
                actual = rest_read.finish(actual)
            except PageCorruptError:
                _check_head(head_read.result(), head, path, node, slot_bytes)  # not this page at all, if so
                raise
            finally:
                head_read.exception()  # no read may outlive the file descriptor
        crc = _check_head(head_read.result(), head, path, node, slot_bytes)
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return crc, actual


def _read_in_place(fd: int, transfer: _Transfer, path: Path, into: memoryview, position: int, direct: bool,
                   mapped: bool) -> int:
    """Read ``len(into)`` bytes (whole blocks) from ``position`` straight into ``into`` (block-aligned memory),
    in chunks queued ``_READ_AHEAD`` ahead on the disk threads: while they read, this thread maps in the memory
    of the chunks it queues next (unless it is ``mapped`` already) and checksums those read.  Returns the CRC
    of what was read.

    Against the bounce buffer this saves a copy of every byte, and mapping the fresh memory beside the reads
    instead of before them takes it off the page-in's critical path."""
    pieces = [(into[start:start + _CHUNK], position + start) for start in range(0, len(into), _CHUNK)]
    pending: dict[int, Future] = {}
    populate = (lambda view: None) if mapped else _populate

    def read(k: int) -> None:
        piece, at = pieces[k]
        populate(piece)
        pending[k] = transfer.disk.submit(_io, direct, _pread_all, fd, piece, at, path)

    crc = 0
    try:
        for k in range(min(_READ_AHEAD, len(pieces))):
            read(k)
        for k, (piece, _) in enumerate(pieces):
            pending.pop(k).result()
            if k + _READ_AHEAD < len(pieces):
                read(k + _READ_AHEAD)  # its memory mapped in beside the reads queued before it
            crc = crc32c(piece, crc)  # beside the reads queued after it
    finally:
        for future in pending.values():  # after an error: no read may outlive the file descriptor
            future.exception()
    return crc


class _BouncedRead:
    """Read the bytes of ``views``, back to back from ``position``, through the bounce buffer: made, it queues
    the first ``_READ_AHEAD`` chunks; :meth:`finish` copies each out as it arrives (checksumming it) while the
    disk threads read the chunks after it."""

    def __init__(self, pipe: _Pipeline, fd: int, path: Path, views: Sequence[memoryview], position: int,
                 mapped: bool) -> None:
        self._pipe, self._fd, self._path, self._views, self._position = pipe, fd, path, views, position
        self._chunks = list(_chunks(position, sum(map(len, views))))
        if not mapped:
            for view in views:  # in one go: a copy faulting fresh memory in as it writes is slower than the disk
                _populate(view)
        for k in range(min(_READ_AHEAD, len(self._chunks))):
            self._read(k)

    def _read(self, k: int) -> None:
        at, length = self._chunks[k]
        self._pipe.submit(k, _pread_all, self._fd, self._pipe.take(k)[:_aligned(length)], at, self._path)

    def finish(self, crc: int) -> int:
        """Wait for every chunk and copy it out; returns ``crc`` extended over the bytes."""
        for k, (at, length) in enumerate(self._chunks):
            self._pipe.wait(k)
            if k + _READ_AHEAD < len(self._chunks):
                self._read(k + _READ_AHEAD)
            data = self._pipe.slice(k)[:length]
            crc = crc32c(data, crc)
            _scatter(data, self._views, at - self._position)
        return crc


def _write_head(fd: int, transfer: _Transfer, head: bytes, offset: int, direct: bool) -> None:
    block = transfer.header(offset)
    block[:len(head)] = head
    block[len(head):] = bytes(offset - len(head))
    _io(direct, _pwrite_all, fd, block, 0)


def _check_head(got: int, block: memoryview, path: Path, node: int, slot_bytes: Sequence[int]) -> int:
    """The written CRC in a page's header (``got`` bytes of it read into ``block``), once it says the page is
    ``node``'s, of these slot sizes and this format."""
    offset = data_offset(len(slot_bytes))
    if got < _HEAD.size:
        raise PageCorruptError(f"page {path} for node {node} is truncated (header of {got} bytes)")
    magic, version, slots, crc, owner = _HEAD.unpack_from(block)
    sizes = list(struct.unpack_from(f"<{slots}Q", block, _HEAD.size)) if got >= offset and slots == len(slot_bytes) \
        else None
    if magic != MAGIC or version != VERSION or owner != node or sizes != list(slot_bytes):
        raise PageCorruptError(f"page {path} is not node {node}'s page (header says node {owner}, "
                               f"{slots} slots, format version {version}, this build reads {VERSION}); "
                               "the step is aborted")
    return crc


# -- the bounce buffer and its disk threads ------------------------------------------------------------
class _Transfer:
    """One paging thread's aligned bounce buffer (``_SLICES`` slices) and the ``_DISK_THREADS`` threads that do its
    disk I/O."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, _SLICES * _CHUNK)  # anonymous mmap: page aligned, as O_DIRECT needs
        view = memoryview(self._memory)
        self.slices = tuple(view[i * _CHUNK:(i + 1) * _CHUNK] for i in range(_SLICES))
        self.disk = ThreadPoolExecutor(max_workers=_DISK_THREADS, thread_name_prefix="poet-page-disk")
        self._head = memoryview(mmap.mmap(-1, BLOCK))

    def header(self, size: int) -> memoryview:
        """An aligned buffer of exactly ``size`` bytes (whole blocks) for a header, apart from the slices (a
        read's header is read beside its data)."""
        if len(self._head) < size:
            self._head = memoryview(mmap.mmap(-1, size))
        return self._head[:size]


_local = threading.local()


def _transfer() -> _Transfer:
    """The calling thread's :class:`_Transfer`, made on first use (one bounce buffer per paging thread)."""
    transfer = getattr(_local, "transfer", None)
    if transfer is None:
        transfer = _local.transfer = _Transfer()
    return transfer


class _Pipeline:
    """Chunk k's disk I/O runs on a disk thread while this thread works on another chunk in another slice.

    Chunk k uses slice ``k % _SLICES``.  Leaving the ``with`` block waits for every submitted I/O, also on an
    error, so no I/O outlives the file descriptor; an O_DIRECT refusal (``EINVAL``) becomes
    :class:`_DirectRefused`.
    """

    def __init__(self, transfer: _Transfer, direct: bool) -> None:
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
        self._pending[k % len(self.slices)] = self._disk.submit(_io, self._direct, job, *args)

    def wait(self, k: int):
        """Wait for the I/O last submitted in chunk ``k``'s slice; returns its result (``None`` if none)."""
        at = k % len(self.slices)
        future, self._pending[at] = self._pending[at], None
        return future.result() if future is not None else None

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(self, kind, error, trace) -> None:
        for k in range(len(self.slices)):
            try:
                self.wait(k)
            except Exception:
                if kind is None:
                    raise  # otherwise the first error is the one to report


def _io(direct: bool, job: Callable, *args):
    """Run one I/O call; under O_DIRECT an ``EINVAL`` means the filesystem refuses direct I/O."""
    try:
        return job(*args)
    except OSError as exc:
        if direct and exc.errno == errno.EINVAL:
            raise _DirectRefused() from exc
        raise


def _open(path: Path, flags: int, direct: bool) -> int:
    if direct and not _O_DIRECT:
        raise _DirectRefused()
    return _io(direct, os.open, path, flags | (_O_DIRECT if direct else 0), 0o600)


# -- bytes -------------------------------------------------------------------------------------------
def _populate(view: memoryview) -> None:
    """Map in the pages under ``view`` (fresh memory of a :class:`PageMemory`), writable, before a read fills them.

    ``MADV_POPULATE_WRITE`` (Linux 5.14+) maps a range in with one call.  It holds the process's memory map
    for reading meanwhile, and every tensor the computing thread allocates or frees on mmap waits for it: 57
    MB in one call delayed a BERT step by 10 ms on the development VM.  Called chunk by chunk (1 MiB) beside
    the reads, it holds the map briefly, and against a zero written into each page (a page fault each) it
    read a 10 MB page into fresh memory beside a BERT training loop at 816 against 687 MB/s while the loop
    ran 4.65 against 4.16 steps/s.  Where the kernel refuses it, pages are touched one by one (the write is
    a torch op, so the GIL is free meanwhile).
    """
    global _MADVISE
    if not len(view) or view.readonly:
        return
    pages = torch.frombuffer(view, dtype=torch.uint8)
    if _MADVISE is not None:
        start = pages.data_ptr() - pages.data_ptr() % mmap.PAGESIZE  # within the mapping: it starts on a page
        if _MADVISE(start, pages.data_ptr() + len(view) - start, _MADV_POPULATE_WRITE) == 0:
            return
        _MADVISE = None  # refused (a kernel before 5.14): touch pages from now on
    pages[::mmap.PAGESIZE].fill_(0)


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, or ``None`` where there is none (it releases the GIL, as every ctypes call)."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADV_POPULATE_WRITE = 23  # linux/mman.h
_MADVISE = _madvise() if sys.platform.startswith("linux") else None


def _aligned(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _chunks(offset: int, total: int) -> Iterator[tuple[int, int]]:
    """(file position, data bytes) of each chunk of a page's data; every chunk but the last is whole."""
    for start in range(0, total, _CHUNK):
        yield offset + start, min(_CHUNK, total - start)


def _gather(views: Sequence[memoryview], start: int, into: memoryview) -> None:
    """Copy the slots' bytes ``start .. start + len(into)`` of their concatenation into ``into``."""
    for view, at, low, high in _spans(views, start, len(into)):
        into[at:at + high - low] = view[low:high]


def _scatter(data: memoryview, views: Sequence[memoryview], start: int) -> None:
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


def _bytes_of(storage: torch.UntypedStorage) -> memoryview:
    """The storage's bytes, without a copy."""
    if storage.device.type != "cpu":
        raise PageError(f"paging {storage.device} memory is not supported; page CPU values only")
    if storage.nbytes() == 0:
        return memoryview(b"")
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return memoryview(flat.numpy()).cast("B")


def _pwrite_all(fd: int, view: memoryview, position: int) -> int:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], position + done)
    return done


def _pread_all(fd: int, view: memoryview, position: int, path: Path) -> int:
    """Fill ``view`` from ``position``; a page that ends early is truncated."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], position + done)
        if got == 0:
            raise PageCorruptError(f"page {path} is truncated at byte {position + done}")
        done += got
    return done
