"""The fleet page's charts, from the fleet's samples (:mod:`server.fleet_history`): devices by state over time,
training steps per hour and energy per hour."""

from __future__ import annotations

from typing import Sequence

from markupsafe import Markup

from server.dashboard import display
from server.dashboard.charts import Series, line_chart
from server.db.models import DEVICE_STATES
from server.fleet_history import Sample, per_hour

MAX_POINTS = 720  # per line: a week of minutes is thinned to this many
# (key in a sample's counts, legend, colour class): online devices by state, then the offline ones
STATE_LINES = (*((state, state, f"s{i + 1}") for i, state in enumerate(DEVICE_STATES)), ("offline", "offline", "s6"))


def fleet_charts(samples: Sequence[Sample]) -> dict[str, Markup]:
    """The charts by name (``states``, ``steps``, ``energy``)."""
    hours = per_hour(list(samples))
    return {"states": states_chart(samples),
            "steps": line_chart("Training steps per hour", [Series("steps", [(h, s) for h, s, _ in hours], "s1")],
                                y_format=display.count, chart_id="chart-steps"),
            "energy": line_chart("Energy per hour", [Series("energy", [(h, e) for h, _, e in hours], "s4")],
                                 y_format=display.joules, chart_id="chart-fleet-energy")}


def states_chart(samples: Sequence[Sample]) -> Markup:
    """How many devices were in each state (online ones) and offline, minute by minute."""
    shown = samples[::max(1, -(-len(samples) // MAX_POINTS))]
    series = [Series(name, [(s.at, s.counts.get(key, 0)) for s in shown], css) for key, name, css in STATE_LINES]
    return line_chart("Devices by state", series, y_format=display.count, chart_id="chart-states")
