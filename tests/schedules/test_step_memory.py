"""Planning a step's whole memory: gradients, optimizer state (in RAM or on flash) and the runtime beside activations."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedules.budgets import memory_lower_bound, store_all_peak
from schedules.errors import FormatError, PlannerError, ScheduleMismatchError, ScheduleViolation
from schedules.graph import Parameter, TrainingGraph
from schedules.plan import plan
from schedules.schedule import Schedule
from schedules.simulate import simulate
from schedules.step_memory import (READ_AHEAD_CHUNKS, WRITE_BEHIND_CHUNKS, StateCosts, StepMemory, TrainingSpec,
                                   background_waits, chunk_for)
from tests.schedules.graphs import linear_graph, with_parameters, with_workspace

SGD = TrainingSpec.for_optimizer("sgd", momentum=0.9, chunk_bytes=64)
ADAMW = TrainingSpec.for_optimizer("adamw", chunk_bytes=64)


def graph(**kwargs) -> TrainingGraph:
    return with_parameters(with_workspace(linear_graph(8)), **kwargs)


def test_the_optimizers_state_and_temporaries_follow_pytorchs_per_tensor_code() -> None:
    assert (SGD.state_tensors, SGD.update_temporaries) == (1, 0)
    assert TrainingSpec.for_optimizer("sgd").state_tensors == 0
    nesterov = TrainingSpec.for_optimizer("sgd", momentum=0.9, nesterov=True, weight_decay=0.1)
    assert (nesterov.state_tensors, nesterov.update_temporaries) == (1, 2)
    assert (ADAMW.state_tensors, ADAMW.update_temporaries) == (2, 2)
    assert TrainingSpec.for_optimizer("adam", weight_decay=0.1, amsgrad=True).state_tensors == 3
    with pytest.raises(PlannerError, match="rmsprop"):
        TrainingSpec.for_optimizer("rmsprop")


def test_gradients_live_where_the_training_needs_them() -> None:
    g = graph(tied=(9, 13))
    tied = g.parameters[-1]
    fused = StepMemory.build(g, SGD)
    # with updates in the backward pass only a tied weight's gradient outlives a node: from first to last
    assert [t for t, b in enumerate(fused.stage_bytes) if b] == list(range(tied.first + 1, tied.last + 1))
    assert fused.gradient_bytes == 0
    clipped = StepMemory.build(g, replace(SGD, clip=True))
    assert clipped.stage_bytes[-1] == sum(p.bytes for p in g.parameters if p.first < g.size - 1)
    accumulated = StepMemory.build(g, replace(SGD, accumulation=4))
    assert accumulated.gradient_bytes == g.parameter_bytes and accumulated.constant_bytes >= g.parameter_bytes


def test_state_groups_cover_every_parameter_once_in_update_order() -> None:
    g = graph(tied=(9, 13))
    memory = StepMemory.build(g, ADAMW)
    covered = sorted(i for group in memory.groups for i in group.parameters)
    assert covered == list(range(len(g.parameters)))
    assert [group.node for group in memory.groups] == sorted(group.node for group in memory.groups)
    assert memory.state_bytes == 2 * g.parameter_bytes
    assert StepMemory.build(g, TrainingSpec.for_optimizer("sgd", chunk_bytes=64)).groups == ()


def test_update_transients_grow_with_the_chunk_and_the_state_in_flight() -> None:
    g = graph()
    small, large = (StepMemory.build(g, replace(ADAMW, chunk_bytes=c)) for c in (16, 64))
    assert max(large.update_bytes) > max(small.update_bytes)
    for node, held in enumerate(large.update_bytes):
        params = [p for p in g.parameters if p.last == node]
        if params:  # the gradients the node makes, and the largest update's temporaries and state in flight
            transient = max(min(p.bytes, 64) for p in params) * (2 + (READ_AHEAD_CHUNKS + 1 + WRITE_BEHIND_CHUNKS) * 2)
            assert held == sum(p.bytes for p in params) + transient


def streamed_graph() -> TrainingGraph:
    """``graph()`` whose first backward node's weight is streamed, its gradient kept as two factors of 40 bytes."""
    g = graph()
    first = min(range(len(g.parameters)), key=lambda i: g.parameters[i].first)
    params = list(g.parameters)
    params[first] = replace(params[first], streamed=True, stream_bytes=40)
    return replace(g, parameters=tuple(params))


