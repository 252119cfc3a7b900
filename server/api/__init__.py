"""The device API (FastAPI): enrolment, heartbeats, schedule requests and downloads, the server key, metrics.

``create_app(settings)`` builds it; ``/openapi.json`` describes it, and
docs/api.md explains it.
"""

from __future__ import annotations

from server.api.app import create_app

__all__ = ["create_app"]
