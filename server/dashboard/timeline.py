"""A stored schedule's timeline picture as SVG, drawn by the planner's own plot (:func:`schedules.plot.plot_timeline`).

Drawing takes a second or so (matplotlib on the Agg canvas, in the worker
thread of a plain route); a schedule never changes once stored, so each
picture is drawn once and kept in a small in-memory cache.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from common.errors import PoetEdgeError
from schedules.graph import TrainingGraph
from schedules.plot import plot_timeline
from schedules.schedule import Schedule

CACHED = 16


class TimelineCache:
    """SVG pictures by schedule id; the least recently used is dropped beyond ``size``."""

    def __init__(self, size: int = CACHED) -> None:
        self.size = size
        self._pictures: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, schedule_id: str, document: bytes, graph: bytes) -> bytes | None:
        """The picture of the schedule, drawn now or earlier; ``None`` when it cannot be drawn."""
        with self._lock:
            if schedule_id in self._pictures:
                self._pictures.move_to_end(schedule_id)
                return self._pictures[schedule_id]
        picture = render_timeline(document, graph)
        if picture is not None:
            with self._lock:
                self._pictures[schedule_id] = picture
                while len(self._pictures) > self.size:
                    self._pictures.popitem(last=False)
        return picture


def render_timeline(document: bytes, graph: bytes) -> bytes | None:
    """The stage x node timeline and memory panel of a schedule as SVG bytes; ``None`` if they do not load."""
    try:
        schedule = Schedule.from_json(document)
        training_graph = TrainingGraph.from_dict(json.loads(graph))
        with tempfile.TemporaryDirectory(prefix="poet-timeline-") as folder:
            path = plot_timeline(training_graph, schedule, Path(folder) / "timeline.svg")
            return path.read_bytes()
    except (PoetEdgeError, ValueError):
        return None
