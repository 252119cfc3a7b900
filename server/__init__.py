"""POET Edge fleet server: device enrolment and heartbeats, the schedule registry, planning in worker processes,
and the operator dashboard.

One process an operator runs for the fleet (``poet-edge server run``).  It
imports the planner (``schedules``) and never the agent, and installs without
torch (``pip install 'poet-edge[server]'``).  Importing ``server`` is cheap:
the web framework loads with :mod:`server.api`.

Modules: :mod:`server.api` (the FastAPI app), :mod:`server.dashboard` (operator
login and pages), :mod:`server.config`,
:mod:`server.db` (models, engine, migrations), :mod:`server.devices`
(enrolment, authentication, heartbeats), :mod:`server.solve_requests`,
:mod:`server.solves` and :mod:`server.solve_worker` (planning),
:mod:`server.registry` (stored schedules), :mod:`server.model_versions` (stored global
models), :mod:`server.federated` (Flower: the ServerApp, SuperLink, runs and rounds), :mod:`server.keys`,
:mod:`server.tokens`, :mod:`server.ratelimit`, :mod:`server.metrics`,
:mod:`server.cli`, :mod:`server.errors`.
"""

from __future__ import annotations

from server.config import ServerSettings
from server.errors import ServerError

__all__ = ["ServerError", "ServerSettings"]
