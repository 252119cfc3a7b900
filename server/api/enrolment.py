"""``POST /api/v1/enrol``: a device exchanges a single-use enrolment token for its own device token."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from server import devices
from server.api.responses import errors
from server.api.schemas import EnrolRequest, EnrolResponse
from server.api.state import client_address, server_state
from server.errors import RateLimitedError

router = APIRouter()


@router.post("/api/v1/enrol", status_code=201, response_model=EnrolResponse, responses=errors(401, 409, 429),
             tags=["devices"], summary="exchange an enrolment token for a device token")
def enrol(body: EnrolRequest, request: Request) -> EnrolResponse:
    state = server_state(request)
    wait = state.enrol_attempts.hit(client_address(request))
    if wait is not None:
        raise RateLimitedError(f"too many enrolment attempts from this address; retry in {wait:.0f} s", wait)
    enrolment = devices.enrol(state.db, body.enrolment_token, body.device_name, time.time())
    return EnrolResponse(device_name=enrolment.device_name, device_token=enrolment.device_token,
                         server_public_key=state.key.public_pem, key_id=state.key.key_id)
