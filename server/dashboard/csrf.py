"""Cross-site request forgery: every dashboard POST must come from the dashboard's own pages.

Two checks, both needed to pass:

* the form's hidden ``csrf_token`` field equals the session's token
  (compared with :func:`hmac.compare_digest`); before login, the login form's
  token is checked against a cookie set with the form (double submit);
* an ``Origin`` header, when the browser sends one, names this server.

The session cookie is also ``SameSite=Strict``, so a browser does not send it
with a request another site starts.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from fastapi import Request
from starlette.exceptions import HTTPException

CSRF_FIELD = "csrf_token"
DEFAULT_PORTS = {"http": 80, "https": 443}


def tokens_match(expected: str | None, sent: str | None) -> bool:
    """Whether a CSRF token sent with a form equals the expected one, compared in constant time."""
    if not expected or not sent:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), sent.encode("utf-8"))


def same_origin(request: Request) -> bool:
    """True unless the request carries an ``Origin`` header naming another site (or ``null``)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    own = request.url
    return (parts.scheme == own.scheme and parts.hostname == own.hostname
            and (parts.port or DEFAULT_PORTS[parts.scheme]) == (own.port or DEFAULT_PORTS[own.scheme]))


def check_form(request: Request, expected: str | None, sent: str | None) -> None:
    """Raise 403 unless the form's token matches ``expected`` and the request is same-origin."""
    if not same_origin(request):
        raise HTTPException(403, "cross-site request refused: the Origin header names another site")
    if not tokens_match(expected, sent):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page and try again")
