"""TrainingGraph: one training step as a DAG of forward, loss and backward nodes.

Nodes are numbered ``0..T-1`` in a topological order that is also POET's stage
order: stage ``t`` computes node ``t`` (and may recompute earlier ones).  Every
node carries the cost figures the planner needs; the fixed bytes (the loaded
model: parameters and buffers; the reference graphs' parameter bytes) are kept
apart because they are not part of what a training step adds.

A graph extracted from a real model also lists its trained parameters
(:class:`Parameter`: bytes, and the backward nodes that contribute to each
one's gradient) and the runtime's own memory measured beside the nodes
(``runtime_bytes``), so that a plan can budget a step's whole memory --
activations, live gradients and optimizer state -- and not activations alone
(:mod:`schedules.step_memory`).

Two on-disk shapes are read:

* our own versioned format (``{"format": "poet-edge/training-graph", "version": 1, ...}``);
* the POET reference graphs (``{"T": ..., "edges": ..., "backward": ...}``), unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Literal

from common.canonical import canonical_json, finite_number, load_validated
from schedules.errors import FormatError, UnsupportedVersionError

NodeKind = Literal["forward", "loss", "backward"]
NODE_KINDS: tuple[str, ...] = ("forward", "loss", "backward")
GRAPH_FORMAT = "poet-edge/training-graph"
GRAPH_VERSION = 1


@dataclass(frozen=True)
class Node:
    """One node of the training graph.

    ``compute_j``, ``pagein_j`` and ``pageout_j`` are ``None`` until a device
    profile has priced the node (see :func:`schedules.device.price_graph`).
    ``workspace_bytes`` is memory the node needs only while it computes, on top
    of its inputs and its own value, and gives back when it finishes: a
    backward node's activation gradients inside its unit, kernel workspaces.
    Extraction measures it; the POET reference graphs do not have it (0).
    """

    name: str
    kind: NodeKind
    segment: str
    compute_ms: float
    bytes: int
    compute_j: float | None = None
    pagein_j: float | None = None
    pageout_j: float | None = None
    workspace_bytes: int = 0


@dataclass(frozen=True)
class Parameter:
    """One trained parameter tensor: what its gradient and optimizer state cost, and when.

    ``nodes`` are the backward nodes that add to its gradient, ascending: one
    for most parameters, several for a tensor used in several segments (tied
    weights).  Its gradient is final once the last of them has run, which is
    where an update fused into the backward pass applies it.  ``streamed``
    marks a weight whose gradient the executor computes and applies in column
    blocks, never whole (:mod:`engine.optim.streamed`); extraction measured
    its node's workspace that way, and the size of the two factors the
    gradient is made from (``stream_bytes``), which a background update keeps
    until it has applied every block, and the bytes of the column unit its
    blocks are multiples of (``block_bytes``: blocks keep the whole product's
    bits only so).  An embedding table whose gradient is zero outside the
    rows a step looks up carries how many rows a step may look up (``rows``)
    and one row's bytes (``row_bytes``): its update can run row by row
    (:mod:`engine.optim.rows`).
    """

    name: str
    bytes: int
    nodes: tuple[int, ...]
    streamed: bool = False
    stream_bytes: int = 0  # a streamed weight's gradient as its two factors (output gradient and input): bytes
    block_bytes: int = 0  # a streamed weight's column unit: its gradient's blocks are whole multiples of it
    rows: int = 0  # an embedding table's rows a step may look up (0: not updated by rows)
    row_bytes: int = 0  # ... and the bytes of one of its rows

    def chunk_bytes(self, chunk: int) -> int:
        """The largest piece of this parameter an update holds at once with update chunks of ``chunk`` bytes:
        a streamed weight's column block is a multiple of ``block_bytes`` (at least one) and its last block
        may carry up to one more unit (:mod:`engine.optim.chunks`); a table updated by rows is cut into whole
        rows, at least one (:mod:`engine.optim.rows`)."""
        if self.streamed and self.block_bytes:
            return min(self.bytes, max(chunk, self.block_bytes) + self.block_bytes)
        if self.rows and self.row_bytes:
            return min(self.bytes, max(self.row_bytes, chunk))
        return min(self.bytes, chunk)

    @property
    def first(self) -> int:
        """The backward node that makes its gradient first."""
        return self.nodes[0]

    @property
    def last(self) -> int:
        """The backward node after which its gradient is final (where it is updated)."""
        return self.nodes[-1]


@dataclass(frozen=True)
class TrainingGraph:
    """A training step's DAG with per-node costs; see the module docstring."""

    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...]
    fixed_bytes: int = 0
    model: str = ""
    source: str = ""
    version: int = GRAPH_VERSION
    parameters: tuple[Parameter, ...] = ()
    runtime_bytes: int = 0
    cut: tuple[str, ...] = ()  # the modules extraction cut the model at, so a device can cut it the same way
    operator_bound_bytes: int = 0  # the largest working set of one operator's backward (0: not measured)
    default_cut_floor_bytes: int = 0  # where extraction refined: the activation floor of the cut it began from

    def __post_init__(self) -> None:
        _validate(self)

    # -- structure ---------------------------------------------------------------
    def lookup_node(self, p: Parameter) -> int | None:
        """The forward node of the segment whose backward node makes ``p``'s gradient (where a table is looked
        up), or None."""
        segment = self.nodes[p.last].segment if 0 <= p.last < len(self.nodes) else None
        return next((i for i, n in enumerate(self.nodes) if n.kind == "forward" and n.segment == segment), None)

    @property
    def size(self) -> int:
        """Number of nodes ``T`` (and of stages)."""
        return len(self.nodes)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """``predecessors[v]``: the nodes whose values ``v`` consumes, ascending."""
        preds: list[list[int]] = [[] for _ in self.nodes]
        for u, v in self.edges:
            preds[v].append(u)
        return tuple(tuple(sorted(p)) for p in preds)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """``successors[u]``: the nodes that consume ``u``'s value, ascending."""
        succs: list[list[int]] = [[] for _ in self.nodes]
        for u, v in self.edges:
            succs[u].append(v)
        return tuple(tuple(sorted(s)) for s in succs)

    @cached_property
    def backward_nodes(self) -> frozenset[int]:
        """Ids of the backward (gradient) nodes."""
        return frozenset(i for i, n in enumerate(self.nodes) if n.kind == "backward")

    def is_backward(self, i: int) -> bool:
        """True when node ``i`` computes a gradient (it is never recomputed)."""
        return self.nodes[i].kind == "backward"

    @cached_property
    def last_use(self) -> tuple[int, ...]:
        """``last_use[i]``: the last stage at which node ``i``'s value can be needed.

        A backward consumer needs it at its own stage; a forward consumer can be
        recomputed as late as its own last use.  A node nobody consumes is
        needed only at its own stage.
        """
        last = list(range(self.size))
        for i in reversed(range(self.size)):
            for j in self.successors[i]:
                last[i] = max(last[i], j if self.is_backward(j) else last[j])
        return tuple(last)

    # -- totals ------------------------------------------------------------------
    @property
    def total_compute_ms(self) -> float:
        """Compute time of one plain step (every node once), milliseconds."""
        return sum(n.compute_ms for n in self.nodes)

    @property
    def forward_activation_bytes(self) -> int:
        """Bytes of all forward and loss values: what store-all keeps at its peak."""
        return sum(n.bytes for n in self.nodes if n.kind != "backward")

    @property
    def has_energy(self) -> bool:
        """True when every node carries compute, page-in and page-out energies."""
        return all(n.compute_j is not None and n.pagein_j is not None and n.pageout_j is not None for n in self.nodes)

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 over what a schedule's validity depends on: each node's name, kind, segment and bytes, and
        the edges (as a set: their order in the file does not matter).

        Timings, energies and workspaces are left out on purpose: they are
        measurements of the machine (workspaces depend on the kernels PyTorch
        picks there), re-profiling changes them but does not make a schedule
        one for another model.  Whoever runs a schedule replays it on their own
        graph, which refuses it if its workspaces no longer fit the budget.
        The parameter layout counts where there is one (a schedule's optimizer
        state on flash names parameters, and a table updated by rows is
        planned otherwise); ``runtime_bytes`` is a measurement.
        """
        shape: dict[str, Any] = {
            "nodes": [[n.name, n.kind, n.segment, n.bytes] for n in self.nodes],
            "edges": sorted(list(e) for e in self.edges),
        }
        if self.parameters:
            shape["parameters"] = [[p.name, p.bytes, list(p.nodes), p.streamed] + ([p.rows] if p.rows else [])
                                   for p in self.parameters]  # a table updated by rows is planned otherwise
        return "sha256:" + hashlib.sha256(canonical_json(shape)).hexdigest()

    @property
    def parameter_bytes(self) -> int:
        """Bytes of all trained parameters: what their gradients take when all live at once."""
        return sum(p.bytes for p in self.parameters)

    def with_nodes(self, nodes: Iterable[Node]) -> "TrainingGraph":
        """Return a copy with ``nodes`` replaced (same structure, new costs)."""
        return replace(self, nodes=tuple(nodes))

    # -- files -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Our versioned JSON shape."""
        return {
            "format": GRAPH_FORMAT,
            "version": self.version,
            "model": self.model,
            "source": self.source,
            "fixed_bytes": self.fixed_bytes,
            "runtime_bytes": self.runtime_bytes,
            "nodes": [_node_to_dict(n) for n in self.nodes],
            "edges": [list(e) for e in self.edges],
            "parameters": [_parameter_to_dict(p) for p in self.parameters],
            "cut": list(self.cut),
            "operator_bound_bytes": self.operator_bound_bytes,
            "default_cut_floor_bytes": self.default_cut_floor_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainingGraph":
        """Build from our format or from a POET reference graph; validates everything."""
        if not isinstance(data, dict):
            raise FormatError("a training graph must be a JSON object")
        if "format" not in data and {"T", "edges", "backward"} <= data.keys():
            return _from_reference(data)
        if data.get("format") != GRAPH_FORMAT:
            raise FormatError(
                f"not a training graph: expected format {GRAPH_FORMAT!r} (or a POET reference graph "
                f"with T/edges/backward), found {data.get('format')!r}"
            )
        if data.get("version") != GRAPH_VERSION:
            raise UnsupportedVersionError(
                f"training graph version {data.get('version')!r} is not supported (this release reads "
                f"version {GRAPH_VERSION}); re-extract the graph with this release"
            )
        unknown = sorted(set(data) - _GRAPH_KEYS)
        if unknown:
            raise FormatError(f"training graph has unknown field(s) {', '.join(unknown)}; it has "
                              f"{', '.join(sorted(_GRAPH_KEYS))}")
        nodes = data.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise FormatError("training graph needs a non-empty 'nodes' list")
        return cls(
            nodes=tuple(_node_from_dict(n, i) for i, n in enumerate(nodes)),
            edges=_edges_from(data.get("edges")),
            fixed_bytes=int(finite_number(data.get("fixed_bytes", 0), "fixed_bytes")),
            model=str(data.get("model", "")),
            source=str(data.get("source", "")),
            parameters=_parameters_from(data.get("parameters", [])),
            runtime_bytes=int(finite_number(data.get("runtime_bytes", 0), "runtime_bytes")),
            cut=_cut_from(data.get("cut", [])),
            operator_bound_bytes=int(finite_number(data.get("operator_bound_bytes", 0), "operator_bound_bytes",
                                                   minimum=0)),
            default_cut_floor_bytes=int(finite_number(data.get("default_cut_floor_bytes", 0),
                                                      "default_cut_floor_bytes", minimum=0)),
        )

    @classmethod
    def load(cls, path: str | Path) -> "TrainingGraph":
        """Load a graph file (ours or a POET reference graph)."""
        return load_validated(path, "training graph", cls.from_dict)

    def save(self, path: str | Path) -> None:
        """Write the graph in our versioned format."""
        Path(path).write_bytes(canonical_json(self.to_dict()) + b"\n")


def _node_to_dict(n: Node) -> dict[str, Any]:
    return {
        "name": n.name, "kind": n.kind, "segment": n.segment, "compute_ms": n.compute_ms,
        "bytes": n.bytes, "workspace_bytes": n.workspace_bytes,
        "compute_j": n.compute_j, "pagein_j": n.pagein_j, "pageout_j": n.pageout_j,
    }


def _parameter_to_dict(p: Parameter) -> dict[str, Any]:
    return {"name": p.name, "bytes": p.bytes, "nodes": list(p.nodes), "streamed": p.streamed,
            "stream_bytes": p.stream_bytes, "block_bytes": p.block_bytes, "rows": p.rows, "row_bytes": p.row_bytes}


_NODE_KEYS = frozenset(f.name for f in fields(Node))
_PARAMETER_KEYS = frozenset(f.name for f in fields(Parameter))
_GRAPH_KEYS = frozenset({"format", "version", "model", "source", "fixed_bytes", "runtime_bytes", "nodes", "edges",
                         "parameters", "cut", "operator_bound_bytes", "default_cut_floor_bytes"})


def _cut_from(raw: Any) -> tuple[str, ...]:
    if not (isinstance(raw, list) and all(isinstance(name, str) for name in raw)):
        raise FormatError("'cut' must be a list of module names")
    return tuple(raw)


def _parameters_from(raw: Any) -> tuple[Parameter, ...]:
    if not isinstance(raw, list):
        raise FormatError("'parameters' must be a list of {name, bytes, nodes, streamed, stream_bytes} objects")
    out = []
    for i, d in enumerate(raw):
        if not isinstance(d, dict):
            raise FormatError(f"parameter {i} must be an object")
        unknown = sorted(set(d) - _PARAMETER_KEYS)
        if unknown:
            raise FormatError(f"parameter {i} has unknown field(s) {', '.join(unknown)}; a parameter has "
                              f"{', '.join(sorted(_PARAMETER_KEYS))}")
        nodes = d.get("nodes")
        if not (isinstance(nodes, list) and nodes
                and all(isinstance(n, int) and not isinstance(n, bool) for n in nodes)):
            raise FormatError(f"parameter {i}: 'nodes' must be a non-empty list of backward node ids")
        streamed = d.get("streamed", False)
        if not isinstance(streamed, bool):
            raise FormatError(f"parameter {i}: 'streamed' must be true or false, got {streamed!r}")
        out.append(Parameter(name=str(d.get("name", f"p{i}")),
                             bytes=int(finite_number(d.get("bytes"), f"parameter {i} bytes", minimum=0)),
                             nodes=tuple(nodes), streamed=streamed,
                             stream_bytes=int(finite_number(d.get("stream_bytes", 0), f"parameter {i} stream_bytes")),
                             block_bytes=int(finite_number(d.get("block_bytes", 0), f"parameter {i} block_bytes",
                                                           minimum=0)),
                             rows=int(finite_number(d.get("rows", 0), f"parameter {i} rows", minimum=0)),
                             row_bytes=int(finite_number(d.get("row_bytes", 0), f"parameter {i} row_bytes", minimum=0))))
    return tuple(out)


def _node_from_dict(d: Any, i: int) -> Node:
    if not isinstance(d, dict):
        raise FormatError(f"node {i} must be an object")
    unknown = sorted(set(d) - _NODE_KEYS)
    if unknown:  # a misspelt field would otherwise read as its default
        raise FormatError(f"node {i} has unknown field(s) {', '.join(unknown)}; a node has {', '.join(sorted(_NODE_KEYS))}")
    kind = d.get("kind")
    if kind not in NODE_KINDS:
        raise FormatError(f"node {i}: kind must be one of {NODE_KINDS}, got {kind!r}")

    def energy(key: str) -> float | None:
        return None if d.get(key) is None else finite_number(d[key], f"node {i} {key}")

    return Node(
        name=str(d.get("name", f"n{i}")),
        kind=kind,
        segment=str(d.get("segment", "")),
        compute_ms=finite_number(d.get("compute_ms"), f"node {i} compute_ms"),
        bytes=int(finite_number(d.get("bytes"), f"node {i} bytes")),
        workspace_bytes=int(finite_number(d.get("workspace_bytes", 0), f"node {i} workspace_bytes")),
        compute_j=energy("compute_j"),
        pagein_j=energy("pagein_j"),
        pageout_j=energy("pageout_j"),
    )


def _edges_from(raw: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(raw, list):
        raise FormatError("'edges' must be a list of [u, v] pairs")
    edges = []
    for e in raw:
        if not (isinstance(e, (list, tuple)) and len(e) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in e)):
            raise FormatError(f"edge {e!r} is not a pair of node ids")
        edges.append((e[0], e[1]))
    return tuple(edges)


def _from_reference(d: dict[str, Any]) -> TrainingGraph:
    """Read a POET reference graph; its last forward node is the loss."""
    T = d["T"]
    if not isinstance(T, int) or T <= 0:
        raise FormatError(f"reference graph: T must be a positive integer, got {T!r}")
    backward = set(d["backward"]) if isinstance(d["backward"], list) else None
    if backward is None or not all(isinstance(b, int) and 0 <= b < T for b in backward):
        raise FormatError("reference graph: 'backward' must list node ids in 0..T-1")
    columns = {k: d.get(k) for k in ("cost_cpu_ms", "cost_ram_bytes", "compute_j", "pagein_j", "pageout_j")}
    for key, col in columns.items():
        if not isinstance(col, list) or len(col) != T:
            raise FormatError(f"reference graph: {key!r} must be a list of T={T} numbers")
    forward = [i for i in range(T) if i not in backward]
    loss = max(forward) if forward else None
    nodes = []
    for i in range(T):
        kind: NodeKind = "backward" if i in backward else ("loss" if i == loss else "forward")
        nodes.append(Node(
            name=f"{kind[0]}{i}", kind=kind, segment=str(i),
            # The reference computes this column as FLOPs / (FLOP/s): seconds despite
            # its name (4,734,976 FLOPs at 2 GFLOP/s is stored as 0.002367488).
            compute_ms=1000.0 * finite_number(columns["cost_cpu_ms"][i], f"cost_cpu_ms[{i}]"),
            bytes=int(finite_number(columns["cost_ram_bytes"][i], f"cost_ram_bytes[{i}]")),
            compute_j=finite_number(columns["compute_j"][i], f"compute_j[{i}]"),
            pagein_j=finite_number(columns["pagein_j"][i], f"pagein_j[{i}]"),
            pageout_j=finite_number(columns["pageout_j"][i], f"pageout_j[{i}]"),
        ))
    # Every reference graph lists its (loss, first backward) edge twice; one
    # dependency is one edge, so duplicates are dropped here (the dense reference
    # formulation in benchmarks/ reads the raw list and keeps them).
    edges = tuple(dict.fromkeys(_edges_from(d["edges"])))
    return TrainingGraph(
        nodes=tuple(nodes), edges=edges,
        fixed_bytes=int(finite_number(d.get("param_bytes", 0), "param_bytes")),
        model=str(d.get("model", "")), source=f"poet-reference:{d.get('platform', '')}",
    )


def _validate(g: TrainingGraph) -> None:
    T = len(g.nodes)
    if T == 0:
        raise FormatError("training graph has no nodes")
    if g.version != GRAPH_VERSION:
        raise UnsupportedVersionError(f"training graph version {g.version} is not supported")
    seen: set[tuple[int, int]] = set()
    for u, v in g.edges:
        if not (0 <= u < T and 0 <= v < T):
            raise FormatError(f"edge ({u}, {v}) names a node outside 0..{T - 1}")
        if u >= v:
            raise FormatError(f"edge ({u}, {v}) goes backwards: nodes must be numbered in topological order")
        if (u, v) in seen:
            raise FormatError(f"edge ({u}, {v}) appears twice")
        seen.add((u, v))
    kinds = [n.kind for n in g.nodes]
    first_backward = next((i for i, k in enumerate(kinds) if k == "backward"), T)
    if any(k != "backward" for k in kinds[first_backward:]):
        raise FormatError("every forward and loss node must come before the first backward node")
    if kinds.count("loss") > 1:
        raise FormatError(f"a training graph has at most one loss node, found {kinds.count('loss')}")
    names: dict[str, int] = {}
    for i, n in enumerate(g.nodes):
        if n.bytes < 0 or n.compute_ms < 0 or n.workspace_bytes < 0:
            raise FormatError(f"node {i} ({n.name}): bytes, workspace_bytes and compute_ms must be non-negative")
        if any(e is not None and e < 0 for e in (n.compute_j, n.pagein_j, n.pageout_j)):
            raise FormatError(f"node {i} ({n.name}): energies must be non-negative")
        if names.setdefault(n.name, i) != i:
            raise FormatError(f"nodes {names[n.name]} and {i} are both named {n.name!r}; node names are unique")
    if g.runtime_bytes < 0:
        raise FormatError("runtime_bytes must be non-negative")
    seen_params: set[str] = set()
    for p in g.parameters:
        if p.name in seen_params:
            raise FormatError(f"parameter {p.name!r} is listed twice; parameter names are unique")
        seen_params.add(p.name)
        if list(p.nodes) != sorted(set(p.nodes)):
            raise FormatError(f"parameter {p.name!r}: its nodes {list(p.nodes)} must be ascending, without repeats")
        if not all(0 <= n < T and kinds[n] == "backward" for n in p.nodes):
            raise FormatError(f"parameter {p.name!r}: its nodes {list(p.nodes)} must be backward nodes of the graph")
        if p.rows and not (p.row_bytes and p.bytes % p.row_bytes == 0 and len(p.nodes) == 1 and not p.streamed
                           and g.lookup_node(p) is not None):
            raise FormatError(f"parameter {p.name!r}: a table updated by rows needs row_bytes dividing its bytes, one "
                              "backward node, no streaming, and a forward node of the same segment (its lookup)")