def test_a_streamed_weights_background_update_holds_its_factors_to_the_end_of_the_step() -> None:
    g = streamed_graph()
    memory = StepMemory.build(g, SGD)
    late = next(k for k, group in enumerate(memory.groups) if group.late)
    group = memory.groups[late]
    weight = g.parameters[group.parameters[0]]
    assert weight.streamed and group.grad_bytes == 40 + min(weight.bytes, 64)
    paged = memory.layout({late})
    # from the node that makes the factors to the end of the step, and nowhere before
    assert [t for t in range(g.size) if paged.behind_at(t)] == list(range(group.node, g.size))
    assert paged.gradient_peak_bytes >= max(memory.gradient_peaks) + group.grad_bytes - weight.bytes
    other = next(k for k, group in enumerate(memory.groups) if not group.late)
    assert [t for t in range(g.size) if memory.layout({other}).behind_at(t)] == [memory.groups[other].node + 1]


@pytest.mark.parametrize("io_ms", [1.0, 1000.0])
def test_a_late_update_waits_only_for_what_the_rest_of_the_backward_pass_does_not_cover(io_ms: float) -> None:
    g = streamed_graph()
    memory = StepMemory.build(g, SGD)
    late = next(k for k, group in enumerate(memory.groups) if group.late)
    n = len(memory.groups)
    costs = StateCosts((0.0,) * n, (0.0,) * n, tuple(io_ms if k == late else 0.0 for k in range(n)))
    waits = background_waits(memory, {late}, costs)
    left = sum(node.compute_ms for node in g.nodes[memory.groups[late].node + 1:])
    assert waits.by_node == {} and waits.tail_ms == pytest.approx(max(0.0, io_ms - left))
    # another update due earlier takes the thread first: what it does not leave is waited for at the end
    other = max((k for k in range(n) if k != late), key=lambda k: memory.groups[k].node)
    costs = StateCosts((0.0,) * n, (0.0,) * n, tuple(io_ms if k in (late, other) else 0.0 for k in range(n)))
    both = background_waits(memory, {late, other}, costs)
    assert both.tail_ms == pytest.approx(max(0.0, 2 * io_ms - left - sum(both.by_node.values())))


def test_a_plan_may_page_a_streamed_weights_state_and_the_simulator_agrees() -> None:
    g = streamed_graph()
    memory = StepMemory.build(g, SGD)
    late = next(group for group in memory.groups if group.late)
    plain = store_all_peak(g, SGD)
    tight = plan(g, "rpi4", memory_budget=plain - 1500, training=SGD, time_limit=30)
    assert tight.feasible and set(late.parameters) <= set(tight.schedule.step.state_on_flash)
    report = simulate(g, tight.schedule)
    assert report.peak_memory_bytes == tight.schedule.predicted_peak_bytes <= plain - 1500


def table_graph(rows: int = 32) -> TrainingGraph:
    """``graph()`` whose first layer is an embedding table of 2 MiB (1 KiB rows) looked up by ``rows`` ids."""
    g = graph()
    first = min(range(len(g.parameters)), key=lambda i: g.parameters[i].first)
    params = list(g.parameters)
    params[first] = replace(params[first], bytes=2 << 20, rows=rows, row_bytes=1024)
    return replace(g, parameters=tuple(params))


