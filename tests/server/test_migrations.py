"""Migrations: a database made by the previous release (schema 0001, with data in it) is brought to head intact."""

from __future__ import annotations

import json
import time

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from server.api import create_app
from server.datadir import open_database, prepare_data_dir
from server.db.engine import Database
from server.db.migrate import alembic_config, current_revision
from server.db.models import Base
from server.tokens import new_token, token_hash
from tests.server.conftest import add_operator, heartbeat, log_in


def database_at_0001(settings) -> tuple[Database, str]:
    """A database migrated only to 0001, holding a device, heartbeats, a schedule and its request; the device token."""
    prepare_data_dir(settings.data_dir)
    db = Database(settings.database_url)
    config = alembic_config(db)
    with db.writer.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0001")
    device_token, now = new_token(), time.time()
    beat = heartbeat(steps_done=42, energy_j=9.5)
    with db.writer.begin() as connection:
        connection.execute(text("INSERT INTO devices (id, name, token_hash, enrolled_at, last_seen, last_sent_at, "
                                "last_heartbeat, state, steps_done, energy_j) VALUES (1, 'pi-1', :hash, :now, :now, "
                                ":now, :beat, 'training', 42, 9.5)"),
                           {"hash": token_hash(device_token), "now": now, "beat": json.dumps(beat)})
        for i in range(3):
            connection.execute(text("INSERT INTO heartbeats (device_id, received_at, sent_at, payload) "
                                    "VALUES (1, :now, :now, :beat)"), {"now": now + i, "beat": json.dumps(beat)})
        connection.execute(text("INSERT INTO schedules VALUES ('0123456789abcdef', :doc, 'sha256:ff', 'm', 'rpi4', "
                                "1000, NULL, 900, 12.5, 0.25, 'optimal', :now)"), {"doc": b"{}", "now": now})
        connection.execute(text("INSERT INTO device_schedules VALUES (1, '0123456789abcdef', :now)"), {"now": now})
    assert current_revision(db) == "0001"
    db.dispose()
    return db, device_token


def test_upgrading_from_0001_keeps_every_row_and_adds_the_operator_tables(settings) -> None:
    _, device_token = database_at_0001(settings)
    db = open_database(settings)  # what a new server does at start
    assert current_revision(db) == "0010"
    tables = {"operators", "operator_sessions", "rounds", "model_versions", "audit_log", "fleet_samples"}
    assert tables <= set(inspect(db.engine).get_table_names())
    with db.engine.connect() as connection:
        assert connection.execute(text("SELECT name, steps_done, energy_j FROM devices")).all() == [("pi-1", 42, 9.5)]
        assert connection.execute(text("SELECT count(*) FROM heartbeats")).scalar() == 3
        assert connection.execute(text("SELECT predicted_peak_bytes FROM schedules")).scalar() == 900
        assert connection.execute(text("SELECT schedule_id FROM device_schedules")).scalar() == "0123456789abcdef"
        assert compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}),
                                Base.metadata) == []
    client = TestClient(create_app(settings))  # and the upgraded server works with the old data
    headers = {"Authorization": f"Bearer {device_token}"}
    assert client.post("/api/v1/heartbeats", json=heartbeat(steps_done=43), headers=headers).status_code == 204
    add_operator(client.app)
    assert log_in(client).status_code == 303
    fleet = client.get("/dashboard/fleet.json").json()["rows"]
    assert [(row["name"], row["cells"]["steps"]) for row in fleet] == [("pi-1", "43")]
    assert 'data-schedule="0123456789abcdef"' in client.get("/schedules").text
