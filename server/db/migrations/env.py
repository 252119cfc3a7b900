"""Alembic environment: migrate the connection :func:`server.db.migrate.upgrade` hands over.

There is no ``alembic.ini``: the server runs the migrations itself at start.
SQLite cannot alter most of a table in place, so operations are rendered in
batch mode (copy, change, rename), which works on PostgreSQL too.
"""

from __future__ import annotations

from alembic import context

from server.db.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run the migrations through server.db.migrate.upgrade(), which passes the connection")

context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  compare_type=True)
with context.begin_transaction():
    context.run_migrations()
