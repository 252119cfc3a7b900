"""JSON Schemas of the planner's documents a schedule request carries (a training graph, a device profile), for the
OpenAPI description.

They are built from the planner's own dataclasses (:class:`~schedules.graph.Node`,
:class:`~schedules.graph.Parameter`, :class:`~schedules.device.DeviceProfile`),
so a field added there shows here.  They describe; the planner's parsers
validate (``TrainingGraph.from_dict``, ``DeviceProfile.from_dict``), and their
errors are what a client gets back.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from schedules.device import DEVICE_FORMAT, DEVICE_VERSION, DeviceProfile
from schedules.graph import GRAPH_FORMAT, GRAPH_VERSION, Node, Parameter

_SCALARS = {str: {"type": "string"}, bool: {"type": "boolean"}, int: {"type": "integer"}, float: {"type": "number"}}


def _json_type(hint: Any) -> dict[str, Any]:
    """The JSON Schema of one dataclass field's type (the few types the planner's documents use)."""
    origin = typing.get_origin(hint)
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if origin is Literal:
        return {"type": "string", "enum": list(typing.get_args(hint))}
    if origin in (Union, types.UnionType):
        options = [_json_type(arg) for arg in typing.get_args(hint) if arg is not type(None)]
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return {"anyOf": [schema, {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "items": _json_type(typing.get_args(hint)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _json_type(typing.get_args(hint)[1])}
    raise TypeError(f"no JSON Schema for {hint!r}")


def object_schema(cls: type, title: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object with ``cls``'s fields (less ``skip``): those without a default are required."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return {"title": title, "type": "object", "additionalProperties": False,
            "properties": {f.name: _json_type(hints[f.name]) for f in fields}, "required": required}


_COUNT = {"type": "integer", "minimum": 0}
_NUMBERS = {"type": "array", "items": {"type": "number"}}
_EDGES = {"type": "array", "items": {"type": "array", "items": _COUNT, "minItems": 2, "maxItems": 2},
          "description": "[from, to] node indices: `to` needs `from`'s output"}

TRAINING_GRAPH = {
    "title": "TrainingGraph", "type": "object", "additionalProperties": False,
    "description": "a training graph as `poet-edge profile` extracts it (docs/formats.md)",
    "required": ["format", "version", "nodes"],
    "properties": {
        "format": {"const": GRAPH_FORMAT}, "version": {"const": GRAPH_VERSION},
        "model": {"type": "string"}, "source": {"type": "string"},
        "fixed_bytes": _COUNT, "runtime_bytes": _COUNT,
        "nodes": {"type": "array", "minItems": 1, "items": object_schema(Node, "Node")},
        "edges": _EDGES,
        "parameters": {"type": "array", "items": object_schema(Parameter, "Parameter")},
        "cut": {"type": "array", "items": {"type": "string"},
                "description": "the modules extraction cut the model at (`name:ops`: its own code as operations)"},
        "operator_bound_bytes": _COUNT, "default_cut_floor_bytes": _COUNT,
    },
}
REFERENCE_GRAPH = {
    "title": "ReferenceGraph", "type": "object",
    "description": "a POET reference graph (the paper's published format): T nodes, columns of T numbers",
    "required": ["T", "edges", "backward", "cost_cpu_ms", "cost_ram_bytes", "compute_j", "pagein_j", "pageout_j"],
    "properties": {"T": {"type": "integer", "minimum": 1}, "edges": _EDGES, "backward": {"type": "array", "items": _COUNT},
                   **{column: _NUMBERS for column in ("cost_cpu_ms", "cost_ram_bytes", "compute_j", "pagein_j",
                                                      "pageout_j")}},
}
GRAPH_SCHEMA = {"oneOf": [TRAINING_GRAPH, REFERENCE_GRAPH]}

DEVICE_SCHEMA = object_schema(DeviceProfile, "DeviceProfile", skip=("version",))
DEVICE_SCHEMA["description"] = "a device profile: `poet-edge profile` measures one, `schedules/devices/` has built-ins"
DEVICE_SCHEMA["properties"] = {"format": {"const": DEVICE_FORMAT}, "version": {"const": DEVICE_VERSION},
                               **DEVICE_SCHEMA["properties"]}
DEVICE_SCHEMA["required"] = ["format", "version", *DEVICE_SCHEMA["required"]]
