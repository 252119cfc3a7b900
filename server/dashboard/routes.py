"""``install_dashboard(app)``: the dashboard's routes, static files and security headers on the server's app."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from server.dashboard import login, pages
from server.dashboard.headers import SecurityHeaders
from server.dashboard.state import STATIC, DashboardState


def install_dashboard(app: FastAPI) -> DashboardState:
    """Add the dashboard to ``app``; its state is ``app.state.dashboard``."""
    state = DashboardState()
    app.state.dashboard = state
    app.include_router(login.router)
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(SecurityHeaders)
    return state
