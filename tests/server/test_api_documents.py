"""The OpenAPI description types a schedule request's ``graph`` and ``device``: the planner's own documents
validate against it, and its fields are the planner's."""

from __future__ import annotations

import json
from dataclasses import fields

import jsonschema
import pytest

from demo.walkthrough import synthetic_graph
from schedules.device import DeviceProfile
from schedules.graph import Node, Parameter
from server.api.documents import DEVICE_SCHEMA, GRAPH_SCHEMA, REFERENCE_GRAPH, TRAINING_GRAPH


@pytest.fixture(scope="module")
def request_schema(tmp_path_factory) -> dict:
    from server.api import create_app
    from server.config import ServerSettings

    app = create_app(ServerSettings(data_dir=tmp_path_factory.mktemp("openapi") / "server"))
    return app.openapi()["components"]["schemas"]["ScheduleRequestBody"]["properties"]


def test_graph_and_device_are_typed_objects_in_the_openapi_description(request_schema) -> None:
    assert request_schema["graph"]["oneOf"][0]["title"] == "TrainingGraph"
    assert request_schema["device"]["title"] == "DeviceProfile"
    node = TRAINING_GRAPH["properties"]["nodes"]["items"]
    assert set(node["properties"]) == {f.name for f in fields(Node)}
    assert set(TRAINING_GRAPH["properties"]["parameters"]["items"]["properties"]) == {f.name for f in fields(Parameter)}
    assert node["properties"]["kind"]["enum"] == ["forward", "loss", "backward"]
    assert set(DEVICE_SCHEMA["required"]) >= {"format", "version", "name", "ram_bytes", "pagein_bandwidth_bps"}


def test_the_planners_documents_validate_and_wrong_ones_do_not(poet_graphs) -> None:
    graph = synthetic_graph(6)
    graph = graph.__class__(nodes=graph.nodes, edges=graph.edges, model=graph.model,
                            parameters=(Parameter("w", 4096, (max(graph.backward_nodes),)),))
    document = json.loads(json.dumps(graph.to_dict()))
    jsonschema.validate(document, GRAPH_SCHEMA)
    assert set(document) == set(TRAINING_GRAPH["properties"])  # every field the planner writes is described
    for path in sorted(poet_graphs.glob("*.json"))[:3]:
        jsonschema.validate(json.loads(path.read_text()), REFERENCE_GRAPH)
    for name in DeviceProfile.builtin_names():
        jsonschema.validate(json.loads(json.dumps(DeviceProfile.builtin(name).to_dict())), DEVICE_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**document, "nodes": [{**document["nodes"][0], "kind": "sideways"}]}, GRAPH_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**DeviceProfile.builtin("rpi4").to_dict(), "ram_bytes": "4 GB"}, DEVICE_SCHEMA)
