"""schemathesis against ``/openapi.json``: generated requests, valid and invalid, get no 5xx and only documented
answers.

Every operation in the published schema is called with requests generated from
it (and deliberately invalid ones), carrying an enrolled device's token, and
each response is checked: no server error, a status code the operation
documents, the documented content type, and a body that matches the documented
schema.  The app runs in-process without its lifespan, so nothing is solved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from server.api import create_app
from server.config import ServerSettings
from tests.server.conftest import enrol

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The app (rate limits high enough not to cut the run short) and an enrolled device's headers."""
    data = Path(tmp_path_factory.mktemp("schemathesis")) / "server"
    app = create_app(ServerSettings(data_dir=data, enrol_per_minute=100_000, auth_failures_per_minute=100_000))
    return app, enrol(TestClient(app)).headers


class WithoutLifespan:
    """The app with its lifespan refused (schemathesis would start it: planner processes nobody needs here)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("no lifespan in this test")  # refused before any message: "not supported"
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def api_schema(served: tuple) -> schemathesis.schemas.BaseSchema:
    app, _ = served
    return schemathesis.openapi.from_asgi("/openapi.json", WithoutLifespan(app))


@pytest.fixture(scope="module")
def device_headers(served: tuple) -> dict[str, str]:
    return served[1]


# One Hypothesis run per operation inside one test per generation mode: schemathesis's own pytest integration
# (``parametrize`` over a fixture's schema) does not run under pytest 9, and building the app at import time
# would make a data directory whenever the test suite is collected.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda mode: mode.value)
def test_the_api_answers_every_generated_request_as_documented(api_schema, device_headers, mode) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert operations
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not (operation.body or list(operation.iter_parameters())):
            continue  # nothing to make invalid

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
        @given(case=operation.as_strategy(generation_mode=mode))
        def answered_as_documented(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=device_headers, checks=CHECKS)

        try:
            answered_as_documented()
        except Exception as exc:
            exc.add_note(f"operation: {operation.label}, {mode.value} data")
            raise


def test_the_published_schema_holds_only_the_device_api(api_schema) -> None:
    paths = set(api_schema.raw_schema["paths"])
    assert paths and all(path.startswith("/api/v1/") for path in paths), sorted(paths)
