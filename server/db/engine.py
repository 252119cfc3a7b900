"""The database connection: one SQLAlchemy engine and the sessions the server works in.

SQLite (the embedded default) gets write-ahead logging, so readers never wait
for the writer; foreign keys on; a busy timeout, so a writer waits for the
lock instead of failing.  Its transactions are begun by us, not by the
driver: :meth:`Database.write` begins ``IMMEDIATE`` (takes the write lock up
front, so two writers queue instead of one of them failing half way when it
upgrades a read to a write), :meth:`Database.read` a plain deferred ``BEGIN``;
one process's writers take turns on a lock of their own before that.
Other databases (PostgreSQL) use the driver's own transactions.

Several server processes may migrate one PostgreSQL database at the same
start; :func:`lock_for_migration` makes them take turns, so the first
migrates and the others find the schema current.
"""

from __future__ import annotations

import contextlib
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from server.errors import DatabaseError

SQLITE_BUSY_TIMEOUT_MS = 10_000
_BEGIN_OPTION = "poet_sqlite_begin"
# Connections a server process keeps open to a database server, and opens beyond that at a busy moment (closed
# again when given back).  Each request's worker thread holds one at a time, and a new connection costs the
# database server a process and an authentication: the pool keeps enough for the usual concurrency.
POOL_SIZE = 20
POOL_OVERFLOW = 20
MIGRATION_LOCK_KEY = 0x706F6574_6D696772  # "poetmigr": the PostgreSQL advisory lock the migrations hold


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite set up as the module docstring says."""
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30})
            _configure_sqlite(engine)
            return engine
        return create_engine(parsed, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)
    except (ArgumentError, ImportError, ValueError) as exc:
        raise DatabaseError(f"cannot use database {url!r}: {exc}") from exc


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver begins nothing; on_begin does
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable at checkpoints, never corrupt
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


class Database:
    """The engine and two kinds of session: :meth:`read` and :meth:`write` (commits when the block ends)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.writer = self.engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        """The engine for writing: on SQLite its transactions take the write lock when they begin."""
        self.lookups = self.engine if self.is_sqlite else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        """The engine for single-statement reads on the hot path (a device's token, its schedule): on a database
        server without a transaction, so without the round trips of its ``BEGIN`` and ``ROLLBACK``."""
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(self.writer, expire_on_commit=False)
        # SQLite has one writer at a time, and a connection that finds the write lock taken polls for it,
        # sleeping 1, 2, 5, 10, ... ms between tries: this process's writers queue here instead and each
        # starts the moment the last one commits.  Other processes on the file still poll.
        self._writers = threading.Lock() if self.is_sqlite else contextlib.nullcontext()

    @property
    def is_sqlite(self) -> bool:
        """True for the embedded SQLite database."""
        return self.engine.dialect.name == "sqlite"

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading; rolled back at the end."""
        with self._read() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session that commits when the block ends without an exception, and rolls back otherwise."""
        with self._writers, self._write() as session, session.begin():
            yield session

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()


def lock_for_migration(connection: Connection) -> None:
    """Wait until no other process migrates this database; held until ``connection``'s transaction ends.

    PostgreSQL: a transaction-scoped advisory lock.  SQLite needs none: the
    migration's ``BEGIN IMMEDIATE`` transaction already holds the write lock.
    """
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")


def check_reachable(database: Database) -> None:
    """Open one connection, or raise :class:`DatabaseError` saying why not."""
    try:
        with database.engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except SQLAlchemyError as exc:
        raise DatabaseError(f"cannot open database {database.engine.url.render_as_string(hide_password=True)}: "
                            f"{exc.orig if getattr(exc, 'orig', None) else exc}") from exc
