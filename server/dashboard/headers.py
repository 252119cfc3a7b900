"""Security headers on every dashboard response (the device API under ``/api/`` and ``/metrics`` are left alone).

The Content-Security-Policy lets a page load scripts, styles and images only
from this server (no inline script, no inline style, no framing); images may
also be ``data:`` URIs, which the schedule timeline's SVG embeds.  Pages that
show the fleet are not cached.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")
HEADERS = {
    b"content-security-policy": CONTENT_SECURITY_POLICY.encode(),
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"same-origin",
    b"x-frame-options": b"DENY",
}
NOT_DASHBOARD = ("/api/", "/metrics", "/openapi.json")

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class SecurityHeaders:
    """Add :data:`HEADERS` (and ``Cache-Control: no-store`` outside ``/static/``) where a route has not set them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith(NOT_DASHBOARD):
            await self.app(scope, receive, send)
            return
        extra = dict(HEADERS)
        if not path.startswith("/static/"):
            extra[b"cache-control"] = b"no-store"

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *((name, value) for name, value in extra.items() if name not in present)]
            await send(message)

        await self.app(scope, receive, with_headers)