def test_a_tables_rows_not_looked_up_are_updated_from_its_lookup_and_its_looked_up_rows_stay_in_ram() -> None:
    g = table_graph()
    spec = replace(ADAMW, chunk_bytes=64 << 10)
    memory = StepMemory.build(g, spec)
    k, group = next((k, group) for k, group in enumerate(memory.groups) if group.lookup >= 0)
    table = g.parameters[group.parameters[0]]
    assert g.nodes[group.lookup].kind == "forward" and g.nodes[group.lookup].segment == g.nodes[table.last].segment
    assert group.late and group.start == group.lookup < group.node
    overlay = 32 * 1024 * 2  # the looked-up rows' two moments
    assert group.overlay_bytes == overlay
    paged, resident = memory.layout({k}), memory.layout(())
    assert paged.resident_state_bytes == resident.resident_state_bytes - group.bytes + overlay
    assert paged.paged_state_bytes == group.bytes
    # the pass over the table holds its chunks from the lookup on; before it, only the overlay is held
    assert [t for t in range(g.size) if paged.behind_at(t)] == list(range(group.lookup, g.size))
    assert paged.behind_at(group.lookup) >= 64 << 10
    assert paged.fixed_at(0) - resident.fixed_at(0) == overlay - group.bytes
    # its I/O may run beside everything from the lookup on: not waited for when that covers it
    n = len(memory.groups)
    covered = sum(node.compute_ms for node in g.nodes[group.lookup:])
    costs = StateCosts((0.0,) * n, (0.0,) * n, tuple(covered - 1 if j == k else 0.0 for j in range(n)))
    assert background_waits(memory, {k}, costs).total_ms == 0.0
    costs = StateCosts((0.0,) * n, (0.0,) * n, tuple(covered + 5 if j == k else 0.0 for j in range(n)))
    assert background_waits(memory, {k}, costs).tail_ms == pytest.approx(5.0)


def test_a_table_is_updated_by_rows_only_where_its_update_runs_in_the_backward_pass() -> None:
    g = table_graph()
    for spec in (replace(ADAMW, accumulation=2), replace(ADAMW, clip=True), replace(ADAMW, state_paging=False)):
        assert all(group.lookup < 0 for group in StepMemory.build(g, spec).groups)
    # a batch that looks up every row leaves nothing to update early
    every = table_graph(rows=2048)
    assert all(group.lookup < 0 for group in StepMemory.build(every, ADAMW).groups)


def test_a_plan_pages_a_tables_state_and_the_simulator_agrees() -> None:
    g = table_graph()
    spec = replace(ADAMW, chunk_bytes=64 << 10)
    plain = store_all_peak(g, spec)
    tight = plan(g, "rpi4", memory_budget=plain - (2 << 20), training=spec, time_limit=30)
    assert tight.feasible
    table = next(i for i, p in enumerate(g.parameters) if p.rows)
    assert table in tight.schedule.step.state_on_flash
    report = simulate(g, tight.schedule)
    assert report.peak_memory_bytes == tight.schedule.predicted_peak_bytes <= plain - (2 << 20)


def test_a_tables_rows_are_validated_and_part_of_the_fingerprint() -> None:
    g = table_graph()
    assert g.fingerprint != graph().fingerprint and g.fingerprint != table_graph(rows=16).fingerprint
    assert TrainingGraph.from_dict(g.to_dict()) == g
    data = g.to_dict()
    table = next(d for d in data["parameters"] if d["rows"])
    table["row_bytes"] = 1000  # does not divide the table
    with pytest.raises(FormatError, match="row_bytes dividing"):
        TrainingGraph.from_dict(data)


def test_the_chunk_follows_the_budget_within_bounds() -> None:
    assert chunk_for(64e6) == 64_000_000 // 256 - (64_000_000 // 256) % 4096
    assert chunk_for(1000) == 64 << 10 and chunk_for(10**12) == 4 << 20 and chunk_for(None) == 4 << 20


