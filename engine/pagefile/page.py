"""Reserve, write and read one page file: O_DIRECT first, buffered where the filesystem refuses it.

A small page (header and data within :data:`SMALL_PAGE` bytes: an optimizer-state chunk, a BatchNorm's
saved statistics) is one read or one write of the calling thread through its bounce buffer, header and data
together: for it the disk's latency is the cost, and handing chunks to the disk threads would add more.
Larger pages go through :mod:`engine.pagefile.pipeline`.

With O_DIRECT the bytes go between the disk and an aligned bounce buffer without the page cache, so
nothing has to be written back, waited for and dropped (``fdatasync`` and ``posix_fadvise(DONTNEED)``
cost more than the transfer itself for pages of a few MB).  A direct write has reached the device
when it returns, which is all a page needs: it is read back in the same boot, and a crash ends the
step (stale pages are deleted).  Where the filesystem refuses O_DIRECT (``EINVAL``: tmpfs on older
kernels, some FUSE filesystems) the same code runs buffered and ends each page with ``fdatasync``
and ``DONTNEED``, so the page cache still does not hold the paged bytes.

Every failure becomes a :class:`~engine.errors.PageError` naming the file; a missing, short or
mismatching page is a :class:`~engine.errors.PageCorruptError`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch
from crc32c import crc32c

from engine.errors import PageCorruptError, PageError
from engine.pagefile import layout
from engine.pagefile.layout import aligned, check_header, data_offset, file_order
from engine.pagefile.memory import DonatedMemory, PageMemory, in_place_prefix, storage_bytes
from engine.pagefile.pipeline import (CHUNK, BouncedRead, DirectRefused, Pipeline, Transfer, chunks, gather,
                                     open_page, read_in_place, run_io, scatter, transfer, write_all,
                                     write_in_place)
from engine.pagefile.system import SYSTEM, SystemCalls


SMALL_PAGE = CHUNK
"""Pages of at most this many bytes on disk (header included) move in one I/O."""


def reserve(path: Path, size: int, *, system: SystemCalls = SYSTEM) -> None:
    """Create ``path`` with ``size`` bytes allocated on disk (``posix_fallocate``); raises the ``OSError``."""
    fd = system.open(path, os.O_WRONLY | os.O_CREAT, False)
    try:
        if size:
            system.fallocate(fd, size)
    finally:
        system.close(fd)


def write(path: Path, node: int, storages: Sequence[torch.UntypedStorage], *, system: SystemCalls = SYSTEM) -> int:
    """Write ``storages`` as the page of ``node``; returns the data bytes written.

    Raises
    ------
    PageError
        A storage is not in CPU memory, or the file cannot be written.
    """
    views = [storage_bytes(s) for s in storages]
    write_data = _write_small if layout.page_size([len(v) for v in views]) <= SMALL_PAGE else _write_data
    try:
        try:
            write_data(system, path, node, views, direct=True)
        except DirectRefused:
            write_data(system, path, node, views, direct=False)
    except OSError as exc:
        raise PageError(f"cannot write page {path}: {exc.strerror or exc}; check the swap directory's "
                        "filesystem") from exc
    return sum(map(len, views))


def read(path: Path, node: int, slot_bytes: Sequence[int], memory: PageMemory | DonatedMemory | None = None, *,
         system: SystemCalls = SYSTEM) -> list[torch.UntypedStorage]:
    """Read the page of ``node`` back into storages, verifying header, sizes and checksum.

    The storages lie in ``memory`` where it is given, unused and of exactly the page's layout (a kept
    :class:`PageMemory` or a freed value's :class:`DonatedMemory`: already mapped in, so no page faults),
    otherwise in fresh memory.

    Raises
    ------
    PageCorruptError
        The page is missing, truncated, another node's or another format's, or fails its checksum.
    PageError
        The file cannot be read.
    """
    if memory is None or not memory.fits(slot_bytes):
        memory = PageMemory(slot_bytes)
    buffers, in_place, rest = memory.views(slot_bytes)
    read_data = _read_small if layout.page_size(slot_bytes) <= SMALL_PAGE else _read_data
    try:
        try:
            crc, actual = read_data(system, path, node, slot_bytes, in_place, rest, direct=True,
                                    mapped=memory.mapped)
        except DirectRefused:
            crc, actual = read_data(system, path, node, slot_bytes, in_place, rest, direct=False,
                                    mapped=memory.mapped)
    except FileNotFoundError as exc:
        raise PageCorruptError(f"page {path} for node {node} is missing; the step is aborted") from exc
    except OSError as exc:
        raise PageError(f"cannot read page {path}: {exc.strerror or exc}") from exc
    if actual != crc:
        raise PageCorruptError(f"page {path} for node {node} fails its checksum (crc32c {actual:#010x}, "
                               f"written {crc:#010x}): the swap medium returned different bytes; the step is aborted")
    memory.mapped = True
    return [b.untyped_storage() for b in buffers]


def _write_data(system: SystemCalls, path: Path, node: int, views: Sequence[memoryview], direct: bool) -> None:
    """Write the slots in file order to ``path``: the leading ones of whole, aligned blocks straight from their
    memory, the rest streamed through the bounce buffer; then the header."""
    bounce = transfer()
    offset = data_offset(len(views))
    stream = [views[slot] for slot in file_order([len(v) for v in views])]
    lead = in_place_prefix(stream)
    start = offset + sum(map(len, stream[:lead]))  # where the bytes of the rest begin
    rest = stream[lead:]
    fd = open_page(system, path, os.O_WRONLY | os.O_CREAT, direct)
    try:
        crc = write_in_place(system, fd, bounce, stream[:lead], offset, direct)
        with Pipeline(bounce, direct) as pipe:
            for k, (position, length) in enumerate(chunks(start, sum(map(len, rest)))):
                buffer = pipe.take(k)
                gather(rest, position - start, buffer[:length])
                crc = crc32c(buffer[:length], crc)
                buffer[length:aligned(length)] = bytes(aligned(length) - length)  # the last block's padding
                pipe.submit(k, write_all, system, fd, buffer[:aligned(length)], position)
        _write_head(system, fd, bounce, layout.header(node, crc, [len(v) for v in views]), offset, direct)
        if not direct:  # buffered fallback: on flash, then out of the page cache
            system.fdatasync(fd)
            system.drop_cached(fd)
    finally:
        system.close(fd)


def _read_data(system: SystemCalls, path: Path, node: int, slot_bytes: Sequence[int], in_place: Sequence[memoryview],
               rest: Sequence[memoryview], direct: bool, mapped: bool) -> tuple[int, int]:
    """Read the header, the leading slots straight into their memory (``in_place``: whole, aligned blocks) and
    the ``rest`` (the other slots, in file order) through the bounce buffer; returns (written CRC, CRC of what was
    read).  The header and the first chunks of the rest are queued with the data, not read before it: a page
    of a few MB is a handful of requests, and a round trip each for the header and the rest weighs on it."""
    bounce = transfer()
    offset = data_offset(len(slot_bytes))
    head = bounce.header(offset)
    fd = open_page(system, path, os.O_RDONLY, direct)
    try:
        with Pipeline(bounce, direct) as pipe:
            head_read = bounce.disk.submit(run_io, direct, system.pread, fd, head, 0)
            try:
                rest_read = BouncedRead(system, pipe, fd, path, rest, offset + sum(map(len, in_place)), mapped)
                actual = read_in_place(system, fd, bounce, path, in_place, offset, direct, mapped)
                actual = rest_read.finish(actual)
            except PageCorruptError:
                check_header(head_read.result(), head, path, node, slot_bytes)  # not this page at all, if so
                raise
            finally:
                head_read.exception()  # no read may outlive the file descriptor
        crc = check_header(head_read.result(), head, path, node, slot_bytes)
        if not direct:
            system.drop_cached(fd)
    finally:
        system.close(fd)
    return crc, actual


def _write_small(system: SystemCalls, path: Path, node: int, views: Sequence[memoryview], direct: bool) -> None:
    """Header and slots (in file order) laid out in the bounce buffer as on disk, then one write."""
    sizes = [len(v) for v in views]
    offset, total = data_offset(len(views)), sum(sizes)
    page = transfer().whole[:offset + aligned(total)]
    data = page[offset:offset + total]
    gather([views[slot] for slot in file_order(sizes)], 0, data)
    head = layout.header(node, crc32c(data), sizes)
    page[:len(head)] = head
    page[len(head):offset] = bytes(offset - len(head))
    page[offset + total:] = bytes(len(page) - offset - total)  # the last block's padding
    fd = open_page(system, path, os.O_WRONLY | os.O_CREAT, direct)
    try:
        run_io(direct, write_all, system, fd, page, 0)
        if not direct:
            system.fdatasync(fd)
            system.drop_cached(fd)
    finally:
        system.close(fd)


def _read_small(system: SystemCalls, path: Path, node: int, slot_bytes: Sequence[int], in_place: Sequence[memoryview],
                rest: Sequence[memoryview], direct: bool, mapped: bool) -> tuple[int, int]:
    """One read of header and data into the bounce buffer, then the slots copied out; (written CRC, CRC read)."""
    offset, total = data_offset(len(slot_bytes)), sum(slot_bytes)
    page = transfer().whole[:offset + aligned(total)]
    fd = open_page(system, path, os.O_RDONLY, direct)
    try:
        got = run_io(direct, _read_upto, system, fd, page)
        if not direct:
            system.drop_cached(fd)
    finally:
        system.close(fd)
    crc = check_header(min(got, offset), page, path, node, slot_bytes)
    if got < offset + total:
        raise PageCorruptError(f"page {path} for node {node} is truncated at byte {got}; the step is aborted")
    data = page[offset:offset + total]
    scatter(data, [*in_place, *rest], 0)  # the slots in file order, as the page holds them
    return crc, crc32c(data)


def _read_upto(system: SystemCalls, fd: int, view: memoryview) -> int:
    """Fill ``view`` from the file's start; returns the bytes read (fewer where the file ends first)."""
    done = 0
    while done < len(view):
        got = system.pread(fd, view[done:], done)
        if got == 0:
            break
        done += got
    return done


def _write_head(system: SystemCalls, fd: int, bounce: Transfer, head: bytes, offset: int, direct: bool) -> None:
    """Write the header, padded to the data's offset, from an aligned buffer (as O_DIRECT needs)."""
    block = bounce.header(offset)
    block[:len(head)] = head
    block[len(head):] = bytes(offset - len(head))
    run_io(direct, write_all, system, fd, block, 0)
