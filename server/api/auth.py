"""Device authentication: ``Authorization: Bearer <device token>``, with failed attempts rate limited."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server import audit
from server.api.state import client_address, server_state
from server.devices import DeviceIdentity, authenticate
from server.errors import AuthenticationError, RateLimitedError

bearer = HTTPBearer(auto_error=False, scheme_name="device token",
                    description="the device token returned by POST /api/v1/enrol")


def current_device(request: Request,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> DeviceIdentity:
    """The device a request comes from.

    Failures are counted per address, but a valid token is never refused for them: devices behind one NAT
    share an address, and one of them (or a guesser there) failing must not lock out the rest.  A token is
    256 random bits, so the limit brakes guessing, never a device that holds its token.

    Raises
    ------
    RateLimitedError
        This address failed authentication too often within the last minute and this token fails too.
    AuthenticationError
        No token, or an unknown or revoked one (counted as a failure of this address).
    """
    state = server_state(request)
    address = client_address(request)
    try:
        return authenticate(state.db, credentials.credentials if credentials is not None else "")
    except AuthenticationError:
        wait = state.auth_failures.hit(address)
        if wait is not None:
            if state.auth_failures.first_refusal(address):
                audit.record(state.db, "rate-limited", actor="anonymous", target="device authentication",
                             address=address)
            raise RateLimitedError(f"too many failed authentications from this address; retry in {wait:.0f} s",
                                   wait) from None
        raise


Device = Annotated[DeviceIdentity, Depends(current_device)]
