"""The device's own record of its training windows: when, how long, why each ended, steps, loss and energy.

One JSON object per line in ``state_dir/history.jsonl``, appended by the daemon when a window ends and read by
``poet-edge agent status --history``.  The newest :data:`KEEP` windows are kept.  Torch-free.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.files import write_atomically

KEEP = 1000


@dataclass(frozen=True)
class Window:
    """One training window as the daemon saw it."""

    started_at: float  # wall clock (time.time())
    seconds: float
    outcome: str  # "stopped" (checkpointed and ended) or "failed"
    reason: str
    steps_from: int  # what the checkpoint held when it started
    steps_to: int  # what the checkpoint holds now
    loss: float | None
    energy_j: float


def append(path: Path, window: Window, keep: int = KEEP) -> None:
    """Add ``window`` to the history at ``path``, keeping the newest ``keep`` (rewritten whole, atomically)."""
    lines = _lines(path)[-(keep - 1):] if keep > 1 else []
    lines.append(json.dumps(asdict(window)))
    write_atomically(path, ("\n".join(lines) + "\n").encode(), sync_directory=False)


def read(path: Path, last: int | None = None) -> list[Window]:
    """The windows recorded at ``path``, oldest first (the ``last`` newest); lines that do not parse are left
    out (a history is a record for people, never a reason to fail)."""
    windows = []
    for line in _lines(path):
        try:
            windows.append(Window(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return windows[-last:] if last else windows


def format_history(windows: list[Window]) -> str:
    """The windows as a table for a person, newest last."""
    if not windows:
        return "no training window recorded yet"
    rows = [("started", "minutes", "steps", "loss", "energy", "ended")]
    for w in windows:
        started = datetime.datetime.fromtimestamp(w.started_at).strftime("%Y-%m-%d %H:%M:%S")
        loss = f"{w.loss:.4f}" if w.loss is not None else "-"
        rows.append((started, f"{w.seconds / 60:.1f}", f"{w.steps_from}->{w.steps_to}", loss,
                     f"{w.energy_j:,.1f} J", f"{w.outcome}: {w.reason}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(r[:5], widths)) + "  " + r[5]
                     for r in rows)


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def as_dicts(windows: list[Window]) -> list[dict[str, Any]]:
    """The windows as JSON objects (``status --history --json``)."""
    return [asdict(w) for w in windows]
