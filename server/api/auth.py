"""Device authentication: ``Authorization: Bearer <device token>``, with failed attempts rate limited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server import audit
from server.api.state import ServerState, client_address, server_state
from server.devices import DeviceIdentity, authenticate
from server.errors import AuthenticationError, RateLimitedError

bearer = HTTPBearer(auto_error=False, scheme_name="device token",
                    description="the device token returned by POST /api/v1/enrol")


_SCOPE_KEY = "poet.device_credentials"


@dataclass(frozen=True)
class DeviceCredentials:
    """A request's device token and address; :meth:`device` checks them.

    The check is the handler's first call, in the handler's worker thread: a dependency doing the lookup
    would be run in a worker thread of its own, and that second hop costs as much CPU as the lookup.
    """

    token: str
    address: str
    state: ServerState

    def device(self) -> DeviceIdentity:
        """The device the request comes from.

        Failures are counted per address, but a valid token is never refused for them: devices behind one
        NAT share an address, and one of them (or a guesser there) failing must not lock out the rest.  A
        token is 256 random bits, so the limit brakes guessing, never a device that holds its token.

        Raises
        ------
        RateLimitedError
            This address failed authentication too often within the last minute and this token fails too.
        AuthenticationError
            No token, or an unknown or revoked one (counted as a failure of this address).
        """
        try:
            return authenticate(self.state.db, self.token)
        except AuthenticationError:
            wait = self.state.auth_failures.hit(self.address)
            if wait is not None:
                if self.state.auth_failures.first_refusal(self.address):
                    audit.record(self.state.db, "rate-limited", actor="anonymous", target="device authentication",
                                 address=self.address)
                raise RateLimitedError(f"too many failed authentications from this address; retry in {wait:.0f} s",
                                       wait) from None
            raise


async def device_credentials(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None,
                                                                      Depends(bearer)]) -> DeviceCredentials:
    """The request's device credentials, unchecked (``async``: taken in the event loop, no thread)."""
    taken = DeviceCredentials(credentials.credentials if credentials is not None else "", client_address(request),
                              server_state(request))
    request.scope[_SCOPE_KEY] = taken
    return taken


def unchecked_credentials(request: Request) -> DeviceCredentials | None:
    """The credentials :func:`device_credentials` took for this request, if it is a device endpoint's.

    A request whose body or parameters fail validation never reaches its handler: the validation error's
    handler checks these first, so an unknown token is answered 401 (and counted) whatever the body.
    """
    return request.scope.get(_SCOPE_KEY)


DeviceAuth = Annotated[DeviceCredentials, Depends(device_credentials)]
"""A device endpoint's credentials: the handler calls ``.device()`` before anything else."""
