"""Dashboard sessions: a random cookie per login, stored only as its SHA-256, with a CSRF token and an expiry.

The cookie is a 256-bit random token (:mod:`server.tokens`); the database keeps
its hash, so a copy of the database cannot be used to sign in.  A session ends
at ``expires_at`` (a fixed lifetime from login), after ``idle`` seconds without
a request, at logout, or when the operator's password changes.  ``last_used``
is written at most once a minute, so the fleet page's polling does not turn
every read into a write.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import delete, select, update

from server.db.engine import Database
from server.db.models import Operator, OperatorSession
from server.tokens import MAX_TOKEN_LENGTH, hashes_match, new_token, token_hash

SESSION_LIFETIME = 12 * 3600.0
SESSION_IDLE = 2 * 3600.0
TOUCH_EVERY = 60.0


@dataclass(frozen=True)
class SignedIn:
    """The operator a request's session belongs to, and the session's CSRF token."""

    session_id: int
    operator_id: int
    username: str
    csrf_token: str
    role: str = "admin"

    @property
    def is_admin(self) -> bool:
        """Whether this operator may change things (a viewer only reads)."""
        return self.role == "admin"


def start_session(db: Database, operator_id: int, now: float) -> str:
    """A new session for the operator; returns the cookie value (shown once, never stored)."""
    cookie = new_token()
    with db.write() as session:
        session.execute(delete(OperatorSession).where(OperatorSession.expires_at <= now))  # sweep the expired
        session.add(OperatorSession(token_hash=token_hash(cookie), operator_id=operator_id,
                                    csrf_token=secrets.token_urlsafe(32), created_at=now,
                                    expires_at=now + SESSION_LIFETIME, last_used=now))
    return cookie


def find_session(db: Database, cookie: str | None, now: float) -> SignedIn | None:
    """The live session the cookie names, or ``None`` (no cookie, unknown, expired or idle too long)."""
    if not cookie or len(cookie) > MAX_TOKEN_LENGTH:
        return None
    with db.read() as session:
        row = session.execute(select(OperatorSession, Operator.username, Operator.role).join(Operator)
                              .where(OperatorSession.token_hash == token_hash(cookie))).first()
    if row is None or not hashes_match(row[0].token_hash, cookie):
        return None
    found, username, role = row
    if found.expires_at <= now or found.last_used + SESSION_IDLE <= now:
        return None
    if now - found.last_used >= TOUCH_EVERY:
        with db.write() as session:
            session.execute(update(OperatorSession).where(OperatorSession.id == found.id).values(last_used=now))
    return SignedIn(found.id, found.operator_id, username, found.csrf_token, role)


def end_session(db: Database, session_id: int) -> None:
    """Delete the session: its cookie is refused from now on."""
    with db.write() as session:
        session.execute(delete(OperatorSession).where(OperatorSession.id == session_id))
