"""Schedule requests and downloads: ask for a plan, follow its solve, fetch the signed file with ETag."""

from __future__ import annotations

import re
import time
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from starlette.exceptions import HTTPException

from server import audit, registry, solve_requests
from server.api.auth import DeviceAuth
from server.api.responses import errors
from server.api.schemas import ScheduleRequestBody, ScheduleRequestStatus
from server.api.state import server_state
from server.db.models import SolveRequest

router = APIRouter(tags=["schedules"])

REQUEST_ID = re.compile(r"[0-9a-f]{32}")
SCHEDULE_ID = re.compile(r"[0-9a-f]{16}")


@router.post("/api/v1/schedule-requests", status_code=202, response_model=ScheduleRequestStatus,
             responses=errors(401, 429, 503),
             summary="ask for a schedule; identical requests share one solve; a device may have 3 waiting")
def request_schedule(body: ScheduleRequestBody, auth: DeviceAuth, request: Request) -> ScheduleRequestStatus:
    device = auth.device()
    state = server_state(request)
    item = solve_requests.parse_solve_input(body.graph, body.device, body.memory_budget, body.runtime_budget,
                                            state.settings.max_graph_nodes, body.training)
    row, queued = solve_requests.enqueue(state.db, item, time_limit=state.settings.solve_time_limit,
                                         max_queued=state.settings.max_queued_solves, now=time.time(),
                                         requested_by=device.id,
                                         max_per_device=state.settings.max_queued_solves_per_device)
    if queued:
        state.solves.wake()
    return _status(row)  # the whole status: a request identical to one already failed says why at once


@router.get("/api/v1/schedule-requests/{request_id}", response_model=ScheduleRequestStatus,
            responses=errors(401, 404, 429), summary="where a schedule request stands")
def schedule_request_status(request_id: str, auth: DeviceAuth, request: Request) -> ScheduleRequestStatus:
    auth.device()
    row = solve_requests.find(server_state(request).db, request_id) if REQUEST_ID.fullmatch(request_id) else None
    if row is None:
        raise HTTPException(404, "no schedule request has this id")
    return _status(row)


@router.delete("/api/v1/schedule-requests/{request_id}", response_model=ScheduleRequestStatus,
               responses=errors(401, 404, 409, 429),
               summary="cancel this device's queued or solving request (409 once finished, or if another device "
                       "asked for it)")
def cancel_schedule_request(request_id: str, auth: DeviceAuth, request: Request) -> ScheduleRequestStatus:
    device = auth.device()
    state = server_state(request)
    if not REQUEST_ID.fullmatch(request_id):
        raise HTTPException(404, "no schedule request has this id")
    row = solve_requests.cancel(state.db, request_id, time.time(), reason=f"device {device.name}",
                                device_id=device.id)
    state.solves.wake()  # a running solve stops now, not at the dispatcher's next look
    audit.record(state.db, "solve.cancel", actor=f"device:{device.name}", target=f"request {request_id}",
                 address=auth.address)
    return _status(row)


def _status(row: SolveRequest) -> ScheduleRequestStatus:
    return ScheduleRequestStatus(request_id=row.id, status=row.status, schedule_id=row.schedule_id, error=row.error,
                                 solve_seconds=row.solve_seconds)


@router.get("/api/v1/schedules/{schedule_id}", response_class=Response,
            responses={200: {"description": "the signed schedule file (poet-edge/schedule)",
                             "content": {"application/json": {"schema": {"type": "object"}}}},
                       **errors(304, 401, 404, 429)},
            summary="download a signed schedule; send its ETag as If-None-Match to skip an unchanged one")
def download_schedule(schedule_id: str, auth: DeviceAuth, request: Request,
                      if_none_match: Annotated[str | None, Header(max_length=4096)] = None) -> Response:
    device = auth.device()
    state = server_state(request)
    document = registry.schedule_document(state.db, schedule_id) if SCHEDULE_ID.fullmatch(schedule_id) else None
    if document is None:
        raise HTTPException(404, "no schedule has this id")
    registry.record_download(state.db, device.id, schedule_id, time.time())
    etag = f'"{schedule_id}"'
    headers = {"ETag": etag, "Cache-Control": "private, no-cache"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    return Response(document, media_type="application/json", headers=headers)


def _matches(if_none_match: str, etag: str) -> bool:
    """RFC 9110 weak comparison: ``*``, or any listed tag equal to ``etag`` with or without ``W/``."""
    tags = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in tags or any(tag.removeprefix("W/") == etag for tag in tags)
