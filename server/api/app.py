"""``create_app(settings)``: the FastAPI application of one server process."""

from __future__ import annotations

from contextlib import asynccontextmanager
from importlib import metadata
from typing import AsyncIterator

import anyio
from fastapi import FastAPI

from server.api import enrolment, heartbeats, meta, schedules
from server.api.handlers import install_handlers
from server.api.middleware import BodyLimit, RequestLatency
from server.api.state import ServerState
from server.config import ServerSettings

API_DESCRIPTION = """\
The POET Edge fleet server's device API.  Devices enrol once with a single-use enrolment token, then
authenticate with `Authorization: Bearer <device token>`; they push heartbeats and ask for schedules,
which the server plans in worker processes and signs with its Ed25519 key (`/api/v1/server-key`).
docs/api.md describes every route, limit and status code.
"""


def create_app(settings: ServerSettings) -> FastAPI:
    """The application: data directory, database (migrated) and key are ready when this returns; solving starts
    with the app's lifespan (a TestClient block, or uvicorn's start)."""
    from server.dashboard.routes import install_dashboard  # here: the dashboard's modules import server.api

    state = ServerState.open(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(state.stop)

    app = FastAPI(title="POET Edge fleet server", version=_version(), description=API_DESCRIPTION,
                  docs_url=None, redoc_url=None, lifespan=lifespan)  # no docs pages: they load scripts from a CDN
    app.state.server = state
    install_handlers(app)
    for router in (meta.router, enrolment.router, heartbeats.router, schedules.router):
        app.include_router(router)
    install_dashboard(app)  # the operator's pages, beside the device API
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestLatency, metrics=state.metrics)  # outermost: times everything, 413s included
    return app


def _version() -> str:
    try:
        return metadata.version("poet-edge")
    except metadata.PackageNotFoundError:
        return "0+unknown"
