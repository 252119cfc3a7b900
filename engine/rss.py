"""Honest peak-RSS measurement of one step (Linux ``/proc``).

Process RSS holds a large fixed part (libraries, the model) and glibc keeps
freed blocks, so a lifetime peak says little.  What works (see
``../shared/notes/pytorch.md``): ``malloc_trim(0)``, then write ``5`` to
``/proc/self/clear_refs`` (resets ``VmHWM``), read ``VmRSS``, run the step,
read ``VmHWM``.  Large tensors must live on mmap so that they return to the
system when freed: ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment, or
:func:`return_freed_memory` from inside the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
FREED_MEMORY_THRESHOLD = 64 << 10


def return_freed_memory(threshold: int = FREED_MEMORY_THRESHOLD) -> bool:
    """Serve allocations of ``threshold`` bytes and more from mmap, so freeing a tensor gives its pages back.

    glibc otherwise raises its mmap threshold after the first large free and
    keeps later freed tensors in the heap, where RSS does not follow them.
    Same as ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment; affects
    allocations made from now on, so call it early: a request can still be
    served from free heap chunks left by earlier large frees.  It has a price:
    every large allocation faults its pages in afresh, which slows a
    convolutional network's step markedly.  Returns False where there is no glibc.
    """
    if _LIBC is None or not hasattr(_LIBC, "mallopt"):
        return False
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, threshold))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


if _LIBC is not None and hasattr(_LIBC, "mallinfo2"):
    _LIBC.mallinfo2.restype = _MallInfo2


def trim_heap() -> None:
    """Give the heap's free pages back to the system (``malloc_trim``); a no-op where there is no glibc."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class HeapTrimmer:
    """Trims the heap once ``threshold`` bytes more of it are free than after the last trim.

    With the mmap threshold lowered most freed tensors leave the process at once, but a tensor
    that found a free chunk in the heap was served from it, and freeing it leaves free heap pages
    that stay in RSS (a fifth of the budget above the ledger on resnet18 at half its memory).
    Trimming after every free costs a few percent of a step; watching the heap's free bytes
    (``mallinfo2``, about 1 µs) trims only when freed tensors did land in the heap.  Trimmed pages
    still count as free heap bytes, so the mark moves to the level after each trim (and down with
    reuse).  Does nothing without glibc 2.33+.

    ``mallinfo2`` walks the heap's free lists, so with many small chunks free it costs tens of microseconds,
    a millisecond or more a step.  Given ``freed_bytes`` (what PyTorch has given back to malloc so far, which
    the caching allocator counts), the heap is asked only once that has grown by the room left before a trim
    was due at the last asking: until then the free bytes cannot have reached the mark plus ``threshold``.
    """

    def __init__(self, threshold: int, freed_bytes: Callable[[], int] | None = None) -> None:
        self.threshold = threshold
        self.enabled = _LIBC is not None and hasattr(_LIBC, "mallinfo2") and hasattr(_LIBC, "malloc_trim")
        self.trims = 0
        self.checks = 0  # times the heap was asked (mallinfo2)
        self._freed_bytes = freed_bytes
        self._mark = self._free_bytes() if self.enabled else 0
        self._room = threshold  # bytes that may be freed before the heap is asked again
        self._freed_at_check = freed_bytes() if freed_bytes is not None else 0

    def after_free(self) -> None:
        """Call after freeing memory: trims when enough of it went back to the heap."""
        if not self.enabled:
            return
        if self._freed_bytes is not None:
            freed = self._freed_bytes()
            if freed - self._freed_at_check < self._room:
                return
            self._freed_at_check = freed
        free = self._free_bytes()
        if free - self._mark >= self.threshold:
            trim_heap()
            self.trims += 1
            free = self._mark = self._free_bytes()
        else:
            self._mark = min(self._mark, free)  # chunks handed out again are resident again once freed
        # reuse only lowers the free bytes: they reach mark + threshold only after this much more is freed
        self._room = self.threshold - (free - self._mark)

    def _free_bytes(self) -> int:
        self.checks += 1
        return _LIBC.mallinfo2().fordblks



def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def start_window() -> int | None:
    """Trim the heap, reset the peak, and return the current RSS in bytes (``None`` off Linux)."""
    trim_heap()
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return None  # no clear_refs (not Linux, or not permitted): a peak would mean nothing
    return current()


def current() -> int | None:
    """Resident set now, in bytes (``None`` off Linux)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def anonymous() -> int | None:
    """Anonymous resident memory now, in bytes (``RssAnon``; ``None`` off Linux).

    What a process holds for itself: heap, mmapped tensors, thread stacks, caches.  The rest of its RSS is
    file-backed -- mostly the libraries' code, faulted in as a kernel first runs -- which every process running
    the same kernels shares and the kernel drops under pressure instead of running out of memory.
    """
    kib = _status_kib("RssAnon")
    return None if kib is None else kib * 1024


def settled_anonymous() -> int | None:
    """:func:`anonymous` with garbage collected and freed heap given back first."""
    import gc

    gc.collect()  # what died earlier and is freed later must not land inside a measurement
    trim_heap()
    return anonymous()


def anonymous_growth_since(loaded_anonymous: int | None) -> int:
    """How much this process's own memory grew since :func:`settled_anonymous` read ``loaded_anonymous`` (0
    where either cannot be read).

    Read with the model built, before anything ran it, this is what its first run leaves resident for as long
    as the process trains: the cut, the libraries' caches and thread pools, a cache the model builds lazily.
    The libraries' code its kernels fault in is file-backed and shared, and not counted: it is most of the
    resident growth (21 of 24 MB on resnet18, 18 of 19 MB on the digits CNN).
    """
    now = settled_anonymous()
    return max(0, now - loaded_anonymous) if now is not None and loaded_anonymous is not None else 0


def peak_since_start() -> int | None:
    """Peak RSS in bytes since :func:`start_window`."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024
