"""The server's data directory and database, opened and migrated: what ``server run`` and the operator commands
share."""

from __future__ import annotations

import os
from pathlib import Path

from server.config import ServerSettings
from server.db.engine import Database, check_reachable
from server.db.migrate import upgrade
from server.errors import DataDirError


def prepare_data_dir(path: Path) -> None:
    """Create the data directory (mode 0700: it holds the private key); refuse one this user cannot write."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DataDirError(f"data directory {path}: cannot create it: {exc.strerror or exc}") from exc
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise DataDirError(f"data directory {path} is not a folder this user can write; pass another --data-dir")


def open_database(settings: ServerSettings) -> Database:
    """The data directory created, the database reached and migrated to the newest schema."""
    prepare_data_dir(settings.data_dir)
    db = Database(settings.database_url)
    check_reachable(db)
    upgrade(db)
    return db
