"""Storage not low: train only while the disks that hold checkpoints and pages have room to spare.

A window writes checkpoints to the state directory and pages to the swap directory; on a nearly full disk
it would train steps that no checkpoint can keep.  Android's JobScheduler and Google's federated compute
wait for "storage not low" for the same reason.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from agent.monitors.base import Verdict

FreeBytes = Callable[[Path], int]
"""Free bytes on the filesystem holding a path (``shutil.disk_usage(path).free``); injectable for tests."""


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


class StorageMonitor:
    """Eligible while every folder's filesystem has at least ``min_free_bytes`` free.

    Parameters
    ----------
    folders:
        The state and swap directories; a folder not made yet is measured at its nearest existing parent.
    min_free_bytes:
        The room a window needs to spare (0: no check).
    free_bytes:
        Reads a filesystem's free bytes; default :func:`shutil.disk_usage`.
    """

    name = "storage"

    def __init__(self, folders: Iterable[str | Path], min_free_bytes: int,
                 free_bytes: FreeBytes | None = None) -> None:
        self.folders = list(dict.fromkeys(Path(f) for f in folders))
        self.min_free_bytes = min_free_bytes
        self._free = free_bytes or _free_bytes

    def check(self, now: float) -> Verdict:
        """Measure each folder's filesystem now; ``now`` is unused: free space has no memory."""
        low, seen = [], []
        least: int | None = None
        for folder in self.folders:
            existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("/"))
            try:
                free = self._free(existing)
            except OSError as exc:
                low.append(f"free space on {folder} unknown ({exc.strerror or exc})")
                continue
            least = free if least is None else min(least, free)
            seen.append(f"{_mb(free)} free on {folder}")
            if free < self.min_free_bytes:
                low.append(f"storage low: {_mb(free)} free on {folder} < {_mb(self.min_free_bytes)} minimum")
        readings = {"storage_free_bytes": least}
        if low:
            return Verdict(self.name, False, "; ".join(low), readings)
        return Verdict(self.name, True, ", ".join(seen) or "no folders to watch", readings)


def _mb(value: int) -> str:
    return f"{value / 1e6:,.0f} MB"
