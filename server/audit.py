"""The audit log: every enrolment, revocation, sign-in, refusal and operator action, in the database and the
journal.

Each entry says who (``operator:alice``, ``device:pi-17``, ``cli:root`` for a server command run by that
system user, ``anonymous``), did what (:data:`ACTIONS`), to what, with what detail, from which address.  The
dashboard's audit page shows the newest; the journal gets one ``audit:`` line per entry, so a log shipper sees
them too.  Texts are cut to their columns' sizes: a hostile name cannot grow an entry.
"""

from __future__ import annotations

import getpass
import logging
import time
from dataclasses import dataclass

from sqlalchemy import select

from server.db.engine import Database
from server.db.models import AuditEntry

log = logging.getLogger("poet-server")

ACTIONS = (
    "device.enrol", "device.enrol-refused", "device.revoke",
    "token.create", "token.revoke", "solve.cancel",
    "operator.add", "operator.remove", "operator.passwd",
    "login", "login-failed", "rate-limited", "forbidden",
)


def cli_actor() -> str:
    """The actor of a ``poet-edge server`` command: the system user that ran it."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a container)
        return "cli:unknown"


def record(db: Database, action: str, *, actor: str, target: str = "", detail: str = "",
           address: str | None = None, now: float | None = None) -> None:
    """Add one entry to the log and the journal."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    entry = AuditEntry(at=time.time() if now is None else now, actor=actor[:100], action=action,
                       target=target[:200], detail=detail[:500], address=address[:64] if address else None)
    with db.write() as session:
        session.add(entry)
    log.info("audit: %s %s %s%s%s", entry.actor, action, entry.target or "-",
             f" ({entry.detail})" if entry.detail else "", f" from {address}" if address else "")


def recent(db: Database, limit: int = 200) -> list[AuditEntry]:
    """The newest ``limit`` entries, newest first."""
    return search(db, AuditQuery(), limit).entries


PAGE_SIZE = 100  # entries a page of the audit log shows


@dataclass(frozen=True)
class AuditQuery:
    """Which entries to show: by actor (a part of it: ``operator:``, ``pi-17``), action (one of :data:`ACTIONS`),
    time (``since`` / ``until``, Unix seconds) and page (``before``: the entries older than this entry id)."""

    actor: str = ""
    action: str = ""
    since: float | None = None
    until: float | None = None
    before: int | None = None


@dataclass(frozen=True)
class AuditPage:
    """One page of entries, newest first, and the id to ask ``before`` for the next older page (None: none)."""

    entries: list[AuditEntry]
    older: int | None


def search(db: Database, query: AuditQuery, limit: int = PAGE_SIZE) -> AuditPage:
    """The newest ``limit`` entries ``query`` selects, found in the database (by id, so a page never shifts as
    new entries arrive)."""
    statement = select(AuditEntry)
    if query.actor:  # % and _ are characters here, as in the fleet's search
        statement = statement.where(AuditEntry.actor.icontains(query.actor, autoescape=True))
    if query.action:
        statement = statement.where(AuditEntry.action == query.action)
    if query.since is not None:
        statement = statement.where(AuditEntry.at >= query.since)
    if query.until is not None:
        statement = statement.where(AuditEntry.at < query.until)
    if query.before is not None:
        statement = statement.where(AuditEntry.id < query.before)
    with db.read() as session:
        rows = list(session.scalars(statement.order_by(AuditEntry.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    return AuditPage(rows[:limit], rows[limit - 1].id if more else None)
