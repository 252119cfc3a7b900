"""Schedule: a POET plan as a compact, canonical, optionally signed instruction list.

The instructions are ``(op, node)`` pairs with ``op`` one of ``compute``,
``page_out``, ``page_in``, ``free`` (see :mod:`schedules.matrices`).  On disk
they are one string of tokens so that a ResNet plan stays around a kilobyte:
each token is an op letter (``c``, ``o``, ``i``, ``f``) followed by node ids,
consecutive instructions with the same op share one token and runs of
consecutive ids are written as ranges -- ``"c0-5 f2,4 o3"`` is compute 0..5,
free 2 and 4, page out 3.

A schedule planned for a step's whole memory (:mod:`schedules.step_memory`)
also carries ``step`` (:class:`StepPlan`): the training it was planned for
(optimizer, accumulation, clipping, update chunk), which parameters'
optimizer state lives on flash, and the prediction part by part -- what the
device's agent checks every step against.

A signed schedule carries an Ed25519 signature over the canonical JSON of
every other field (see :mod:`schedules.signing`); loading with a public key
refuses a missing, foreign or broken signature and any changed value, before
it parses a field (the signature covers the values, not the file's layout).
"""

from __future__ import annotations

import hashlib

import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from common.canonical import canonical_json, finite_number, parse_json_object
from schedules.errors import FormatError, ScheduleMismatchError, UnsupportedVersionError
from schedules.graph import TrainingGraph
from schedules.matrices import OPS, Instruction
from schedules.signing import verify_document
from schedules.step_memory import StepLayout, StepMemory, TrainingSpec

SCHEDULE_FORMAT = "poet-edge/schedule"
SCHEDULE_VERSION = 1
_LETTER = {"compute": "c", "page_out": "o", "page_in": "i", "free": "f"}
_OP = {v: k for k, v in _LETTER.items()}
_TOKEN = re.compile(r"^([coif])([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)$")
_INDICES = re.compile(r"^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*$")
_MAX_INDEX = 1 << 20  # no model has a million parameter tensors: a larger index is a malformed file


@dataclass(frozen=True)
class SolverInfo:
    """How the plan was found: method, solver, status, proven gap and time."""

    method: str
    solver: str
    status: str
    objective_j: float | None
    gap: float | None
    seconds: float


