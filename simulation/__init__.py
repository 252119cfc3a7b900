"""``poet-edge simulate``: a fleet of virtual devices of several memory classes, federated with Flower.

The same apps as a real deployment (``agent.federated.clientapp:app`` on every device,
``server.federated.serverapp:app`` on the server) run in Flower's simulation engine: a local
SuperLink in simulation mode and ``flwr run`` with ``num-supernodes=N``, virtual
SuperNodes on Ray (:mod:`simulation.engine`).  Each virtual device derives its
class, budget and viewpoint from its partition id and the run config
(:mod:`agent.federated.virtual`) and plans from one graph of the model, profiled once per
seed on the machine (:mod:`simulation.profile`); the report is built from the
rows the ServerApp stored.
This package sits above both ``agent`` and ``server`` (it imports both;
neither imports it) and imports no Flower itself: Flower runs as programs.

Importing the package stays cheap (the ``poet-edge`` command loads it for its
``--help``): :mod:`simulation.run`, :mod:`simulation.engine`, :mod:`simulation.profile` and
:mod:`simulation.report` are imported where a simulation really runs.
"""

from __future__ import annotations

from simulation.fleet import DEFAULT_CLASSES, DeviceClass, fleet_node_configs, parse_classes

__all__ = ["DEFAULT_CLASSES", "DeviceClass", "fleet_node_configs", "parse_classes"]
