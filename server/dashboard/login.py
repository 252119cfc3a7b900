"""``/login`` and ``/logout``: password sign-in (rate limited per address), session start and end."""

from __future__ import annotations

import math
import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from server import audit
from server.api.state import client_address, server_state
from server.dashboard import csrf
from server.dashboard.auth import (LOGIN_CSRF_COOKIE, PageOperator, clear_session_cookie, local_path, set_cookie,
                                   set_session_cookie, signed_in)
from server.dashboard.operators import verify_login
from server.dashboard.render import render
from server.dashboard.sessions import end_session, start_session
from server.dashboard.state import dashboard_state

router = APIRouter(include_in_schema=False)
LOGIN_FORM_LIFETIME = 3600
FormText = Annotated[str, Form(max_length=1024)]


@router.get("/login")
def login_page(request: Request, next: str = "/") -> Response:
    """The sign-in form (or, when signed in already, where ``next`` points)."""
    if signed_in(request) is not None:
        return RedirectResponse(local_path(next), status_code=303)
    return _form(request, next)


def _form(request: Request, next: str, *, error: str | None = None, status: int = 200,
          headers: dict[str, str] | None = None) -> Response:
    token = secrets.token_urlsafe(32)
    response = render(request, "login.html", None, status=status, headers=headers, login_token=token,
                      next=local_path(next), error=error)
    set_cookie(response, request, LOGIN_CSRF_COOKIE, token, LOGIN_FORM_LIFETIME)
    return response


@router.post("/login")
def login(request: Request, username: FormText = "", password: FormText = "", csrf_token: FormText = "",
          next: FormText = "/") -> Response:
    """Check the password; on success start a session and go to ``next``."""
    csrf.check_form(request, request.cookies.get(LOGIN_CSRF_COOKIE), csrf_token)
    dashboard = dashboard_state(request)
    # counted per address and account: a guesser at one account behind a NAT does not lock out another
    # operator at the same address; per account alone, at a higher limit, guessing from many addresses; per
    # address alone, at a higher limit too, guessing at many names from one (while limited, no password is
    # hashed: argon2's cost is spent on attempts that may succeed)
    address = client_address(request)
    counts = ((dashboard.login_failures, f"{address}|{username}"), (dashboard.account_failures, username),
              (dashboard.address_failures, address))
    wait = max((w for limiter, key in counts if (w := limiter.retry_after(key)) is not None), default=None)
    if wait is not None:
        # one audit row per run of refusals, for the address whatever names it tries
        if dashboard.address_failures.first_refusal(address):
            audit.record(server_state(request).db, "rate-limited", actor="anonymous", target=f"sign-in {username}",
                         address=client_address(request))
        return _form(request, next, error=f"Too many failed sign-ins from this address; try again in "
                                          f"{math.ceil(wait)} s.", status=429,
                     headers={"Retry-After": str(max(1, math.ceil(wait)))})
    state = server_state(request)
    operator = verify_login(state.db, username, password)
    if operator is None:
        for limiter, key in counts:
            limiter.hit(key)
        audit.record(state.db, "login-failed", actor="anonymous", target=username, address=client_address(request))
        return _form(request, next, error="Wrong username or password.", status=401)
    audit.record(state.db, "login", actor=f"operator:{operator.username}", target=operator.username,
                 address=client_address(request))
    response = RedirectResponse(local_path(next), status_code=303)
    set_session_cookie(response, request, start_session(state.db, operator.id, time.time()))
    set_cookie(response, request, LOGIN_CSRF_COOKIE, "", 0)  # the login form's token is spent
    return response


@router.post("/logout")
def logout(request: Request, operator: PageOperator, csrf_token: FormText = "") -> Response:
    """End the session: its cookie is refused from now on."""
    csrf.check_form(request, operator.csrf_token, csrf_token)
    end_session(server_state(request).db, operator.session_id)
    response = RedirectResponse("/login", status_code=303)
    clear_session_cookie(response, request)
    return response
