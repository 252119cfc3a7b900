"""Exceptions raised by the fleet server: a branch of POET Edge's one tree (:mod:`schedules.errors`).

The whole tree, every package's branch with each class's exit code and HTTP status, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

``http_status`` is what :mod:`server.api` answers for the error; the message
is the response's ``detail`` (it says what to do next and never holds a
secret).  OS and SQLAlchemy errors are converted where they enter
(``raise DatabaseError(...) from exc``).
"""

from __future__ import annotations

from typing import ClassVar

from common.errors import PoetEdgeError
from common.exit_codes import ExitCode


class ServerError(PoetEdgeError):
    """Base class of every error raised by ``server``."""

    http_status: ClassVar[int] = 500


class ServerConfigError(ServerError):
    """A server setting is out of range or inconsistent; the message lists every problem."""


class ServerStartError(ServerError):
    """The server cannot listen on the host and port it was given."""


class ModelVersionError(ServerError):
    """A stored global model version is missing, its weights file changed, or its row not signed by this server."""

    exit_code = ExitCode.BAD_FILE


class DataDirError(ServerError):
    """The server's data directory cannot be created, or is not writable by this user."""

    exit_code = ExitCode.BAD_FILE


class DatabaseError(ServerError):
    """The database cannot be opened, migrated, or holds a schema newer than this release."""

    exit_code = ExitCode.BAD_FILE


class ServerKeyError(ServerError):
    """The server's Ed25519 signing key cannot be read or created in the data directory."""

    exit_code = ExitCode.BAD_FILE


class UnknownDeviceError(ServerError):
    """No enrolled device has the name given."""

    http_status = 404


class UnknownTokenError(ServerError):
    """No unused enrolment token has the id given."""

    http_status = 404


class DeviceNameTakenError(ServerError):
    """Another enrolled device already has the name a device asked for."""

    http_status = 409


class EnrolmentRefusedError(ServerError):
    """An enrolment token is wrong, already used or expired (one message for all three: no oracle)."""

    exit_code = ExitCode.REJECTED
    http_status = 401


class AuthenticationError(ServerError):
    """A device request carries no device token, an unknown one, or a revoked device's."""

    exit_code = ExitCode.REJECTED
    http_status = 401


class RateLimitedError(ServerError):
    """Too many attempts from one client address within the window.

    Attributes
    ----------
    retry_after:
        Seconds until the next attempt is allowed (the ``Retry-After`` header).
    """

    exit_code = ExitCode.REJECTED
    http_status = 429

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RequestRejectedError(ServerError):
    """A request's content cannot be used: a graph or device profile that does not load, a graph too large."""

    exit_code = ExitCode.BAD_FILE
    http_status = 422


class SolveQueueFullError(ServerError):
    """The solve queue is full; the device should ask again later (``retry_after`` seconds: about a solve)."""

    exit_code = ExitCode.SOLVER_FAILED
    http_status = 503
    retry_after = 10.0


class SolveQuotaError(ServerError):
    """This device has as many schedule requests waiting as it may; the others' requests are not held back
    (``retry_after`` seconds: about one of its solves)."""

    exit_code = ExitCode.REJECTED
    http_status = 429
    retry_after = 10.0


class UnknownSolveRequestError(ServerError):
    """No schedule request has this id."""

    http_status = 404


class SolveCancelRefusedError(ServerError):
    """This schedule request cannot be cancelled: it is finished, or another device asked for it."""

    exit_code = ExitCode.REJECTED
    http_status = 409


class FlowerError(ServerError):
    """The Flower SuperLink cannot be started (binary or TLS files missing, never healthy) or cannot be asked."""


class SuperNodeRegistrationError(FlowerError):
    """A SuperNode's public key is not registered: not an ECDSA P-384 OpenSSH key, in use already, or refused."""

    exit_code = ExitCode.REJECTED
