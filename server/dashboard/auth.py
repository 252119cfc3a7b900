"""Who is signed in: the session cookie, its flags, and the dependencies the dashboard's routes use.

The cookie is ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict``
(other sites' pages do not send it), ``Path=/`` and ``Secure`` when the
request came over HTTPS (directly, or through a proxy that says so with
``X-Forwarded-Proto``, which uvicorn applies).  Pages redirect to the login
page without a session; the JSON endpoint answers 401.
"""

from __future__ import annotations

import re
import time
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request, Response
from starlette.exceptions import HTTPException

from server.api.state import server_state
from server.dashboard.sessions import SESSION_LIFETIME, SignedIn, find_session

SESSION_COOKIE = "poet_session"
LOGIN_CSRF_COOKIE = "poet_login_csrf"
LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.~%?=&+-]*")


def is_https(request: Request) -> bool:
    """Whether the browser reached the server over HTTPS."""
    return request.url.scheme == "https"


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    """Set a cookie with the flags the module docstring lists."""
    response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
                        secure=is_https(request))


def set_session_cookie(response: Response, request: Request, cookie: str) -> None:
    """The session cookie, living as long as the session may."""
    set_cookie(response, request, SESSION_COOKIE, cookie, int(SESSION_LIFETIME))


def clear_session_cookie(response: Response, request: Request) -> None:
    """Tell the browser to forget the session cookie."""
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict", secure=is_https(request))


def signed_in(request: Request) -> SignedIn | None:
    """The request's live session, or ``None``."""
    return find_session(server_state(request).db, request.cookies.get(SESSION_COOKIE), time.time())


def local_path(target: str | None, default: str = "/") -> str:
    """``target`` if it is a path on this server (never another site: no ``//host``), else ``default``."""
    return target if target and LOCAL_PATH.fullmatch(target) else default


def page_operator(request: Request) -> SignedIn:
    """Dependency of the pages: the signed-in operator, or a redirect (303) to the login page."""
    operator = signed_in(request)
    if operator is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        location = "/login" if target == "/" else f"/login?next={quote(local_path(target), safe='/')}"
        raise HTTPException(303, "sign in first", headers={"Location": location})
    return operator


def api_operator(request: Request) -> SignedIn:
    """Dependency of the JSON endpoints: the signed-in operator, or 401."""
    operator = signed_in(request)
    if operator is None:
        raise HTTPException(401, "sign in to the dashboard first")
    return operator


def admin_operator(request: Request) -> SignedIn:
    """Dependency of the pages that change things: a signed-in admin; a viewer gets 403 (and an audit entry)."""
    operator = page_operator(request)
    if not operator.is_admin:
        from server import audit
        from server.api.state import client_address

        audit.record(server_state(request).db, "forbidden", actor=f"operator:{operator.username}",
                     target=f"{request.method} {request.url.path}", detail="viewers only read",
                     address=client_address(request))
        raise HTTPException(403, "viewers only read: ask an admin")
    return operator


PageOperator = Annotated[SignedIn, Depends(page_operator)]
AdminOperator = Annotated[SignedIn, Depends(admin_operator)]
ApiOperator = Annotated[SignedIn, Depends(api_operator)]
