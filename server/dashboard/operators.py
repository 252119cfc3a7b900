"""Operator accounts: usernames with argon2 password hashes, made and changed by ``poet-edge server operator``.

Passwords are hashed with argon2id (``argon2-cffi``'s :class:`PasswordHasher`,
its default parameters), so a copy of the database makes each guess costly.
A login for an unknown name still runs one verification against a dummy hash,
so the answer's timing does not tell which names exist.  Changing a password
ends the operator's sessions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from server.db.engine import Database
from server.db.models import OPERATOR_NAME_LENGTH, Operator, OperatorSession
from server.dashboard.errors import OperatorExistsError, PasswordRejectedError, UnknownOperatorError

OPERATOR_NAME_PATTERN = rf"^[A-Za-z0-9._@-]{{1,{OPERATOR_NAME_LENGTH}}}$"
MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024  # a longer one is refused before hashing: hashing it would cost the server, not a guesser

_hasher = PasswordHasher()
_DUMMY_HASH = _hasher.hash("not a password anyone has")


@dataclass(frozen=True)
class OperatorInfo:
    """An operator as the dashboard and ``operator list`` show one."""

    id: int
    username: str
    created_at: float
    role: str = "admin"


ROLES = ("admin", "viewer")  # admin: everything; viewer: reads every page, changes nothing


def check_operator_name(name: str) -> str:
    """``name`` if it is 1-64 characters of ``A-Z a-z 0-9 . _ @ -``; :class:`UnknownOperatorError` otherwise."""
    if not re.fullmatch(OPERATOR_NAME_PATTERN, name):
        raise UnknownOperatorError(f"{name!r} is not an operator name (1-{OPERATOR_NAME_LENGTH} characters of "
                                   "A-Z a-z 0-9 . _ @ -)")
    return name


def check_password(password: str) -> str:
    """``password`` if its length is acceptable; :class:`PasswordRejectedError` otherwise."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise PasswordRejectedError(f"the password is too short: use at least {MIN_PASSWORD_LENGTH} characters")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise PasswordRejectedError(f"the password is too long: use at most {MAX_PASSWORD_LENGTH} characters")
    return password


def add_operator(db: Database, username: str, password: str, now: float, role: str = "admin") -> OperatorInfo:
    """Create an operator account with ``role`` (:data:`ROLES`).

    Raises
    ------
    OperatorExistsError
        The name is taken.
    PasswordRejectedError, UnknownOperatorError
        The password or the name is not acceptable.
    """
    check_operator_name(username)
    if role not in ROLES:
        raise UnknownOperatorError(f"role {role!r} is not one of {', '.join(ROLES)}")
    password_hash = _hasher.hash(check_password(password))
    try:
        with db.write() as session:
            if session.scalar(select(Operator.id).where(Operator.username == username)) is not None:
                raise OperatorExistsError(f"an operator named {username!r} exists already; change its password with "
                                          "`poet-edge server operator passwd`")
            row = Operator(username=username, password_hash=password_hash, created_at=now, role=role)
            session.add(row)
            session.flush()
            return OperatorInfo(row.id, row.username, row.created_at, row.role)
    except IntegrityError as exc:  # created by a concurrent command
        raise OperatorExistsError(f"an operator named {username!r} exists already") from exc


def set_password(db: Database, username: str, password: str) -> None:
    """Set an operator's password; the operator's sessions end (every browser signs in again).

    Raises
    ------
    UnknownOperatorError
        No operator has that name.
    """
    password_hash = _hasher.hash(check_password(password))
    with db.write() as session:
        row = session.scalar(select(Operator).where(Operator.username == check_operator_name(username)))
        if row is None:
            raise UnknownOperatorError(f"no operator is named {username!r}; add one with `poet-edge server operator "
                                       "add`")
        row.password_hash = password_hash
        session.execute(delete(OperatorSession).where(OperatorSession.operator_id == row.id))


def remove_operator(db: Database, username: str) -> None:
    """Delete an operator; its sessions end at once.

    Raises
    ------
    UnknownOperatorError
        No operator has that name.
    """
    with db.write() as session:
        row = session.scalar(select(Operator).where(Operator.username == check_operator_name(username)))
        if row is None:
            raise UnknownOperatorError(f"no operator is named {username!r} (poet-edge server operator list)")
        session.execute(delete(OperatorSession).where(OperatorSession.operator_id == row.id))
        session.delete(row)


def list_operators(db: Database) -> list[OperatorInfo]:
    """Every operator, by name."""
    with db.read() as session:
        rows = session.execute(select(Operator.id, Operator.username, Operator.created_at, Operator.role)
                               .order_by(Operator.username)).all()
    return [OperatorInfo(*row) for row in rows]


def verify_login(db: Database, username: str, password: str) -> OperatorInfo | None:
    """The operator if ``password`` is theirs, else ``None`` (the same work either way)."""
    row = None
    if re.fullmatch(OPERATOR_NAME_PATTERN, username) and len(password) <= MAX_PASSWORD_LENGTH:
        with db.read() as session:
            row = session.scalar(select(Operator).where(Operator.username == username))
    try:
        _hasher.verify(row.password_hash if row is not None else _DUMMY_HASH, password[:MAX_PASSWORD_LENGTH])
    except (VerificationError, InvalidHashError):
        return None
    if row is None:
        return None
    if _hasher.check_needs_rehash(row.password_hash):  # parameters grew since it was hashed
        _rehash(db, row.id, password)
    return OperatorInfo(row.id, row.username, row.created_at, row.role)


def _rehash(db: Database, operator_id: int, password: str) -> None:
    with db.write() as session:
        row = session.get(Operator, operator_id)
        if row is not None:
            row.password_hash = _hasher.hash(password)
