"""Device authentication: ``Authorization: Bearer <device token>``, with failed attempts rate limited."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.api.state import client_address, server_state
from server.devices import DeviceIdentity, authenticate
from server.errors import AuthenticationError, RateLimitedError

bearer = HTTPBearer(auto_error=False, scheme_name="device token",
                    description="the device token returned by POST /api/v1/enrol")


def current_device(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> DeviceIdentity:
    """The device a request comes from.

    Raises
    ------
    RateLimitedError
        This address failed authentication too often within the last minute (checked first, so a guesser
        learns nothing more, right or wrong).
    AuthenticationError
        No token, or an unknown or revoked one (counted as a failure of this address).
    """
    state = server_state(request)
    address = client_address(request)
    wait = state.auth_failures.retry_after(address)
    if wait is not None:
        raise RateLimitedError(f"too many failed authentications from this address; retry in {wait:.0f} s", wait)
    try:
        return authenticate(state.db, credentials.credentials if credentials is not None else "")
    except AuthenticationError:
        state.auth_failures.hit(address)
        raise


Device = Annotated[DeviceIdentity, Depends(current_device)]
