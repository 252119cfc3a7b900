"""to_instructions: POET's stage semantics, turned into the executor's instruction list."""

import numpy as np
import pytest

from schedules.baselines import BaselineProblem, milp_peak_bytes, milp_stage_peaks, simulated_stage_peaks, store_all
from schedules.errors import ScheduleViolation
from schedules.matrices import Matrices, to_instructions
from schedules.simulate import simulate
from tests.schedules.graphs import linear_graph, milp_constraint_violations
from tests.schedules.test_simulate import F0, F1, G1, GRAPH, LOSS, STORE_ALL


def objective_j(graph, m: Matrices) -> float:
    """The MILP's objective for these matrices: every R, MIn and MOut entry charged."""
    nodes = graph.nodes
    return float(sum(m.R[:, i].sum() * nodes[i].compute_j + m.MIn[:, i].sum() * nodes[i].pagein_j
                     + m.MOut[:, i].sum() * nodes[i].pageout_j for i in range(graph.size)))


def store_all_matrices(graph=GRAPH) -> Matrices:
    return store_all(BaselineProblem(graph, None, None))


def paging_f0_over_stage_2() -> Matrices:
    """Store-all, except f0 leaves RAM after its read in stage 1 and is paged back in for stage 3."""
    m = store_all_matrices()
    m.MOut[1, F0] = True  # f0 is resident at the start of stage 1, where f1 reads it
    m.SRam[2, F0] = False
    m.SSd[2, F0] = True
    m.MIn[2, F0] = True  # resident again from stage 3, where g1 reads it
    return m


def test_empty_matrices_have_the_graph_shape():
    m = Matrices.empty(4)
    assert all(getattr(m, k).shape == (4, 4) and getattr(m, k).dtype == bool and not getattr(m, k).any()
               for k in ("R", "SRam", "SSd", "MIn", "MOut"))


def test_store_all_becomes_plain_backprop_freeing_after_last_use():
    assert to_instructions(GRAPH, store_all_matrices()) == STORE_ALL


def test_paging_happens_where_the_stages_say():
    m = paging_f0_over_stage_2()
    assert milp_constraint_violations(GRAPH, m) == []
    instructions = to_instructions(GRAPH, m)
    assert instructions == [
        ("compute", F0),
        ("page_out", F0), ("compute", F1), ("free", F0),  # stage 1: out first, freed after f1 read it
        ("compute", LOSS), ("page_in", F0),  # stage 2 ends by paging f0 back in
        *STORE_ALL[3:],
    ]
    report = simulate(GRAPH, instructions)
    assert report.energy_j == pytest.approx(objective_j(GRAPH, m))
    assert report.peak_bytes <= milp_peak_bytes(GRAPH, m)


def test_work_that_changes_nothing_is_dropped():
    m = paging_f0_over_stage_2()
    m.R[3, F0] = True  # recompute a value that is already resident (paged in)
    m.MOut[3, F0] = True  # page out a value already on flash
    m.SSd[3, F0] = True
    m.MIn[3, G1] = True  # page in a value that is resident and was never paged out
    instructions = to_instructions(GRAPH, m)
    assert instructions == to_instructions(GRAPH, paging_f0_over_stage_2())
    assert simulate(GRAPH, instructions).energy_j < objective_j(GRAPH, m)


def test_a_value_no_stage_reads_is_freed_at_stage_start_though_the_milp_counts_it():
    m = store_all_matrices()
    m.SRam[3, F0] = False  # resident at the start of stage 2, unread there, not kept into stage 3 ...
    m.R[3, F0] = True  # ... and recomputed in stage 3 for g1 (and kept for g0)
    assert milp_constraint_violations(GRAPH, m) == []
    instructions = to_instructions(GRAPH, m)
    stage_2 = instructions.index(("compute", LOSS))
    assert instructions[stage_2 - 1] == ("free", F0)
    assert simulated_stage_peaks(GRAPH, m)[2] == 404  # f1 + loss
    assert milp_stage_peaks(GRAPH, m)[2] == 504  # the MILP's U still holds f0 during stage 2


def test_inconsistent_matrices_give_a_list_the_simulator_rejects():
    m = store_all_matrices()
    m.SRam[3, F1] = False  # g1 needs f1 at stage 3, but nobody keeps it
    assert milp_constraint_violations(GRAPH, m)
    with pytest.raises(ScheduleViolation, match=r"compute 3\): inputs \[1\] are not resident"):
        simulate(GRAPH, to_instructions(GRAPH, m))


def test_page_in_without_a_flash_copy_gives_a_list_the_simulator_rejects():
    m = store_all_matrices()
    m.SRam[2, F0] = False
    m.MIn[2, F0] = True  # f0 was never paged out: to_instructions does not judge, the simulator does
    assert "MIn[2,0] of a value not on flash" in milp_constraint_violations(GRAPH, m)
    with pytest.raises(ScheduleViolation, match="not resident"):
        simulate(GRAPH, to_instructions(GRAPH, m))


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_instruction_lists_end_with_nothing_resident(n):
    graph = linear_graph(n)
    report = simulate(graph, to_instructions(graph, store_all_matrices(graph)))
    assert report.resident_bytes[-1] == 0
    assert np.isclose(report.energy_j, objective_j(graph, store_all_matrices(graph)))
