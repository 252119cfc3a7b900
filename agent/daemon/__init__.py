"""The device agent daemon: trains while the device is idle, charging and cool, and never loses a step.

Modules: :mod:`~agent.daemon.config` (the TOML config), :mod:`~agent.daemon.supervisor`
(the daemon's states and its worker process), :mod:`~agent.daemon.worker` (the
training process), :mod:`~agent.daemon.prepare` (profile once, get a schedule),
:mod:`~agent.daemon.trainer` (steps, checkpoints, evaluation),
:mod:`~agent.daemon.checkpoint`, :mod:`~agent.daemon.sources` (schedule sources
and reporters: the seams the fleet plugs into), :mod:`~agent.daemon.fleet` (the fleet server's
schedule source and heartbeat reporter), :mod:`~agent.daemon.status`,
:mod:`~agent.daemon.notify` (sd_notify), :mod:`~agent.daemon.metrics`
(Prometheus), :mod:`~agent.daemon.cli` (``poet-edge agent``).
"""
