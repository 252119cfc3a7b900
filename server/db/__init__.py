"""The server's storage: SQLAlchemy 2 models, the engine and its sessions, Alembic migrations run at start.

SQLite (write-ahead logging) is the embedded default; any SQLAlchemy URL
(PostgreSQL for fleets that outgrow one machine) works the same way.
"""

from __future__ import annotations

from server.db.engine import Database
from server.db.migrate import upgrade

__all__ = ["Database", "upgrade"]
