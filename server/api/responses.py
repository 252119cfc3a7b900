"""The error responses each route documents in ``/openapi.json`` (all share :class:`ErrorBody`)."""

from __future__ import annotations

from typing import Any

from server.api.schemas import ErrorBody

_WHY = {
    304: "unchanged: the schedule's ETag matches If-None-Match",
    400: "the body is not JSON the server can read",
    401: "no device token, or an unknown or revoked one (enrolment: a wrong, used or expired enrolment token)",
    404: "no such request or schedule",
    409: "the device name is taken",
    413: "the request body is over the server's limit",
    422: "the request does not validate; detail says where and why",
    429: "too many attempts from this address; see Retry-After",
    503: "the server is busy (solve queue full, database busy); see Retry-After",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route answering ``codes`` (400, 413, 422 and 503 are added: any body route has them)."""
    documented: dict[int | str, dict[str, Any]] = {}
    for code in sorted({*codes, 400, 413, 422, 503}):
        documented[code] = {"description": _WHY[code]} if code == 304 else {"model": ErrorBody,
                                                                             "description": _WHY[code]}
    return documented
