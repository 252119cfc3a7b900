"""One page file: a node's value on flash, checksummed, kept out of the page cache.

Layout (little endian)::

    magic    8 bytes   b"POETPAGE"
    version  u32       1
    slots    u32       number of storages
    crc32    u32       zlib CRC-32 over all data bytes, slot after slot
    node     u32       graph node id (a page copied under another node's name is refused)
    sizes    u64 x slots
    padding  to DATA_ALIGN
    data     the slots' bytes, back to back

Writes end with ``fdatasync`` and ``posix_fadvise(DONTNEED)`` so the paged
bytes do not stay in RAM as page cache (the point of paging them out); reads
drop their pages the same way.  Every failure becomes a
:class:`~agent.errors.PageError` naming the file; a missing, short or
mismatching page is a :class:`~agent.errors.PageCorruptError`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import torch

from agent.errors import PageCorruptError, PageError

MAGIC = b"POETPAGE"
VERSION = 1
DATA_ALIGN = 4096
_HEAD = struct.Struct("<8sIIII")
_CHUNK = 8 << 20   # bytes per read/write call: the unit of checksum/I-O overlap
_AHEAD = 4 * _CHUNK  # how far reads ask the kernel to read ahead
_BEHIND = 2          # chunks of a write left in flight before waiting for them


def data_offset(slots: int) -> int:
    """Where the data starts in a page with ``slots`` storages."""
    raw = _HEAD.size + 8 * slots
    return -(-raw // DATA_ALIGN) * DATA_ALIGN


def page_size(slot_bytes: Sequence[int]) -> int:
    """Bytes a page with these slot sizes takes on disk."""
    return data_offset(len(slot_bytes)) + sum(slot_bytes)


def reserve(path: Path, size: int) -> None:
    """Create ``path`` with ``size`` bytes allocated on disk (``posix_fallocate``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        if size:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def write(path: Path, node: int, storages: Sequence[torch.UntypedStorage]) -> int:
    """Write ``storages`` as the page of ``node``; returns the data bytes written.

    Chunk by chunk: checksum a chunk, hand it to the kernel and start its
    writeback at once (``sync_file_range``), so the disk works while the next
    chunk is checksummed; chunks two behind are waited for and dropped from the
    page cache, which never holds more than a few chunks of the page.
    """
    views = [_bytes_of(s) for s in storages]
    offset = data_offset(len(views))
    crc, position = 0, offset
    window: list[tuple[int, int]] = []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for piece in _pieces(views):
                crc = zlib.crc32(piece, crc)
                _pwrite_all(fd, piece, position)
                _writeback(fd, position, len(piece), wait=False)
                window.append((position, len(piece)))
                position += len(piece)
                if len(window) > _BEHIND:
                    done = window.pop(0)
                    _writeback(fd, *done, wait=True)
                    os.posix_fadvise(fd, done[0], done[1], os.POSIX_FADV_DONTNEED)
            head = _HEAD.pack(MAGIC, VERSION, len(views), crc, node) + struct.pack(f"<{len(views)}Q", *map(len, views))
            _pwrite_all(fd, memoryview(head.ljust(offset, b"\0")), 0)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PageError(f"cannot write page {path}: {exc.strerror or exc}; check the swap directory's "
                        "filesystem") from exc
    return position - offset


def read(path: Path, node: int, slot_bytes: Sequence[int]) -> list[torch.UntypedStorage]:
    """Read the page of ``node`` back into fresh storages, verifying sizes and checksum.

    The kernel is asked to read a few chunks ahead (``WILLNEED``) while the
    current chunk is copied and checksummed, and chunks already read are
    dropped from the page cache.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise PageCorruptError(f"page {path} for node {node} is missing; the step is aborted") from exc
    except OSError as exc:
        raise PageError(f"cannot open page {path}: {exc.strerror or exc}") from exc
    try:
        crc = _read_head(fd, path, node, slot_bytes)
        buffers = [torch.empty(size, dtype=torch.uint8) for size in slot_bytes]
        views = [memoryview(b.numpy()).cast("B") if b.numel() else memoryview(b"") for b in buffers]
        position = advised = data_offset(len(slot_bytes))
        end = position + sum(slot_bytes)
        actual = 0
        for piece in _pieces(views):
            if advised < min(position + _AHEAD, end):
                os.posix_fadvise(fd, advised, position + _AHEAD - advised, os.POSIX_FADV_WILLNEED)
                advised = position + _AHEAD
            _pread_all(fd, piece, position, path)
            actual = zlib.crc32(piece, actual)
            os.posix_fadvise(fd, position, len(piece), os.POSIX_FADV_DONTNEED)
            position += len(piece)
    except OSError as exc:
        raise PageError(f"cannot read page {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if actual != crc:
        raise PageCorruptError(f"page {path} for node {node} fails its checksum (crc32 {actual:#010x}, "
                               f"written {crc:#010x}): the swap medium returned different bytes; the step is aborted")
    return [b.untyped_storage() for b in buffers]


def _read_head(fd: int, path: Path, node: int, slot_bytes: Sequence[int]) -> int:
    offset = data_offset(len(slot_bytes))
    head = os.read(fd, offset)
    if len(head) < _HEAD.size:
        raise PageCorruptError(f"page {path} for node {node} is truncated (header of {len(head)} bytes)")
    magic, version, slots, crc, owner = _HEAD.unpack_from(head)
    sizes = list(struct.unpack_from(f"<{slots}Q", head, _HEAD.size)) if len(head) >= offset else None
    if magic != MAGIC or version != VERSION or owner != node or sizes != list(slot_bytes):
        raise PageCorruptError(f"page {path} is not node {node}'s page (header says node {owner}, "
                               f"{slots} slots); the step is aborted")
    return crc


def _bytes_of(storage: torch.UntypedStorage) -> memoryview:
    """The storage's bytes, without a copy."""
    if storage.device.type != "cpu":
        raise PageError(f"paging {storage.device} memory is not supported; page CPU values only")
    if storage.nbytes() == 0:
        return memoryview(b"")
    flat = torch.empty(0, dtype=torch.uint8).set_(storage)
    return memoryview(flat.numpy()).cast("B")


def _pieces(views: Sequence[memoryview]) -> Iterator[memoryview]:
    """The slots' bytes as consecutive pieces of at most ``_CHUNK`` bytes."""
    for view in views:
        for start in range(0, len(view), _CHUNK):
            yield view[start:start + _CHUNK]


def _pwrite_all(fd: int, view: memoryview, position: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], position + done)


def _pread_all(fd: int, view: memoryview, position: int, path: Path) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], position + done)
        if got == 0:
            raise PageCorruptError(f"page {path} is truncated at byte {position + done}")
        done += got


def _writeback(fd: int, position: int, length: int, wait: bool) -> None:
    """Start (or start and wait for) writeback of a range: Linux ``sync_file_range``; a no-op elsewhere."""
    if _SYNC_FILE_RANGE is None:
        return
    flags = (_SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER) if wait else _SFR_WRITE
    if _SYNC_FILE_RANGE(fd, ctypes.c_int64(position), ctypes.c_int64(length), flags) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _sync_file_range():
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4
_SYNC_FILE_RANGE = _sync_file_range()
