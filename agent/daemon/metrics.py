"""The agent's optional Prometheus endpoint (``[metrics] prometheus = "127.0.0.1:9101"``).

Gauges follow the status file: state, steps, last loss, held-out accuracy,
peak memory and its bound, budget and energy.  ``_created`` series are off.
"""

from __future__ import annotations

from typing import Any

from agent.errors import ConfigError
from agent.daemon.status import STATES


class AgentMetrics:
    """Prometheus gauges in a registry of their own, served over HTTP on the configured address."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError as exc:
            raise ConfigError("metrics.prometheus is set but prometheus-client is not installed: "
                              "pip install 'poet-edge[device]'") from exc
        prom.disable_created_metrics()
        self.registry = prom.CollectorRegistry()
        gauge = lambda name, text, *labels: prom.Gauge(name, text, labels, registry=self.registry)  # noqa: E731
        self.state = gauge("poet_agent_state", "1 for the agent's current state", "state")
        self.steps = gauge("poet_agent_steps", "training steps committed")
        self.loss = gauge("poet_agent_loss", "loss of the last step")
        self.accuracy = gauge("poet_agent_holdout_accuracy", "held-out accuracy after the last window")
        self.peak = gauge("poet_agent_peak_bytes", "peak process memory of the last step")
        self.bound = gauge("poet_agent_bound_bytes", "what that peak may reach")
        self.budget = gauge("poet_agent_memory_budget_bytes", "the schedule's activation budget")
        self.energy = gauge("poet_agent_energy_joules", "energy of the steps this daemon ran")
        self.eligible = gauge("poet_agent_eligible", "1 when the device may train")

    @classmethod
    def serve(cls, address: str) -> "AgentMetrics":
        """Start the HTTP endpoint on ``HOST:PORT``; raises :class:`ConfigError` when it cannot bind."""
        import prometheus_client as prom

        metrics = cls()
        host, _, port = address.rpartition(":")
        try:
            prom.start_http_server(int(port), addr=host.strip("[]"), registry=metrics.registry)
        except OSError as exc:
            raise ConfigError(f"metrics.prometheus = {address!r}: cannot listen there: {exc.strerror or exc}") from exc
        return metrics

    def update(self, status: dict[str, Any]) -> None:
        """Set every gauge from the status object."""
        for state in STATES:
            self.state.labels(state=state).set(1 if status.get("state") == state else 0)
        for gauge, key in ((self.steps, "steps_done"), (self.loss, "loss"), (self.accuracy, "holdout_accuracy"),
                           (self.peak, "peak_bytes"), (self.bound, "bound_bytes"),
                           (self.budget, "memory_budget_bytes"), (self.energy, "energy_j")):
            value = status.get(key)
            if isinstance(value, (int, float)):
                gauge.set(value)
        self.eligible.set(1 if status.get("eligible") else 0)
