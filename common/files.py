"""Files replaced atomically: what every package that keeps state on disk writes through."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data`` (mode 0600): written beside it, fsynced, renamed over it, and the rename
    made durable where ``sync_directory``.  A crash leaves the old file or the new one, never a mix."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(fd, 0o600)  # a leftover temporary file would keep its old mode through O_CREAT
            handle.write(data)
            handle.flush()
            os.fsync(fd)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    if sync_directory:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
