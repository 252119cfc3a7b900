"""The device agent daemon: trains while the device is idle, charging and cool, and never loses a step.

Modules: :mod:`~agent.daemon.supervisor` (the daemon's states and its worker process),
:mod:`~agent.daemon.worker` (the training process), :mod:`~agent.daemon.trainer` (steps, checkpoints,
evaluation), :mod:`~agent.daemon.checkpoint`, :mod:`~agent.daemon.history`, :mod:`~agent.daemon.events`,
:mod:`~agent.daemon.status`, :mod:`~agent.daemon.notify` (sd_notify), :mod:`~agent.daemon.metrics`
(Prometheus).  It never imports :mod:`agent.federated` (nor the other way): what both need sits in
:mod:`agent` itself (:mod:`~agent.config`, :mod:`~agent.prepare`, :mod:`~agent.schedule_sources`,
:mod:`~agent.fleet`), and :mod:`agent.application` wires the daemon to the SuperNode.
"""