def test_the_plan_puts_optimizer_state_on_flash_only_when_the_budget_needs_it() -> None:
    g = graph()
    plain = store_all_peak(g, SGD)
    roomy = plan(g, "rpi4", memory_budget=plain, training=SGD)
    assert roomy.feasible and roomy.schedule.step.state_on_flash == ()
    tight = plan(g, "rpi4", memory_budget=plain - 1500, training=SGD, time_limit=30)
    assert tight.feasible and tight.schedule.step.paged_state_bytes > 0
    step = tight.schedule.step
    assert step.resident_state_bytes + step.paged_state_bytes == StepMemory.build(g, step.training).state_bytes
    assert tight.schedule.predicted_peak_bytes <= plain - 1500
    # the simulator holds the whole step to the budget: the same plan with its state in RAM would not fit
    layout = StepMemory.build(g, step.training).layout(())
    with pytest.raises(ScheduleViolation, match="beside .* the step holds"):
        simulate(g, tight.schedule.instructions, memory_budget=plain - 1500, step=layout)


def test_a_budget_below_the_whole_step_floor_is_infeasible_and_the_bounds_bracket_it() -> None:
    g = graph()
    low = memory_lower_bound(g, SGD)
    assert low > memory_lower_bound(g)  # the whole step needs more than its activations
    assert not plan(g, "rpi4", memory_budget=low - 1, training=SGD).feasible
    assert plan(g, "rpi4", memory_budget=store_all_peak(g, SGD), training=SGD).feasible


def test_a_whole_step_schedule_round_trips_and_its_plan_is_signed_with_it(tmp_path) -> None:
    from schedules.signing import generate_keypair, load_private_key, load_public_key, sign

    g = graph()
    schedule = plan(g, "rpi4", memory_budget=store_all_peak(g, SGD) - 1500, training=SGD, time_limit=30).schedule
    private, public = generate_keypair(tmp_path)
    signed = sign(schedule, load_private_key(private))
    signed.save(tmp_path / "s.json")
    again = Schedule.load(tmp_path / "s.json", public_key=load_public_key(public))
    assert again.step == schedule.step and again.schedule_id == schedule.schedule_id
    document = json.loads((tmp_path / "s.json").read_text())
    document["step"]["state_on_flash"] = ""  # claims all state is in RAM: the signature says otherwise
    (tmp_path / "t.json").write_text(json.dumps(document))
    with pytest.raises(PlannerError, match="signature"):
        Schedule.load(tmp_path / "t.json", public_key=load_public_key(public))
    assert simulate(g, again).peak_memory_bytes == schedule.predicted_peak_bytes


