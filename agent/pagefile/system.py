"""The system calls page files are made of, behind one interface so tests can stand in for the outside world.

:class:`SystemCalls` is anything that opens, reads, writes, syncs and allocates files and maps memory
in; :data:`SYSTEM` (an :class:`OperatingSystem`) is the real one and the default everywhere.  A test
hands :func:`agent.pagefile.write`, :func:`agent.pagefile.read`, :func:`agent.pagefile.reserve` or
:class:`agent.pager.Pager` a fake of its own: a filesystem that refuses O_DIRECT, a disk whose writes
fail with ``EIO``, a slow read, a kernel without ``MADV_POPULATE_WRITE``.

Each call is one system call (a read or write may move fewer bytes than asked, as the OS's may);
looping until a chunk is whole, spotting a truncated page and falling back from O_DIRECT are the
caller's logic, so a fake exercises them exactly as the real system does.  Errors are the OS's own
``OSError``; :mod:`agent.pagefile.page` converts them into :class:`~agent.errors.PageError`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from pathlib import Path
from typing import Callable, Protocol

O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none: every page takes the buffered path
MADV_POPULATE_WRITE = 23  # linux/mman.h (Linux 5.14+)

Madvise = Callable[[int, int, int], int]  # libc's madvise(address, length, advice): 0, or -1 on refusal


def _libc_madvise() -> Madvise | None:
    """libc's ``madvise``, or ``None`` where there is none (it releases the GIL, as every ctypes call)."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


LIBC_MADVISE = _libc_madvise() if sys.platform.startswith("linux") else None


class SystemCalls(Protocol):
    """Anything that stores pages: the file and memory calls a page-out, a page-in and a reservation make."""

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
    """

    def __init__(self, madvise: Madvise | None = LIBC_MADVISE) -> None:
        self._madvise = madvise

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
        if madvise(address, length, MADV_POPULATE_WRITE) == 0:
            return True
        self._madvise = None  # refused: this kernel has no MADV_POPULATE_WRITE, so never ask again
        return False


SYSTEM: SystemCalls = OperatingSystem()
"""The running machine's system calls: what every page file uses unless it is handed another."""
