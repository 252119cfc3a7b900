"""A device page's charts, from its heartbeats: memory against the budget, loss and accuracy, energy per window."""

from __future__ import annotations

from typing import Any, Sequence

from markupsafe import Markup

from server.dashboard import display
from server.dashboard.charts import Rule, Series, line_chart
from server.db.models import Heartbeat
from server.fleet_history import increase


def device_charts(history: Sequence[Heartbeat]) -> dict[str, Markup]:
    """The charts by name (``memory``, ``loss``, ``accuracy``, ``energy``), oldest heartbeat first in each."""
    # on the server's clock (a device clock may be off by a year): a request's newest heartbeat at the moment
    # it arrived, the ones queued with it that much earlier as the device's own clock says
    newest: dict[float, float] = {}
    for h in history:
        newest[h.received_at] = max(newest.get(h.received_at, h.sent_at), h.sent_at)
    beats = sorted(((h.received_at - (newest[h.received_at] - h.sent_at), h.payload) for h in history),
                   key=lambda pair: pair[0])
    return {"memory": memory_chart(beats), "loss": loss_chart(beats), "accuracy": accuracy_chart(beats),
            "energy": energy_chart(beats)}


def _points(beats: Sequence[tuple[float, dict[str, Any]]], key: str) -> list[tuple[float, float]]:
    return [(at, float(beat[key])) for at, beat in beats if display.present(beat.get(key))]


def memory_chart(beats: Sequence[tuple[float, dict[str, Any]]]) -> Markup:
    """Each heartbeat's last step peak (RSS) and its allowed bound, with the schedule's budget as a line."""
    budgets = _points(beats, "memory_budget_bytes")
    rules = [Rule("budget", budgets[-1][1])] if budgets else []
    return line_chart("Memory: peak of the last step", [Series("peak", _points(beats, "peak_bytes"), "s1"),
                                                        Series("bound", _points(beats, "bound_bytes"), "s3")],
                      rules=rules, y_format=display.size, chart_id="chart-memory")


def loss_chart(beats: Sequence[tuple[float, dict[str, Any]]]) -> Markup:
    """Training loss and held-out loss over time."""
    return line_chart("Loss", [Series("loss", _points(beats, "loss"), "s1"),
                               Series("held-out loss", _points(beats, "holdout_loss"), "s2")],
                      y_format=lambda v: f"{v:.3g}", chart_id="chart-loss")


def accuracy_chart(beats: Sequence[tuple[float, dict[str, Any]]]) -> Markup:
    """Held-out accuracy over time."""
    return line_chart("Held-out accuracy", [Series("accuracy", _points(beats, "holdout_accuracy"), "s2")],
                      y_format=lambda v: f"{100 * v:.0f} %", chart_id="chart-accuracy")


def energy_chart(beats: Sequence[tuple[float, dict[str, Any]]]) -> Markup:
    """Joules spent between consecutive heartbeats (:func:`energy_per_window`)."""
    return line_chart("Energy per heartbeat window", [Series("energy", energy_per_window(_points(beats, "energy_j")),
                                                             "s4")],
                      y_format=display.joules, chart_id="chart-energy")


def energy_per_window(totals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Differences of the agent's running energy total between heartbeats.

    The total counts from the daemon's start, so a total lower than the one
    before means the daemon restarted: that window spent the new total.
    """
    return [(at, increase(before, total)) for (_, before), (at, total) in zip(totals, totals[1:])]
