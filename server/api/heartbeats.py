"""``POST /api/v1/heartbeats``: a device pushes its status (one heartbeat, or a queue of them at once)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from server import devices
from server.api.auth import DeviceAuth
from server.api.responses import errors
from server.api.schemas import HeartbeatBody
from server.api.state import server_state

router = APIRouter()


@router.post("/api/v1/heartbeats", status_code=204, response_class=Response, responses=errors(401, 429),
             tags=["devices"], summary="store the device's status (an object, or a list of at most 500)")
def post_heartbeats(body: HeartbeatBody, auth: DeviceAuth, request: Request) -> Response:
    device = auth.device()
    state = server_state(request)
    beats = body if isinstance(body, list) else [body]
    payloads = [beat.model_dump(mode="json", exclude_unset=True) for beat in beats]
    devices.record_heartbeats(state.db, device.id, payloads, time.time(), state.settings.heartbeat_history)
    state.metrics.heartbeats.inc(len(payloads))
    return Response(status_code=204)
