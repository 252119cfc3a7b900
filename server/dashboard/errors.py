"""Exceptions raised by the dashboard's operator accounts: part of the server's branch (:mod:`server.errors`).

The whole tree, every package's branch with each class's exit code and HTTP status, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

Failed logins are not errors: the login page answers them (and counts them
against the address's rate limit).
"""

from __future__ import annotations

from server.errors import ServerError


class OperatorError(ServerError):
    """Base class of the operator-account errors."""


class OperatorExistsError(OperatorError):
    """Another operator already has the name given."""

    http_status = 409


class UnknownOperatorError(OperatorError):
    """No operator has the name given (or it is not a valid operator name)."""

    http_status = 404


class PasswordRejectedError(OperatorError):
    """A new password is too short or too long, or its two typings differ."""

    http_status = 422
