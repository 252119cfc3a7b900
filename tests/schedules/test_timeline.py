"""The executor's paging in time, planned from the schedule alone: read-ahead and write-behind."""

import pytest

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


# nodes 1 and 2 (100 bytes each) are paged out in the forward pass and paged back in, 2 first; node 2's copy is
# freed at 9, before node 1's read can start (node 4's computation leaves no room for it before 10)
REREAD = [("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2), ("page_out", 2), ("free", 2),
          ("compute", 3), ("page_in", 2), ("compute", 4), ("free", 2), ("compute", 5), ("page_in", 1),
          ("compute", 6), ("free", 1)]
REREAD_SIZES = [0, 100, 100, 10, 10, 10, 10]
REREAD_HOLDING = [100, 100, 0, 100, 100, 0, 10, 110, 120, 20, 30, 130, 140, 40]


def test_a_read_takes_over_the_memory_of_a_value_of_as_many_bytes_freed_before_it_starts():
    io = plan_io(REREAD, REREAD_SIZES, REREAD_HOLDING, limit=145)
    assert io.reads == {10: [1]}          # node 2's write behind its free takes the room to read it ahead
    assert io.reuse == {(10, 1): (7, 2)}  # node 1's read fills the memory node 2's read (at its page_in) filled
    assert io.keep == {(7, 2)}
    assert max(h + x for h, x in zip(REREAD_HOLDING, io.held)) <= 145
    # a read of another size takes over nothing
    assert plan_io(REREAD, [0, 100, 90, 10, 10, 10, 10], REREAD_HOLDING, limit=145).reuse == {}


def test_a_read_starts_after_a_free_to_take_over_its_memory_only_where_computation_still_covers_it():
    roomy = plan_io(REREAD, REREAD_SIZES, REREAD_HOLDING, limit=1000)
    assert roomy.reads == {6: [2], 3: [1]} and roomy.reuse == {}  # read as early as it can: nothing freed yet
    compute_ms = [0, 5, 5, 5, 5, 5, 5]
    covered = plan_io(REREAD, REREAD_SIZES, REREAD_HOLDING, limit=1000, compute_ms=compute_ms,
                      read_ms=[0, 4, 4, 0, 0, 0, 0])
    assert covered.reads == {6: [2], 10: [1]} and covered.reuse == {(10, 1): (6, 2)}  # node 5's 5 ms hide 4 ms
    slow = plan_io(REREAD, REREAD_SIZES, REREAD_HOLDING, limit=1000, compute_ms=compute_ms,
                   read_ms=[0, 6, 6, 0, 0, 0, 0])
    assert slow.reads == {6: [2], 3: [1]} and slow.reuse == {}  # 6 ms would not be hidden: read early instead


def test_a_late_read_must_end_in_time_behind_the_reads_queued_before_it():
    # as above, with node 7 (50 bytes) read back at 14, between node 2's free (12) and node 1's page_in (16)
    instructions = [("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2), ("page_out", 2), ("free", 2),
                    ("compute", 7), ("page_out", 7), ("free", 7), ("compute", 3), ("page_in", 2), ("compute", 4),
                    ("free", 2), ("compute", 5), ("page_in", 7), ("compute", 8), ("page_in", 1), ("compute", 6),
                    ("free", 1), ("free", 7)]
    sizes = [0, 100, 100, 10, 10, 10, 10, 50, 10]
    holding = [100] * len(instructions)

    def late_reads(read_ms_of_7: float) -> dict:
        read_ms = [0, 4, 4, 0, 0, 0, 0, read_ms_of_7, 0]
        return plan_io(instructions, sizes, holding, 10_000, [5.0] * len(sizes), read_ms).reuse

    # node 1's read, started at 13 to take over node 2's memory, has nodes 5 and 8 (10 ms) before its page_in,
    # but the I/O thread first finishes node 7's read, started at 9
    assert late_reads(5.0) == {(13, 1): (6, 2)}  # 5 + 4 ms fit in 10
    assert late_reads(7.0) == {}                 # 7 + 4 do not: node 1 is read early, into fresh memory


def test_a_read_takes_over_the_memory_of_a_computed_value_of_its_layout_freed_before_it():
    # node 1 (100 bytes) is paged out and freed at 3; node 2 (100 bytes) is computed at 4 and freed at 6, after
    # node 3 used it; node 1 is paged back in at 8, and no read fits before node 2's free
    instructions = [("compute", 0), ("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2), ("compute", 3),
                    ("free", 2), ("compute", 4), ("page_in", 1), ("compute", 5)]
    sizes = [10, 100, 100, 10, 10, 10]
    holding = [10, 110, 110, 10, 110, 120, 20, 30, 130, 130]
    io = plan_io(instructions, sizes, holding, limit=135)
    assert io.reads == {7: [1]}
    assert io.reuse == {(7, 1): ("free", 6)} and io.keep == {("free", 6)}  # the read fills node 2's memory
    assert max(h + x for h, x in zip(holding, io.held)) <= 135
    # node 2's memory holds another layout (the executor's storage sizes): nothing to take over
    other = plan_io(instructions, sizes, holding, limit=135, layouts=[10, (100,), (60, 40), 10, 10, 10])
    assert other.reads == {7: [1]} and other.reuse == {}


@pytest.mark.parametrize("freed, written, donates", [(2, False, True), (0, False, False), (2, True, False)])
def test_neither_the_batch_nor_a_value_whose_page_is_being_written_gives_its_memory(freed, written, donates):
    # node 1 is paged back in at the end; the room for its read opens just after the free of ``freed`` (beside
    # the write of ``freed`` running behind that free, where it is written)
    instructions = [("compute", 0), ("compute", 1), ("page_out", 1), ("free", 1), ("compute", 2),
                    *([("page_out", freed)] if written else []), ("free", freed), ("compute", 3), ("page_in", 1)]
    holding = [100, 200, 200, 100, 250, *([250] if written else []), 100, 110, 110]
    io = plan_io(instructions, [100, 100, 100, 10], holding, limit=310)
    free = instructions.index(("free", freed))
    assert io.reads == {free + 1: [1]}
    assert io.reuse == ({(free + 1, 1): ("free", free)} if donates else {})  # the batch is the caller's memory
