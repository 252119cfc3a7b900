"""POET's decision matrices and the one function that turns them into instructions.

Every planner (the MILP and each baseline) decides five ``T x T`` boolean
matrices indexed ``[stage, node]``, as in the POET paper:

* ``R[t, i]``     node ``i`` is computed (or recomputed) during stage ``t``;
* ``SRam[t, i]``  ``i``'s value is resident in RAM at the start of stage ``t``;
* ``SSd[t, i]``   ``i``'s value is on flash at the start of stage ``t``;
* ``MIn[t, i]``   ``i`` is paged in during stage ``t`` (resident from ``t+1``);
* ``MOut[t, i]``  ``i`` is paged out during stage ``t`` (on flash from ``t+1``).

:func:`to_instructions` is the only place that reads them; the executor reads
only the instruction list it produces (Checkmate's split between solver and
scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schedules.graph import TrainingGraph

Instruction = tuple[str, int]
OPS: tuple[str, ...] = ("compute", "page_out", "page_in", "free")


@dataclass(frozen=True)
class Matrices:
    """The five boolean decision matrices of a POET plan, each ``T x T`` ``[stage, node]``.

    A whole-step plan (:mod:`schedules.step_memory`) also decides which
    optimizer-state groups live on flash: ``state_on_flash`` (group indices).
    """

    R: np.ndarray
    SRam: np.ndarray
    SSd: np.ndarray
    MIn: np.ndarray
    MOut: np.ndarray
    state_on_flash: frozenset[int] = field(default=frozenset())

    @classmethod
    def empty(cls, T: int) -> "Matrices":
        """All-false matrices for a ``T``-node graph."""
        return cls(*(np.zeros((T, T), dtype=bool) for _ in range(5)))


def to_instructions(graph: TrainingGraph, m: Matrices) -> list[Instruction]:
    """Turn decision matrices into the executor's instruction list.

    Stage ``t`` becomes: page out what ``MOut[t]`` names; free what is resident
    but neither used in this stage nor kept into the next; compute what ``R[t]``
    names in node order, freeing each input right after its last use in the
    stage unless ``SRam[t+1]`` keeps it; page in what ``MIn[t]`` names for the
    next stage.  Work the matrices ask for but that cannot change anything
    (recomputing or paging in a value already resident, paging out a value
    already on flash) is dropped, so the result never costs more than the
    matrices' objective and never holds more than their memory accounting.
    Inconsistent matrices give an instruction list that
    :func:`schedules.simulate` rejects; this function does not judge.
    """
    T = graph.size
    resident: set[int] = set()
    on_flash: set[int] = set()
    out: list[Instruction] = []
    for t in range(T):
        keep = _row(m.SRam, t + 1) if t + 1 < T else set()
        for i in sorted(_row(m.MOut, t)):
            if i in resident and i not in on_flash:
                out.append(("page_out", i))
                on_flash.add(i)
        computes = [k for k in sorted(_row(m.R, t)) if k not in resident]
        uses_left = _uses_in_stage(graph, computes)
        for i in sorted(resident):
            if uses_left.get(i, 0) == 0 and i not in keep:
                out.append(("free", i))
                resident.discard(i)
        for k in computes:
            out.append(("compute", k))
            resident.add(k)
            for i in graph.predecessors[k]:
                uses_left[i] = uses_left.get(i, 0) - 1
            for i in (*graph.predecessors[k], k):
                if i in resident and uses_left.get(i, 0) <= 0 and i not in keep:
                    out.append(("free", i))
                    resident.discard(i)
        for i in sorted(_row(m.MIn, t)):
            if i not in resident and i in on_flash and i in keep:
                out.append(("page_in", i))
                resident.add(i)
    return out


def _row(matrix: np.ndarray, t: int) -> set[int]:
    return set(np.flatnonzero(matrix[t]).tolist())


def _uses_in_stage(graph: TrainingGraph, computes: list[int]) -> dict[int, int]:
    """How many of this stage's computes read each value."""
    uses: dict[int, int] = {}
    for k in computes:
        for i in graph.predecessors[k]:
            uses[i] = uses.get(i, 0) + 1
    return uses
