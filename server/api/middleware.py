"""ASGI middleware: the request body limit and the latency histogram.

Both are plain ASGI (not ``BaseHTTPMiddleware``), so a streamed body is
counted as it arrives and nothing is buffered twice.
"""

from __future__ import annotations

import json
import time
from typing import Any, Awaitable, Callable

from starlette.exceptions import HTTPException

from server.metrics import ServerMetrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLarge(HTTPException):
    """A request body over the limit (an HTTP error, so the framework's body parsing passes it on as 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit:,} bytes")


class BodyLimit:
    """Answer 413 to a body over ``max_bytes``: at once by its ``Content-Length``, or as soon as a streamed
    (chunked) body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1:
            await _reply(send, 400, "Content-Length is not a number")
            return
        if declared is not None and declared > self.max_bytes:
            await _reply(send, 413, BodyTooLarge(self.max_bytes).detail)
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge as exc:  # read outside the framework's body parsing
            if started:
                raise
            await _reply(send, 413, exc.detail)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return None


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RequestLatency:
    """Time every HTTP request into :attr:`ServerMetrics.latency`, labelled by the route's template.

    Requests that match no route share the label ``unmatched``, so a scan of
    random paths cannot grow the number of series.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(scope.get("method", ""), template, status, time.perf_counter() - start)
