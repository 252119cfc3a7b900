"""How errors become responses: one JSON shape, the right status, no stack trace to a client.

Every error response is ``{"detail": "one line"}``; a validation error adds
``"problems"`` (where and what, without echoing the input back).  Anything
unexpected is logged here with its traceback and answered with a plain 500.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from server.api.auth import unchecked_credentials
from server.errors import AuthenticationError, ServerError

log = logging.getLogger("poet-server")

MAX_PROBLEMS = 20
_UNION_TAGS = ("one", "many")  # the heartbeat body's two shapes (server.api.schemas.HeartbeatBody)


def install_handlers(app: FastAPI) -> None:
    """Register every handler on ``app``."""
    app.add_exception_handler(ServerError, on_server_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(RecursionError, on_too_deep)
    app.add_exception_handler(OperationalError, on_database_busy)
    app.add_exception_handler(DataError, on_unstorable)
    app.add_exception_handler(Exception, on_unexpected)


DEFAULT_RETRY_AFTER = 5.0  # seconds, for a 429 or 503 whose error does not say


def error(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """The one error shape."""
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


async def on_server_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServerError)
    if exc.http_status >= 500 and exc.http_status != 503:
        return await on_unexpected(request, exc)
    headers = {}
    if exc.http_status in (429, 503):  # every one says when to come back (docs/api.md)
        headers["Retry-After"] = str(max(1, math.ceil(getattr(exc, "retry_after", DEFAULT_RETRY_AFTER))))
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    return error(exc.http_status, str(exc), headers)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail), dict(exc.headers or {}))


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    credentials = unchecked_credentials(request)
    if credentials is not None:
        try:
            await run_in_threadpool(credentials.device)  # who asks is answered before what was asked
        except ServerError as refused:
            return await on_server_error(request, refused)
    problems = [_problem(e) for e in exc.errors()[:MAX_PROBLEMS]]
    summary = "; ".join(f"{'.'.join(map(str, p['loc']))}: {p['msg']}" for p in problems[:5])
    more = len(exc.errors()) - 5
    if more > 0:
        summary += f" (and {more} more)"
    return error(422, summary or "the request is not valid", problems=problems)


def _problem(raw: dict[str, Any]) -> dict[str, Any]:
    loc = list(raw.get("loc", ()))
    if len(loc) > 1 and loc[0] == "body" and loc[1] in _UNION_TAGS:
        del loc[1]
    return {"loc": [part if isinstance(part, (str, int)) else str(part) for part in loc],
            "msg": str(raw.get("msg", ""))[:500], "type": str(raw.get("type", ""))}


async def on_too_deep(request: Request, exc: Exception) -> JSONResponse:
    return error(400, "the request's JSON is nested too deeply")


async def on_database_busy(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database error on %s %s: %s", request.method, request.url.path, exc)
    return error(503, "the server's database is busy; retry shortly", {"Retry-After": "1"})


async def on_unstorable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("value refused by the database on %s %s: %s", request.method, request.url.path, exc)
    return error(422, "the request holds a value the database cannot store (out of range, or a NUL character)")


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, "internal server error; the server log has the details")
