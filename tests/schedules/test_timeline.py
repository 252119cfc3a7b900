"""The executor's paging in time, planned from the schedule alone: read-ahead and write-behind."""

from schedules.timeline import plan_io, plan_prefetch


def test_prefetch_starts_as_early_as_the_budget_allows():
    # node 1 (100 bytes) is paged out and freed at 3 and paged in at 7; node 2 (50 bytes) lives over 4..5
    instructions = [("compute", 0), ("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2), ("free", 2),
                    ("compute", 3), ("page_in", 1)]
    sizes = [10, 100, 50, 10]
    resident = [10, 110, 110, 10, 60, 10, 20, 120]
    assert plan_prefetch(instructions, sizes, resident, limit=1000) == {4: [1]}  # right after the free
    assert plan_prefetch(instructions, sizes, resident, limit=150) == {6: [1]}   # once node 2 is gone
    assert plan_prefetch(instructions, sizes, resident, limit=115) == {}         # no room: read at the page_in


def test_a_paged_value_is_written_behind_its_free_while_the_room_lasts():
    # same schedule: node 1 paged out at 2 and freed at 3; node 2 (50 bytes) computed at 4, freed at 5
    instructions = [("compute", 0), ("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2), ("free", 2),
                    ("compute", 3), ("page_in", 1)]
    sizes = [10, 100, 50, 10]
    holding = [10, 110, 110, 10, 60, 10, 20, 120]
    roomy = plan_io(instructions, sizes, holding, limit=165)
    assert roomy.release_by == {3: 7}        # held through 3..6 (at most 160 bytes), written before the page_in
    assert roomy.reads == {}                 # the room until 6 is taken by the value itself
    assert max(h + x for h, x in zip(holding, roomy.held)) <= 165
    tight = plan_io(instructions, sizes, holding, limit=150)
    assert tight.release_by == {3: 4}        # node 2's computation has no room for it: wait before it
    assert plan_io(instructions, sizes, holding, limit=105).release_by == {}  # the free itself waits
