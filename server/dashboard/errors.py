"""Exceptions raised by the dashboard's operator accounts: part of the server's branch (:mod:`server.errors`).

::

    ServerError
    └── OperatorError                  an operator account cannot be made or changed       2 usage
        ├── OperatorExistsError        another operator already has that name              2 usage
        ├── UnknownOperatorError       no operator has that name                           2 usage
        └── PasswordRejectedError      a password too short, too long, or typed twice
                                       differently                                         2 usage

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
