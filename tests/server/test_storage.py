"""Storage: migrations build the schema the models describe, SQLite is set up, a restart keeps everything."""

from __future__ import annotations

import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from server.api import create_app
from server.config import ServerSettings
from server.datadir import open_database
from server.db.migrate import current_revision, upgrade
from server.db.models import Base
from server.errors import DatabaseError, DataDirError
from common.exit_codes import ExitCode, exit_code_for
from tests.server.conftest import enrol, heartbeat, schedule_request, wait_for_solve


def test_migrations_on_an_empty_database_build_exactly_the_models_schema(settings) -> None:
    assert not settings.data_dir.exists()
    db = open_database(settings)
    assert current_revision(db) == "0010"
    assert set(inspect(db.engine).get_table_names()) == {*Base.metadata.tables, "alembic_version"}
    with db.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}),
                                       Base.metadata)
    assert differences == []
    assert upgrade(db) == "0010"  # running again at the next start changes nothing


def test_sqlite_runs_with_wal_foreign_keys_and_a_busy_timeout(settings) -> None:
    db = open_database(settings)
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    assert (settings.data_dir / "server.db").exists()


def test_a_database_from_a_newer_server_is_refused_with_a_clear_error(settings) -> None:
    open_database(settings).dispose()
    with sqlite3.connect(settings.data_dir / "server.db") as raw:
        raw.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(DatabaseError, match="newer poet-edge server") as caught:
        open_database(settings)
    assert exit_code_for(caught.value) == ExitCode.BAD_FILE


def test_a_data_dir_that_cannot_be_made_is_a_clear_error(tmp_path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(DataDirError, match="cannot create"):
        create_app(ServerSettings(data_dir=tmp_path / "file" / "server"))


def test_a_restarted_server_keeps_its_key_devices_and_schedules(settings) -> None:
    with TestClient(create_app(settings)) as first:
        key = first.get("/api/v1/server-key").json()
        device = enrol(first)
        assert first.post("/api/v1/heartbeats", json=heartbeat(steps_done=7), headers=device.headers).status_code == 204
        request_id = first.post("/api/v1/schedule-requests", json=schedule_request(),
                                headers=device.headers).json()["request_id"]
        status = wait_for_solve(first, request_id, device.headers)
        document = first.get(f"/api/v1/schedules/{status['schedule_id']}", headers=device.headers).content
    assert (settings.data_dir / "keys" / "server-signing.key").stat().st_mode & 0o077 == 0
    second = TestClient(create_app(settings))
    assert second.get("/api/v1/server-key").json() == key
    assert second.get(f"/api/v1/schedule-requests/{request_id}", headers=device.headers).json() == status
    assert second.get(f"/api/v1/schedules/{status['schedule_id']}", headers=device.headers).content == document
    again = second.post("/api/v1/schedule-requests", json=schedule_request(), headers=device.headers).json()
    assert again == status  # the same request, the same whole status


def test_a_devices_waiting_requests_are_counted_from_the_index_not_a_scan(settings) -> None:
    from sqlalchemy import func, select

    from server.db.models import SolveRequest
    from server.solve_requests import QUEUED, SOLVING

    db = open_database(settings)
    cap = select(func.count()).select_from(SolveRequest).where(
        SolveRequest.status.in_((QUEUED, SOLVING)), SolveRequest.requested_by == 7)  # the cap's query
    with db.engine.connect() as connection:
        sql = str(cap.compile(connection, compile_kwargs={"literal_binds": True}))
        plan = " ".join(str(row[-1]) for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        cleared = " ".join(str(row[-1]) for row in connection.exec_driver_sql(
            "EXPLAIN QUERY PLAN UPDATE solve_requests SET requested_by = NULL WHERE requested_by = 7"))  # a removal
    assert "ix_solve_requests_requested_by_status" in plan, plan
    assert "ix_solve_requests_requested_by_status" in cleared, cleared
