"""Checkpoints that survive ``kill -9`` and power loss: written atomically, checked on load, the last two kept.

A checkpoint file (:mod:`agent.daemon.checkpoint_file`) is streamed to disk a
tensor at a time -- optimizer state on flash a chunk at a time -- and carries
the SHA-256 of its contents, so writing one never holds a second copy of the
model or its optimizer state in memory.  It is written to a temporary file,
fsynced, renamed over its final name and the directory fsynced, so a name
either holds a whole checkpoint or does not exist.
:meth:`CheckpointStore.load_latest` takes the newest file whose hash matches
and falls back to the one before when the newest is damaged (a disk that lied
about a flush, a bit flipped on an SD card).  A damaged file passed over is
renamed aside (``step-N.ckpt.damaged``, kept for inspection), so the files
kept are the newest that read back, never a damaged one in place of a good
one; when none reads back, nothing is renamed and loading refuses, since
starting over from the initial weights would lose every step.  Its tensors are read when the
caller asks (:class:`~agent.daemon.checkpoint_file.StoredTensor`).  The
skeleton is loaded with ``weights_only=True``: a checkpoint holds tensors and
plain values only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.daemon import checkpoint_file
from agent.daemon.checkpoint_file import DamagedError
from agent.errors import CheckpointError

KEEP = 2
DAMAGED_SUFFIX = ".damaged"
_NAME = re.compile(r"^step-(\d{9})\.ckpt$")



@dataclass(frozen=True)
class Loaded:
    """A checkpoint read back: its step count, content, and the damaged newer files passed over (renamed aside
    with :data:`DAMAGED_SUFFIX`)."""

    steps_done: int
    state: dict[str, Any]
    path: Path
    skipped: tuple[str, ...] = ()


class CheckpointStore:
    """The checkpoints of one workload in ``directory``."""

    def __init__(self, directory: str | Path, keep: int = KEEP) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def save(self, steps_done: int, state: dict[str, Any]) -> Path:
        """Write ``state`` as the checkpoint after ``steps_done`` steps; drop all but the newest ``keep``.

        ``state`` holds tensors, chunked sources (optimizer state on flash) and plain values; each tensor is
        written from where it lives.
        """
        final = self.directory / f"step-{steps_done:09d}.ckpt"
        temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(temporary, "w+b") as f:
                checkpoint_file.write(f, state)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, final)
            _fsync_directory(self.directory)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise CheckpointError(f"cannot write checkpoint {final}: {exc.strerror or exc}; the previous "
                                  "checkpoints are kept (free space on the state directory's disk)") from exc
        for old in self.paths()[:-self.keep]:
            old.unlink(missing_ok=True)
        return final

    def paths(self) -> list[Path]:
        """Checkpoint files, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if _NAME.match(p.name))

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint that reads back whole, or ``None`` when there is none at all.

        Raises :class:`CheckpointError` when checkpoints exist but every one is damaged.
        """
        skipped: list[str] = []
        damaged: list[Path] = []
        for path in reversed(self.paths()):
            try:
                state = _read(path)
            except CheckpointError as exc:
                skipped.append(str(exc))
                damaged.append(path)
                continue
            for bad in damaged:  # out of the names retention counts, so it never deletes a good one for them
                bad.replace(bad.with_name(bad.name + DAMAGED_SUFFIX))
            return Loaded(int(_NAME.match(path.name).group(1)), state, path, tuple(skipped))
        if skipped:
            raise CheckpointError("no checkpoint can be read: " + "; ".join(skipped)
                                  + " (move them aside to start training from the initial weights)")
        return None

    def remove_temporaries(self) -> None:
        """Delete half-written files a killed process left behind."""
        if self.directory.is_dir():
            for p in self.directory.glob(".step-*.tmp"):
                p.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any]:
    try:
        return checkpoint_file.read(path)
    except DamagedError as exc:
        raise CheckpointError(f"{path.name}: {exc}") from exc
    except OSError as exc:
        raise CheckpointError(f"{path.name}: cannot read: {exc.strerror or exc}") from exc


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
