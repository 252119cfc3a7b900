"""The system calls page files are made of, behind one interface so tests can stand in for the outside world.

:class:`SystemCalls` is anything that opens, reads, writes, syncs and allocates files and maps memory
in; :data:`SYSTEM` (an :class:`OperatingSystem`) is the real one and the default everywhere.  A test
hands :func:`engine.pagefile.write`, :func:`engine.pagefile.read`, :func:`engine.pagefile.reserve` or
:class:`engine.pager.Pager` a fake of its own: a filesystem that refuses O_DIRECT, a disk whose writes
fail with ``EIO``, a slow read, a kernel without ``MADV_POPULATE_WRITE``, one that answers it without
mapping anything in (qemu-user does), a kernel of 16 KiB or 64 KiB memory pages.

Each call is one system call (a read or write may move fewer bytes than asked, as the OS's may);
looping until a chunk is whole, spotting a truncated page and falling back from O_DIRECT are the
caller's logic, so a fake exercises them exactly as the real system does.  Errors are the OS's own
``OSError``; :mod:`engine.pagefile.page` converts them into :class:`~engine.errors.PageError`.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from pathlib import Path
from typing import Callable, Protocol

O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none: every page takes the buffered path
MADV_POPULATE_WRITE = 23  # linux/mman.h (Linux 5.14+)

Madvise = Callable[[int, int, int], int]  # libc's madvise(address, length, advice): 0, or -1 on refusal
# libc's mincore(address, length, vector): 0 with bit 0 of vector[i] set where page i is resident, or -1
Mincore = Callable[[int, int, "ctypes.Array[ctypes.c_ubyte]"], int]


def _libc_function(name: str, *argtypes: type) -> Callable[..., int] | None:
    """libc's ``name``, or ``None`` where there is none (it releases the GIL, as every ctypes call)."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


_LINUX = sys.platform.startswith("linux")
LIBC_MADVISE: Madvise | None = _libc_function("madvise", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int) \
    if _LINUX else None
LIBC_MINCORE: Mincore | None = _libc_function("mincore", ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p) \
    if _LINUX else None


class SystemCalls(Protocol):
    """Anything that stores pages: the file and memory calls a page-out, a page-in and a reservation make."""

    page_size: int
    """The kernel's memory page size: 4 KiB on x86_64; 4, 16 or 64 KiB on arm64 (the Pi 5's kernel: 16 KiB)."""

    def open(self, path: Path, flags: int, direct: bool) -> int:
        """Open ``path`` with ``flags`` (mode 0o600 if it is created), with ``O_DIRECT`` where ``direct``;
        a filesystem that refuses direct I/O raises ``OSError(EINVAL)``."""

    def close(self, fd: int) -> None:
        """Close ``fd``."""

    def pread(self, fd: int, into: memoryview, position: int) -> int:
        """Read up to ``len(into)`` bytes at ``position`` into ``into``; returns how many (0 at the end)."""

    def pwrite(self, fd: int, data: memoryview, position: int) -> int:
        """Write up to ``len(data)`` bytes of ``data`` at ``position``; returns how many."""

    def fdatasync(self, fd: int) -> None:
        """Wait until the bytes written to ``fd`` are on the device."""

    def drop_cached(self, fd: int) -> None:
        """Drop ``fd``'s file from the page cache (``posix_fadvise(DONTNEED)``)."""

    def fallocate(self, fd: int, size: int) -> None:
        """Allocate the first ``size`` bytes of ``fd``'s file on disk (``posix_fallocate``)."""

    def populate(self, address: int, length: int) -> bool:
        """Map in the memory pages of ``address .. address + length`` writable in one call
        (``MADV_POPULATE_WRITE``); ``False`` where the kernel cannot, so the caller touches them itself."""


class OperatingSystem:
    """The real :class:`SystemCalls`: :mod:`os` and libc's ``madvise``.

    Parameters
    ----------
    madvise:
        libc's ``madvise`` (the default), or ``None`` where there is none.  After one refusal (a kernel
        before 5.14 has no ``MADV_POPULATE_WRITE``) it is not asked again: :meth:`populate` then says
        ``False`` at once instead of making a failing call per chunk.
    mincore:
        libc's ``mincore`` (the default): the first ``madvise`` that says yes is held against the pages it
        should have mapped in.  An answer of 0 with nothing mapped (qemu-user takes the advice as a hint and
        ignores it) counts as a refusal; so does a ``madvise`` that cannot be checked.
    page_size:
        The kernel's memory page size (the default: this kernel's).
    """

    def __init__(self, madvise: Madvise | None = LIBC_MADVISE, mincore: Mincore | None = LIBC_MINCORE,
                 page_size: int = mmap.PAGESIZE) -> None:
        self._madvise = madvise
        self._mincore = mincore
        self._checked = False  # whether a yes from madvise was seen to map pages in
        self.page_size = page_size

    def open(self, path: Path, flags: int, direct: bool) -> int:
        if direct and not O_DIRECT:
            raise OSError(errno.EINVAL, "this platform has no O_DIRECT")
        return os.open(path, flags | (O_DIRECT if direct else 0), 0o600)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, into: memoryview, position: int) -> int:
        return os.preadv(fd, [into], position)

    def pwrite(self, fd: int, data: memoryview, position: int) -> int:
        return os.pwrite(fd, data, position)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def drop_cached(self, fd: int) -> None:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def fallocate(self, fd: int, size: int) -> None:
        os.posix_fallocate(fd, 0, size)

    def populate(self, address: int, length: int) -> bool:
        madvise = self._madvise
        if madvise is None:
            return False
        if madvise(address, length, MADV_POPULATE_WRITE) == 0 and (self._checked or self._mapped_in(address, length)):
            self._checked = True
            return True
        self._madvise = None  # refused, or said yes and mapped nothing: never ask again, touch the pages instead
        return False

    def _mapped_in(self, address: int, length: int) -> bool:
        """Whether every page of ``address .. address + length`` is resident (``mincore``)."""
        if self._mincore is None or length <= 0:
            return False
        unit = mmap.PAGESIZE  # mincore's vector has a byte per page of the running kernel, whatever page_size says
        start = address - address % unit
        vector = (ctypes.c_ubyte * -(-(address + length - start) // unit))()
        if self._mincore(start, address + length - start, vector) != 0:
            return False
        return all(flag & 1 for flag in vector)


SYSTEM: SystemCalls = OperatingSystem()
"""The running machine's system calls: what every page file uses unless it is handed another."""
