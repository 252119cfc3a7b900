"""Rendering a dashboard page: the template, the signed-in operator and its CSRF token, the display helpers."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from server.dashboard import display
from server.dashboard.sessions import SignedIn
from server.dashboard.state import dashboard_state


def render(request: Request, template: str, operator: SignedIn | None, *, status: int = 200,
           headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    """``template`` rendered with ``context`` plus ``operator``, ``csrf_token``, ``display`` and ``now``."""
    page = dashboard_state(request).templates.get_template(template)
    html = page.render(operator=operator, csrf_token=operator.csrf_token if operator else "", display=display,
                       now=time.time(), **context)
    return HTMLResponse(html, status_code=status, headers=headers)
