"""The device side wired together: ``poet-edge agent run``'s daemon with its parts.

The daemon (:mod:`agent.daemon`: eligibility, windows of local training, checkpoints) and the Flower side
(:mod:`agent.federated`: the SuperNode, the ClientApps) never import each other; they meet here, where the
daemon is built with the fleet's reporter, the metrics endpoint and, with ``[flower] enabled``, the SuperNode
it keeps connected while the device may train.  Nothing here imports torch: the waiting agent stays small.
"""

from __future__ import annotations

from typing import Any

from agent.config import AgentConfig
from agent.daemon.supervisor import Daemon
from agent.federated.supernode import SuperNode
from agent.schedule_sources import NoReporter


def build_daemon(config: AgentConfig, **parts: Any) -> Daemon:
    """The daemon for ``config``; ``parts`` are :class:`~agent.daemon.supervisor.Daemon`'s own keyword arguments
    (a test's eligibility or clock, the reporter, the metrics)."""
    federation = SuperNode(config) if config.flower.enabled else None
    return Daemon(config, federation=federation, **parts)


def run(config: AgentConfig) -> int:
    """Run the device's daemon until SIGTERM, with the metrics endpoint and the fleet's heartbeats its config
    asks for; returns its exit status."""
    metrics = None
    if config.metrics.prometheus:
        from agent.daemon.metrics import AgentMetrics

        metrics = AgentMetrics.serve(config.metrics.prometheus)
    reporter: Any = NoReporter()
    if config.server.url:  # a device outside any fleet does not load the HTTP client
        from agent.fleet import reporter_from_config

        reporter = reporter_from_config(config)
    try:
        return build_daemon(config, metrics=metrics, reporter=reporter).run()
    finally:
        if hasattr(reporter, "close"):
            reporter.close()  # the "stopped" heartbeat goes out, unless the server is being waited for
