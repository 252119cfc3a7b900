"""``POST /api/v1/enrol``: a device exchanges a single-use enrolment token for its own device token."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from server import audit, devices
from server.api.responses import errors
from server.api.schemas import EnrolRequest, EnrolResponse
from server.api.state import client_address, server_state
from server.errors import DeviceNameTakenError, EnrolmentRefusedError, RateLimitedError

router = APIRouter()


@router.post("/api/v1/enrol", status_code=201, response_model=EnrolResponse, responses=errors(401, 409, 429),
             tags=["devices"], summary="exchange an enrolment token for a device token")
def enrol(body: EnrolRequest, request: Request) -> EnrolResponse:
    state = server_state(request)
    address = client_address(request)
    wait = state.enrol_attempts.hit(address)
    if wait is not None:
        if state.enrol_attempts.first_refusal(address):
            audit.record(state.db, "rate-limited", actor="anonymous", target="enrolment", address=address)
        raise RateLimitedError(f"too many enrolment attempts from this address; retry in {wait:.0f} s", wait)
    try:
        enrolment = devices.enrol(state.db, body.enrolment_token, body.device_name, time.time())
    except (EnrolmentRefusedError, DeviceNameTakenError) as exc:
        audit.record(state.db, "device.enrol-refused", actor="anonymous", target=body.device_name, detail=str(exc),
                     address=address)
        raise
    audit.record(state.db, "device.enrol", actor=f"device:{enrolment.device_name}", target=enrolment.device_name,
                 address=address)
    return EnrolResponse(device_name=enrolment.device_name, device_token=enrolment.device_token,
                         server_public_key=state.key.public_pem, key_id=state.key.key_id)
