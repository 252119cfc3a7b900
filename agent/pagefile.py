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

import os
import struct
import zlib
from pathlib import Path
from typing import Sequence

import torch

from agent.errors import PageCorruptError, PageError

MAGIC = b"POETPAGE"
VERSION = 1
DATA_ALIGN = 4096
_HEAD = struct.Struct("<8sIIII")
_CHUNK = 64 << 20  # bytes per read/write call: bounded, yet large enough to stream at full speed


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
    """Write ``storages`` as the page of ``node``; returns the data bytes written."""
    views = [_bytes_of(s) for s in storages]
    crc = 0
    for view in views:
        crc = zlib.crc32(view, crc)
    head = _HEAD.pack(MAGIC, VERSION, len(views), crc, node) + struct.pack(f"<{len(views)}Q", *map(len, views))
    head = head.ljust(data_offset(len(views)), b"\0")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            _write_all(fd, memoryview(head))
            for view in views:
                _write_all(fd, view)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PageError(f"cannot write page {path}: {exc.strerror or exc}; check the swap directory's "
                        "filesystem") from exc
    return sum(len(v) for v in views)


def read(path: Path, node: int, slot_bytes: Sequence[int]) -> list[torch.UntypedStorage]:
    """Read the page of ``node`` back into fresh storages, verifying sizes and checksum."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise PageCorruptError(f"page {path} for node {node} is missing; the step is aborted") from exc
    except OSError as exc:
        raise PageError(f"cannot open page {path}: {exc.strerror or exc}") from exc
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        crc = _read_head(fd, path, node, slot_bytes)
        storages, actual = [], 0
        for size in slot_bytes:
            buffer = torch.empty(size, dtype=torch.uint8)
            view = memoryview(buffer.numpy()).cast("B") if size else memoryview(b"")
            _read_all(fd, view, path)
            actual = zlib.crc32(view, actual)
            storages.append(buffer.untyped_storage())
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        raise PageError(f"cannot read page {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if actual != crc:
        raise PageCorruptError(f"page {path} for node {node} fails its checksum (crc32 {actual:#010x}, "
                               f"written {crc:#010x}): the swap medium returned different bytes; the step is aborted")
    return storages


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


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:done + _CHUNK])


def _read_all(fd: int, view: memoryview, path: Path) -> None:
    done = 0
    while done < len(view):
        got = os.readv(fd, [view[done:done + _CHUNK]])
        if got == 0:
            raise PageCorruptError(f"page {path} is truncated: {done} of {len(view)} bytes of a slot")
        done += got
