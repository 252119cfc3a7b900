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
    with db.read() as session:
        return list(session.scalars(select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)))
