"""Prometheus metrics of the fleet server, served at ``/metrics`` (a plain route, in a registry of its own).

Fleet figures are read from the database when Prometheus scrapes, so every
server process reports the same fleet; solve times and API latency are
counted by the process that saw them.  ``_created`` series are off
(:func:`prometheus_client.disable_created_metrics`).

::

    poet_server_devices                         enrolled devices, not revoked
    poet_server_devices_online                  devices with a heartbeat within ``online_seconds``
    poet_server_devices_by_state{state}         online devices by their last state
    poet_server_fleet_steps                     training steps the devices report, summed
    poet_server_fleet_energy_joules             energy the devices report, summed
    poet_server_solve_requests{status}          schedule requests by status
    poet_server_devices_with_error              online devices whose last heartbeat reports an error
    poet_server_devices_over_budget             online devices whose last step went over its memory bound
    poet_server_solve_seconds{status}           histogram: how long solves took, by how they ended
    poet_server_heartbeats_received_total       heartbeats stored by this process
    poet_server_http_request_duration_seconds{method,route,status}   histogram: API latency by route
    poet_server_build_info{version,python}      1, labelled with this server's release and Python
    process_*, python_info                      this process: CPU, resident memory, open files, start time
"""

from __future__ import annotations

import platform
import time
from typing import Iterable

import prometheus_client as prom
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from common.version import software_version
from server import solve_requests
from server.db.engine import Database
from server.db.models import DEVICE_STATES, Device
from server.fleet_history import fleet_counts

STATES = DEVICE_STATES
SOLVE_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class ServerMetrics:
    """The registry, the process's own counters, and the fleet collector."""

    def __init__(self, db: Database, online_seconds: float) -> None:
        prom.disable_created_metrics()
        self.registry = prom.CollectorRegistry(auto_describe=True)
        self.solve_seconds = prom.Histogram("poet_server_solve_seconds", "how long solves took, by how they ended",
                                            ["status"], buckets=SOLVE_BUCKETS, registry=self.registry)
        self.heartbeats = prom.Counter("poet_server_heartbeats_received", "heartbeats stored by this process",
                                       registry=self.registry)
        self.latency = prom.Histogram("poet_server_http_request_duration_seconds", "API latency by route",
                                      ["method", "route", "status"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(FleetCollector(db, online_seconds))
        prom.ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes
        prom.PlatformCollector(registry=self.registry)  # python_info
        build = prom.Info("poet_server_build", "this server's release", registry=self.registry)
        build.info({"version": software_version(), "python": platform.python_version()})

    def observe_solve(self, status: str, seconds: float) -> None:
        """Count one finished solve."""
        self.solve_seconds.labels(status=status).observe(seconds)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one API request by its route's template (``/api/v1/schedules/{schedule_id}``)."""
        self.latency.labels(method=method, route=route, status=str(status)).observe(seconds)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return prom.generate_latest(self.registry)


class FleetCollector(Collector):
    """Gauges computed from the database at scrape time."""

    def __init__(self, db: Database, online_seconds: float) -> None:
        self.db = db
        self.online_seconds = online_seconds

    def describe(self) -> Iterable[Metric]:
        """The families, without touching the database (called when registered)."""
        return self._families()

    def collect(self) -> Iterable[Metric]:
        """The families with the fleet's current figures."""
        families = self._families()
        devices, online, steps, energy = families[:4]
        by_state, solves, with_error, over_budget = families[4:8]
        online_since = time.time() - self.online_seconds
        with self.db.read() as session:
            active = Device.revoked_at.is_(None)
            counts = fleet_counts(session, online_since)
            devices.add_metric([], counts["online"] + counts["offline"])
            online.add_metric([], counts["online"])
            totals = session.execute(select(func.coalesce(func.sum(Device.steps_done), 0),
                                            func.coalesce(func.sum(Device.energy_j), 0.0)).where(active)).one()
            beat = Device.last_heartbeat
            seen = (active, Device.last_seen >= online_since)
            with_error.add_metric([], session.scalar(select(func.count()).where(
                *seen, func.coalesce(beat["last_error"].as_string(), "") != "")) or 0)
            over_budget.add_metric([], session.scalar(select(func.count()).where(
                *seen, beat["peak_bytes"].as_float() > beat["bound_bytes"].as_float())) or 0)
        for state in STATES:
            by_state.add_metric([state], counts[state])
        steps.add_metric([], totals[0])
        energy.add_metric([], totals[1])
        for status, count in solve_requests.count_by_status(self.db).items():
            solves.add_metric([status], count)
        return families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("poet_server_devices", "enrolled devices, not revoked"),
            GaugeMetricFamily("poet_server_devices_online", "devices with a heartbeat within the online window"),
            GaugeMetricFamily("poet_server_fleet_steps", "training steps the devices report, summed"),
            GaugeMetricFamily("poet_server_fleet_energy_joules", "energy the devices report, summed"),
            GaugeMetricFamily("poet_server_devices_by_state", "online devices by their last state", labels=["state"]),
            GaugeMetricFamily("poet_server_solve_requests", "schedule requests by status", labels=["status"]),
            GaugeMetricFamily("poet_server_devices_with_error", "online devices whose last heartbeat reports an error"),
            GaugeMetricFamily("poet_server_devices_over_budget",
                              "online devices whose last step's memory went over its bound"),
        ]