@dataclass(frozen=True)
class StepPlan:
    """What a whole-step schedule holds beside the activations, planned and predicted.

    ``memory_budget`` of its schedule bounds all of it together; each part is
    its own peak over the step (they need not peak together):
    ``activation_peak_bytes`` (activations and workspace, update transients
    included), ``gradient_peak_bytes``, ``resident_state_bytes`` (optimizer
    state kept in RAM) and ``runtime_bytes``.  ``state_on_flash`` lists the
    parameters (indices into the graph's ``parameters``) whose optimizer state
    lives in page files.  ``update_ms`` is the optimizer's updates' share of
    the schedule's ``predicted_runtime_ms`` (and of its ``runtime_budget_ms``),
    measured on the device (:func:`schedules.step_memory.update_ms`; 0 where
    the profile has not measured it).
    """

    training: TrainingSpec
    state_on_flash: tuple[int, ...]
    activation_peak_bytes: int
    gradient_peak_bytes: int
    resident_state_bytes: int
    paged_state_bytes: int
    runtime_bytes: int
    update_ms: float = 0.0

    def parts(self) -> dict[str, int]:
        """The predicted peak of each part, by the names the agent reports."""
        return {"activations": self.activation_peak_bytes, "gradients": self.gradient_peak_bytes,
                "optimizer state": self.resident_state_bytes, "runtime": self.runtime_bytes}

    def to_dict(self) -> dict[str, Any]:
        return {"training": self.training.to_dict(), "state_on_flash": _ranges(list(self.state_on_flash)),
                "activation_peak_bytes": self.activation_peak_bytes, "gradient_peak_bytes": self.gradient_peak_bytes,
                "resident_state_bytes": self.resident_state_bytes, "paged_state_bytes": self.paged_state_bytes,
                "runtime_bytes": self.runtime_bytes, **({"update_ms": self.update_ms} if self.update_ms else {})}

    @classmethod
    def from_dict(cls, d: Any) -> "StepPlan":
        if not isinstance(d, dict):
            raise FormatError("step must be an object")
        unknown = sorted(set(d) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise FormatError(f"step has unknown field(s) {', '.join(unknown)}")
        on_flash = d.get("state_on_flash", "")
        if not isinstance(on_flash, str) or (on_flash and not _INDICES.match(on_flash)):
            raise FormatError(f"step.state_on_flash must be parameter indices like '0-5,9', got {on_flash!r}")

        def count(key: str) -> int:
            return int(finite_number(d.get(key), f"step.{key}"))

        return cls(training=TrainingSpec.from_dict(d.get("training")),
                   state_on_flash=_indices(on_flash),
                   activation_peak_bytes=count("activation_peak_bytes"), gradient_peak_bytes=count("gradient_peak_bytes"),
                   resident_state_bytes=count("resident_state_bytes"), paged_state_bytes=count("paged_state_bytes"),
                   runtime_bytes=count("runtime_bytes"), update_ms=_update_ms(d.get("update_ms", 0.0)))


@dataclass(frozen=True)
class Schedule:
    """A plan for one training step of one graph on one device; see the module docstring."""

    instructions: tuple[Instruction, ...]
    graph_fingerprint: str
    graph_size: int
    model: str
    device: str
    memory_budget: int | None
    runtime_budget_ms: float | None
    predicted_peak_bytes: int
    predicted_runtime_ms: float
    predicted_energy_j: float
    solver: SolverInfo
    count_paging_time: bool = False
    signature: dict[str, str] | None = field(default=None, compare=False)
    version: int = SCHEDULE_VERSION
    step: StepPlan | None = None

    def __post_init__(self) -> None:
        for position, (op, node) in enumerate(self.instructions):
            if op not in OPS:
                raise FormatError(f"instruction {position}: unknown op {op!r} (expected one of {OPS})")
            if not 0 <= node < self.graph_size:
                raise FormatError(f"instruction {position}: node {node} outside the graph's 0..{self.graph_size - 1}")

    # -- identity ---------------------------------------------------------------
    def check_graph(self, graph: TrainingGraph) -> None:
        """Raise :class:`ScheduleMismatchError` unless this schedule was planned for ``graph``."""
        if graph.fingerprint != self.graph_fingerprint:
            raise ScheduleMismatchError(
                f"schedule was planned for graph {self.graph_fingerprint[:19]}... (model {self.model!r}, "
                f"{self.graph_size} nodes) but this graph is {graph.fingerprint[:19]}... (model "
                f"{graph.model!r}, {graph.size} nodes): plan a schedule for this model with `poet-edge solve`"
            )

    def step_layout(self, graph: TrainingGraph) -> StepLayout:
        """The whole-step accounting this schedule was planned with, rebuilt on ``graph`` (its own graph)."""
        if self.step is None:
            raise ScheduleMismatchError("this schedule budgets activations only; it has no whole-step plan")
        from schedules.errors import FormatError, PlannerError

        try:
            return StepMemory.build(graph, self.step.training).layout_for_parameters(self.step.state_on_flash)
        except (PlannerError, FormatError) as exc:
            raise ScheduleMismatchError(f"schedule's whole-step plan does not fit this graph: {exc}") from exc

    def payload(self) -> dict[str, Any]:
        """Every field but the signature, in JSON shape: what is signed."""
        payload = self._fields()
        if self.step is not None:  # absent from activation-only schedules, so their ids stay as they were
            payload["step"] = self.step.to_dict()
        return payload

    def _fields(self) -> dict[str, Any]:
        return {
            "format": SCHEDULE_FORMAT,
            "version": self.version,
            "instructions": encode_instructions(self.instructions),
            "graph_fingerprint": self.graph_fingerprint,
            "graph_size": self.graph_size,
            "model": self.model,
            "device": self.device,
            "memory_budget": self.memory_budget,
            "runtime_budget_ms": self.runtime_budget_ms,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_runtime_ms": self.predicted_runtime_ms,
            "predicted_energy_j": self.predicted_energy_j,
            "count_paging_time": self.count_paging_time,
            "solver": asdict(self.solver),
        }

    @property
    def schedule_id(self) -> str:
        """Short, stable name of what this schedule says: the first 16 hex digits of its payload's SHA-256
        (the signature is left out, so the same plan signed by two keys has one id)."""
        return hashlib.sha256(canonical_json(self.payload())).hexdigest()[:16]

    # -- files -------------------------------------------------------------------
    def to_json(self) -> bytes:
        """Canonical JSON bytes, with the signature when there is one."""
        data = self.payload()
        if self.signature is not None:
            data["signature"] = dict(self.signature)
        return canonical_json(data)

    @classmethod
    def from_json(cls, text: str | bytes, *, public_key: Any = None, what: str = "schedule") -> "Schedule":
        """Parse and validate; with ``public_key`` (see :mod:`schedules.signing`) also verify the signature."""
        document = parse_json_object(text, what)
        if public_key is not None:  # before parsing: what an unverified file says is not believed
            verify_document(document, public_key)
        return _from_dict(document)

    @classmethod
    def load(cls, path: str | Path, *, public_key: Any = None) -> "Schedule":
        """Load a schedule file; with ``public_key`` refuse it unless its signature verifies."""
        try:
            return cls.from_json(Path(path).read_bytes(), public_key=public_key, what=f"schedule file {path}")
        except OSError as exc:
            raise FormatError(f"cannot read schedule file {path}: {exc.strerror or exc}") from exc

    def save(self, path: str | Path) -> int:
        """Write the canonical JSON; returns its size in bytes."""
        data = self.to_json()
        Path(path).write_bytes(data)
        return len(data)

    def with_signature(self, signature: dict[str, str] | None) -> "Schedule":
        """A copy carrying ``signature``."""
        return replace(self, signature=signature)


def encode_instructions(instructions: tuple[Instruction, ...] | list[Instruction]) -> str:
    """The compact token string described in the module docstring."""
    tokens: list[str] = []
    i = 0
    while i < len(instructions):
        op = instructions[i][0]
        j = i
        while j < len(instructions) and instructions[j][0] == op:
            j += 1
        tokens.append(_LETTER[op] + _ranges([n for _, n in instructions[i:j]]))
        i = j
    return " ".join(tokens)


def decode_instructions(text: str, graph_size: int | None = None) -> tuple[Instruction, ...]:
    """Inverse of :func:`encode_instructions`; raises :class:`FormatError` on any malformed token.

    With ``graph_size``, a node outside ``0..graph_size-1`` is refused before its range is expanded, so a
    token such as ``c0-999999999`` costs nothing.
    """
    if not isinstance(text, str):
        raise FormatError("'instructions' must be a string of tokens like 'c0-5 f2,4 o3'")
    out: list[Instruction] = []
    for token in text.split():
        match = _TOKEN.match(token)
        if match is None:
            raise FormatError(f"malformed instruction token {token!r}")
        op = _OP[match.group(1)]
        for part in match.group(2).split(","):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:
                raise FormatError(f"malformed range {part!r} in token {token!r}")
            if graph_size is not None and last >= graph_size:
                raise FormatError(f"instruction token {token!r}: node {last} outside the graph's 0..{graph_size - 1}")
            out.extend((op, n) for n in range(first, last + 1))
    return tuple(out)


def _indices(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` -> ``(0, 1, 2, 5)`` (already matched by ``_INDICES``)."""
    out: list[int] = []
    for part in text.split(",") if text else []:
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first or last >= _MAX_INDEX:
            raise FormatError(f"malformed parameter range {part!r}")
        out.extend(range(first, last + 1))
    if out != sorted(set(out)):
        raise FormatError("parameter indices must ascend without repeats")
    return tuple(out)


def _ranges(nodes: list[int]) -> str:
    if not nodes:
        return ""
    parts: list[str] = []
    start = prev = nodes[0]
    for n in nodes[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def _from_dict(d: dict[str, Any]) -> Schedule:
    if d.get("format") != SCHEDULE_FORMAT:
        raise FormatError(f"not a schedule: expected format {SCHEDULE_FORMAT!r}, found {d.get('format')!r}")
    if d.get("version") != SCHEDULE_VERSION:
        raise UnsupportedVersionError(
            f"schedule version {d.get('version')!r} is not supported (this release reads version "
            f"{SCHEDULE_VERSION}); re-plan it with this release's `poet-edge solve`"
        )
    known = set(Schedule.__dataclass_fields__) | {"format"}
    unknown = set(d) - known
    if unknown:
        raise FormatError(f"schedule has unknown fields {sorted(unknown)}")
    try:
        graph_size = int(finite_number(d["graph_size"], "graph_size", minimum=1))
        solver = SolverInfo(
            method=_string(d["solver"]["method"], "solver.method"), solver=_string(d["solver"]["solver"], "solver.solver"),
            status=_string(d["solver"]["status"], "solver.status"),
            objective_j=_optional_number(d["solver"].get("objective_j"), "solver.objective_j"),
            gap=_optional_number(d["solver"].get("gap"), "solver.gap"),
            seconds=finite_number(d["solver"]["seconds"], "solver.seconds"),
        )
        return Schedule(
            instructions=decode_instructions(d["instructions"], graph_size),
            graph_fingerprint=_string(d["graph_fingerprint"], "graph_fingerprint"),
            graph_size=graph_size,
            model=_string(d["model"], "model"),
            device=_string(d["device"], "device"),
            memory_budget=None if d["memory_budget"] is None else int(finite_number(d["memory_budget"], "memory_budget")),
            runtime_budget_ms=_optional_number(d["runtime_budget_ms"], "runtime_budget_ms"),
            predicted_peak_bytes=int(finite_number(d["predicted_peak_bytes"], "predicted_peak_bytes")),
            predicted_runtime_ms=finite_number(d["predicted_runtime_ms"], "predicted_runtime_ms"),
            predicted_energy_j=finite_number(d["predicted_energy_j"], "predicted_energy_j"),
            solver=solver,
            count_paging_time=_flag(d.get("count_paging_time", False), "count_paging_time"),
            signature=_signature(d.get("signature")),
            step=None if d.get("step") is None else StepPlan.from_dict(d["step"]),
        )
    except (KeyError, TypeError) as exc:
        raise FormatError(f"schedule is missing or has a malformed field: {exc}") from exc


def _update_ms(value: Any) -> float:
    ms = finite_number(value, "step.update_ms")
    if ms < 0:
        raise FormatError(f"step.update_ms must be >= 0 ms, got {ms!r}")
    return ms


def _optional_number(value: Any, field_name: str) -> float | None:
    return None if value is None else finite_number(value, field_name)


def _flag(value: Any, field_name: str) -> bool:
    if not isinstance(value, bool):
        raise FormatError(f"{field_name} must be true or false, got {value!r}")
    return value


def _string(value: Any, field_name: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{field_name} must be a string")
    return value


def _signature(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, dict) and set(value) == {"algorithm", "key_id", "value"}
            and all(isinstance(v, str) for v in value.values())):
        raise FormatError("signature must be an object with string fields algorithm, key_id, value")
    return dict(value)
