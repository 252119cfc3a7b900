"""Honest peak-RSS measurement of one step (Linux ``/proc``).

Process RSS holds a large fixed part (libraries, the model) and glibc keeps
freed blocks, so a lifetime peak says little.  What works (see
``../shared/notes/pytorch.md``): ``malloc_trim(0)``, then write ``5`` to
``/proc/self/clear_refs`` (resets ``VmHWM``), read ``VmRSS``, run the step,
read ``VmHWM``.  Run with ``MALLOC_MMAP_THRESHOLD_=65536`` in the environment
so large tensors live on mmap and return to the system when freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return None  # no clear_refs (not Linux, or not permitted): a peak would mean nothing
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def peak_since_start() -> int | None:
    """Peak RSS in bytes since :func:`start_window`."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024