def test_the_optimizers_updates_add_their_measured_time_to_the_plans_step_and_its_budget() -> None:
    from schedules.device import DeviceProfile

    g = graph()
    rpi4 = DeviceProfile.builtin("rpi4")
    per_chunk, per_byte = 2e-4, 5e-7  # seconds
    measured = replace(rpi4, update_costs={SGD.update_kind: (per_chunk, per_byte), "adamw:2:2": (1.0, 1.0)})
    budget = store_all_peak(g, SGD)
    without = plan(g, rpi4, memory_budget=budget, training=SGD).schedule
    result = plan(g, measured, memory_budget=budget, training=SGD)
    chunks = sum(-(-p.bytes // SGD.chunk_bytes) for p in g.parameters)
    update = (chunks * per_chunk + g.parameter_bytes * per_byte) * 1000
    assert update > 0 and result.schedule.step.update_ms == pytest.approx(update)
    assert result.schedule.predicted_runtime_ms == pytest.approx(without.predicted_runtime_ms + update)
    assert without.step.update_ms == 0  # rpi4's built-in profile has measured no update: nothing is added
    # a runtime budget is a multiple of a plain step's time, its updates included; the nodes get the rest
    timed = plan(g, measured, memory_budget=budget, training=SGD, runtime_budget=1.5).schedule
    assert timed.runtime_budget_ms == pytest.approx(1.5 * (g.total_compute_ms + update))
    assert simulate(g, timed).runtime_ms == pytest.approx(timed.predicted_runtime_ms - update)  # within its budget
    again = Schedule.from_json(timed.to_json())
    assert again.step.update_ms == timed.step.update_ms
    # a kind of update the profile has not measured adds nothing
    other = TrainingSpec.for_optimizer("sgd", chunk_bytes=64)
    assert plan(g, measured, memory_budget=store_all_peak(g, other), training=other).schedule.step.update_ms == 0


@pytest.mark.parametrize("field, value, message", [
    ("update_ms", -1.0, "update_ms"),
    ("state_on_flash", "0-x", "parameter indices"),
    ("state_on_flash", "3,1", "ascend"),
    ("training", {"optimizer": "sgd", "clip": "yes"}, "clip must be true or false"),
    ("training", {"optimizer": "lion"}, "lion"),
    ("surprise", 1, "unknown"),
])
def test_a_malformed_step_plan_is_refused(field: str, value, message: str) -> None:
    g = graph()
    data = json.loads(plan(g, "rpi4", memory_budget=store_all_peak(g, SGD), training=SGD).schedule.to_json())
    data["step"][field] = value
    with pytest.raises(FormatError, match=message):
        Schedule.from_json(json.dumps(data))


def test_a_step_plan_naming_parameters_of_another_layout_does_not_fit_the_graph() -> None:
    g = graph()
    schedule = plan(g, "rpi4", memory_budget=store_all_peak(g, SGD), training=SGD).schedule
    stranger = replace(g, parameters=g.parameters[:-1] + (replace(g.parameters[-1], name="other"),))
    with pytest.raises(ScheduleMismatchError):
        simulate(stranger, schedule)


def test_a_graph_without_its_parameter_layout_cannot_plan_a_whole_step() -> None:
    with pytest.raises(PlannerError, match="parameter layout.*profile"):
        plan(linear_graph(4), "rpi4", memory_budget=10**6, training=SGD)


def test_parameter_layouts_are_validated_and_part_of_the_fingerprint() -> None:
    g = graph()
    assert replace(g, parameters=g.parameters[:-1]).fingerprint != g.fingerprint
    assert replace(g, runtime_bytes=12345).fingerprint == g.fingerprint
    data = g.to_dict()
    data["parameters"][0]["nodes"] = [1]  # a forward node
    with pytest.raises(FormatError, match="backward nodes"):
        TrainingGraph.from_dict(data)
    data = g.to_dict()
    data["parameters"].append(dict(data["parameters"][0]))
    with pytest.raises(FormatError, match="listed twice"):
        TrainingGraph.from_dict(data)
    assert TrainingGraph.from_dict(g.to_dict()) == g
    assert isinstance(g.parameters[0], Parameter)


def test_a_page_in_after_a_computation_is_held_to_the_next_stages_memory_as_the_milp_counts_it() -> None:
    # the executor waits for node t-1's background updates at the end of node t: a page-in issued after
    # computation t, for the computations to come, sits beside what stage t+1 holds, not stage t
    g = graph()
    layout = StepMemory.build(g, SGD).all_on_flash()
    assert layout.fixed_at(11) > layout.fixed_at(12)  # node 10's state group is updated during stage 11
    instructions = [("compute", n) for n in range(4)] + [("page_out", 3), ("compute", 4), ("free", 3)]
    instructions += [("compute", n) for n in range(5, 12)] + [("page_in", 3)]
    instructions += [("compute", n) for n in range(12, g.size)]
    report = simulate(g, instructions, step=layout)
    at = instructions.index(("page_in", 3))
    assert report.fixed_bytes[at] == layout.fixed_at(12)
    assert report.fixed_bytes[at - 1] == layout.fixed_at(11)  # computation 11 itself: its own stage's
