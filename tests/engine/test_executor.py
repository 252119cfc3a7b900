"""The executor's guarantees: refusals, budgets kept, failures that leave the model untouched."""

from __future__ import annotations

import copy
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torchvision

from engine import pagefile
from engine.errors import InputMismatchError, PageCorruptError, ScheduleRefusedError, StepCancelled, SwapSpaceError
from engine.executor import Executor
from schedules.timeline import plan_prefetch
from schedules.budgets import memory_lower_bound, store_all_peak
from schedules.errors import SolverError
from engine.extract import extract
from schedules.plan import plan
from schedules.simulate import simulate
from tests.engine.models import (
    TinyUNet, cross_entropy, image_example, mlp, mlp_example, page_everything, recompute_everything, schedule_for,
    unet_example,
)


@pytest.fixture(scope="module")
def unet():
    torch.manual_seed(0)
    model = TinyUNet().train()
    graph, segments = extract(model, unet_example(), cross_entropy, repeats=1, refine=False)
    return model, graph, segments


@pytest.mark.parametrize("method", ["poet", "capuchin"])
@pytest.mark.parametrize("fraction", [0.9, 0.7, 0.5])
def test_ledger_never_exceeds_the_budget(unet, method, fraction, tmp_path):
    model, graph, segments = unet
    peak = store_all_peak(graph)  # M: values and workspace
    # workspaces are measured from RSS: on this small model the floor moves around 50% of M between runs
    budget = max(int(fraction * peak), memory_lower_bound(graph))
    try:
        result = plan(graph, "rpi4", method=method, memory_budget=budget, time_limit=60)
    except SolverError as exc:  # a planner bug (its plan fails the simulator) is the planner's tests' business
        pytest.skip(f"{method} at {fraction:.0%}: {exc}")
    if not result.feasible:
        pytest.skip(f"{method} finds no schedule at {fraction:.0%}: {result.message}")
    with Executor(model, segments, graph, result.schedule, swap_dir=tmp_path) as ex:
        ex.step(*unet_example())
        stats = ex.last_stats
    assert stats.ledger_peak_bytes <= result.schedule.memory_budget
    assert stats.peak_with_inflight_bytes <= result.schedule.memory_budget  # prefetch buffers included
    assert stats.ledger == stats.predicted
    model.zero_grad()


def test_schedule_for_another_model_is_refused(unet):
    model, graph, segments = unet
    other, _ = extract(mlp().train(), mlp_example(), cross_entropy, repeats=1, refine=False)
    foreign = plan(other, "rpi4", method="store-all").schedule
    with pytest.raises(ScheduleRefusedError, match="planned for graph"):
        Executor(model, segments, graph, foreign)
    with pytest.raises(ScheduleRefusedError, match="do not match these segments"):
        Executor(model, segments, other, foreign)


def test_schedule_over_its_budget_is_refused_and_other_shapes_too(unet):
    model, graph, segments = unet
    store_all = plan(graph, "rpi4", method="store-all").schedule
    over = schedule_for(graph, list(store_all.instructions))
    over = type(over)(**{**over.__dict__, "memory_budget": over.predicted_peak_bytes - 1})
    with pytest.raises(ScheduleRefusedError, match="exceed the budget"):
        Executor(model, segments, graph, over)
    with pytest.raises(InputMismatchError, match="extracted for"):
        Executor(model, segments, graph, store_all, measure_rss=False).step(*unet_example(batch=3))
    assert all(p.grad is None for p in model.parameters())


class TwoBranches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Sequential(nn.Linear(32, 8), nn.Dropout(0.5)), nn.Linear(32, 8), nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.a(x), self.b(x)], dim=1))


def test_forward_nodes_first_computed_out_of_stage_order_are_refused():
    graph, segments = extract(TwoBranches().train(), mlp_example(), cross_entropy, repeats=1, refine=False)
    names = [n.name for n in graph.nodes]
    a, b = names.index("a.0"), names.index("b")
    assert graph.predecessors[b] == (0,)  # b does not need a: a planner may order them either way
    store_all = list(plan(graph, "rpi4", method="store-all").schedule.instructions)
    swapped = [x for x in store_all if x != ("compute", b)]
    swapped.insert(swapped.index(("compute", a)), ("compute", b))
    with pytest.raises(ScheduleRefusedError, match="stage order"):
        Executor(TwoBranches(), segments, graph, schedule_for(graph, swapped))


class Saboteur(nn.Module):
    """The outside world: when armed, flips a byte in (or deletes) every page file of the swap directory."""

    def __init__(self, swap_dir: Path) -> None:
        super().__init__()
        self.swap_dir, self.mode = swap_dir, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pages = sorted(self.swap_dir.glob("poet-*.page"))
        if self.mode and pages:
            for page in pages:
                if self.mode == "delete":
                    page.unlink()
                else:
                    with open(page, "r+b") as f:
                        slots = int.from_bytes(f.read(16)[12:16], "little")
                        f.seek(pagefile.data_offset(slots))
                        first = f.read(1)
                        f.seek(pagefile.data_offset(slots))
                        f.write(bytes([first[0] ^ 0x80]))
            self.mode = None
        return x * 1.0


def _sabotaged(tmp_path):
    torch.manual_seed(0)
    saboteur = Saboteur(tmp_path)
    model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64),
                          nn.Tanh(), saboteur, nn.Linear(64, 5)).train()
    # the default cut: refined, the saboteur could be cut into its operations, whose Python (the file damage)
    # is then recorded once, not run each step
    graph, segments = extract(model, mlp_example(), cross_entropy, repeats=1, refine=False)
    schedule = schedule_for(graph, page_everything(graph))
    return model, saboteur, Executor(model, segments, graph, schedule, swap_dir=tmp_path)


@pytest.mark.parametrize("mode, error", [("flip", "checksum"), ("delete", "missing")])
def test_a_corrupt_or_missing_page_aborts_and_leaves_the_model_untouched(tmp_path, mode, error):
    model, saboteur, ex = _sabotaged(tmp_path)
    inputs, targets = mlp_example()
    ex.step(inputs, targets)  # a clean step first: gradients to keep
    grads = [p.grad.clone() for p in model.parameters()]
    state = copy.deepcopy(model.state_dict())
    rng = torch.get_rng_state()
    saboteur.mode = mode
    with pytest.raises(PageCorruptError, match=error):
        ex.step(inputs, targets)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert not list(tmp_path.glob("poet-*.page"))
    ex.step(inputs, targets)  # and the executor still works
    ex.close()


def test_page_files_stay_between_steps_and_go_at_close(tmp_path):
    model, _, ex = _sabotaged(tmp_path)
    ex.step(*mlp_example())
    kept = sorted(tmp_path.glob("poet-*.page"))
    assert len(kept) == len(ex.paged_nodes)  # one per paged node, overwritten by the next step
    inodes = [p.stat().st_ino for p in kept]
    ex.step(*mlp_example())
    assert [p.stat().st_ino for p in sorted(tmp_path.glob("poet-*.page"))] == inodes
    ex.close()
    assert not list(tmp_path.glob("poet-*.page"))


@pytest.mark.parametrize("policy", [recompute_everything, page_everything])
def test_steps_leave_nothing_of_their_autograd_graphs_behind(policy, tmp_path):
    # a value's edges and its graph's saved-tensor hooks refer to each other through C++ nodes, which Python's
    # collector cannot see: a recomputed or freed value must let go of its graph, or every step leaks one
    import gc

    from engine.store import Value

    torch.manual_seed(0)
    model = mlp().train()
    graph, segments = extract(model, mlp_example(), cross_entropy, repeats=1, refine=False)
    ex = Executor(model, segments, graph, schedule_for(graph, policy(graph)), swap_dir=tmp_path)
    try:
        for _ in range(12):
            ex.step(*mlp_example())
            model.zero_grad(set_to_none=True)
        gc.collect()
        assert sum(isinstance(o, Value) for o in gc.get_objects()) == 0
    finally:
        ex.close()


def test_full_swap_directory_fails_before_any_work(tmp_path):
    model, _, ex = _sabotaged(tmp_path)
    ex.pager.free_space = lambda path: 4096
    state = copy.deepcopy(model.state_dict())
    batch = mlp_example()
    rng = torch.get_rng_state()
    with pytest.raises(SwapSpaceError) as info:
        ex.step(*batch)
    needed = info.value.needed
    assert f"{needed:,}" in str(info.value) and "4,096 bytes free" in str(info.value)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # no forward ran
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    ex.close()


def test_paging_needs_a_swap_directory(unet):
    model, graph, segments = unet
    with pytest.raises(ScheduleRefusedError, match="swap_dir"):
        Executor(model, segments, graph, schedule_for(graph, page_everything(graph)))


def test_gradients_accumulate_across_steps_like_autograd(tmp_path):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).train()
    reference = copy.deepcopy(model)
    example = image_example()
    graph, segments = extract(model, example, cross_entropy, repeats=1, refine=False)
    ex = Executor(model, segments, graph, schedule_for(graph, page_everything(graph)), swap_dir=tmp_path)
    for _ in range(2):  # no zero_grad in between: gradient accumulation
        inputs, targets = image_example()
        rng = torch.get_rng_state()
        cross_entropy(reference(inputs), targets).backward()
        torch.set_rng_state(rng)
        ex.step(inputs, targets)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    ex.close()


def test_a_gradient_zero_but_for_its_last_element_is_accumulated_not_dropped(tmp_path):
    torch.manual_seed(0)
    model = mlp().train()
    graph, segments = extract(model, mlp_example(), cross_entropy, repeats=1, refine=False)
    ex = Executor(model, segments, graph, schedule_for(graph, recompute_everything(graph)), swap_dir=tmp_path)
    reference = copy.deepcopy(model)
    for p in (*model.parameters(), *reference.parameters()):  # odd sizes too (biases of 5 floats): the tail
        p.grad = torch.zeros_like(p)
        p.grad.view(-1)[-1] = -0.0 if p.dim() == 1 else 1.0  # -0.0: not +0 bit-wise, still adds as zero
    inputs, targets = mlp_example()
    rng = torch.get_rng_state()
    cross_entropy(reference(inputs), targets).backward()
    torch.set_rng_state(rng)
    ex.step(inputs, targets)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)
    ex.close()


def test_zeroed_gradients_are_dropped_for_the_step_and_come_back_as_zeros_on_failure(tmp_path):
    model, saboteur, ex = _sabotaged(tmp_path)
    inputs, targets = mlp_example()
    ex.step(inputs, targets)
    model.zero_grad(set_to_none=False)
    reference = copy.deepcopy(model)
    rng = torch.get_rng_state()
    cross_entropy(reference(inputs), targets).backward()  # plain autograd adds into its zeros
    torch.set_rng_state(rng)
    zeroed = [weakref.ref(p.grad) for p in model.parameters()]
    ex.step(inputs, targets)
    assert all(r() is None for r in zeroed)  # released for the step: no second copy while gradients are added
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()))
    model.zero_grad(set_to_none=False)
    layouts = [(p.grad.shape, p.grad.stride(), p.grad.dtype) for p in model.parameters()]
    saboteur.mode = "flip"
    with pytest.raises(PageCorruptError):
        ex.step(inputs, targets)
    assert [(p.grad.shape, p.grad.stride(), p.grad.dtype) for p in model.parameters()] == layouts
    assert not any(bool(p.grad.any()) for p in model.parameters())
    ex.close()


def test_read_ahead_leaves_room_for_each_nodes_workspace(tmp_path):
    torch.manual_seed(0)
    model, example = mlp(), mlp_example()
    graph, segments = extract(model, example, cross_entropy, repeats=1, refine=False)
    # fixed workspaces: the measured ones of forward nodes vary from run to run by a few hundred bytes
    graph = graph.with_nodes([replace(n, workspace_bytes=2 * n.bytes if n.kind == "backward" else 0)
                              for n in graph.nodes])
    instructions = page_everything(graph)
    report = simulate(graph, instructions)
    budget = report.peak_memory_bytes + 1000
    with Executor(model, segments, graph, schedule_for(graph, instructions, budget), swap_dir=tmp_path) as ex:
        sizes = [n.bytes for n in graph.nodes]
        held = [w + r for w, r in zip(report.working_bytes, _read_ahead_bytes(ex.prefetch, instructions, sizes))]
        assert ex.prefetch and max(held) <= budget
        assert ex.io_plan.release_by  # values written behind their frees too, in the same room
        assert max(w + x for w, x in zip(report.working_bytes, ex.io_plan.held)) <= budget
        blind = plan_prefetch(instructions, sizes, report.resident_bytes, budget)  # as if workspaces were not there
        assert max(w + r for w, r in zip(report.working_bytes, _read_ahead_bytes(blind, instructions, sizes))) > budget
        ex.step(*example)
        assert ex.last_stats.ledger_peak_bytes <= budget
        assert ex.last_stats.peak_with_inflight_bytes <= budget


def _read_ahead_bytes(starts: dict[int, list[int]], instructions, sizes) -> list[int]:
    """Bytes of pages being read ahead during each instruction, for a prefetch plan."""
    held = [0] * len(instructions)
    for start, nodes in starts.items():
        for node in nodes:
            page_in = instructions.index(("page_in", node), start)
            for position in range(max(start - 1, 0), page_in):
                held[position] += sizes[node]
    return held


def test_page_ins_fill_memory_kept_from_earlier_ones_or_freed_values_and_gradients_stay_exact(tmp_path):
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(4)], nn.Linear(64, 5))
    reference = copy.deepcopy(blocks)
    inputs, targets = torch.randn(8, 64), torch.randint(0, 5, (8,))
    # one unit per block: a block's backward needs its value (the Tanh's output), so each paged value is read back
    graph, segments = extract(blocks, (inputs, targets), cross_entropy, repeats=1,
                              segments=[str(k) for k in range(len(blocks))], refine=False)
    # computations far longer than any read here: after the first step has measured the reads, each may wait for
    # the free of a value of its size, to take over its memory
    graph = graph.with_nodes([replace(n, compute_ms=50.0) for n in graph.nodes])
    instructions = page_everything(graph)
    budget = simulate(graph, instructions).peak_memory_bytes * 4
    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    with Executor(blocks, segments, graph, schedule_for(graph, instructions, budget), swap_dir=tmp_path) as ex:
        early = len(ex.io_plan.reuse)  # before any read was measured: only memory freed before a read's earliest start
        for _ in range(3):
            optimizer.zero_grad()
            ex.step(inputs, targets)
            optimizer.step()
            reference_optimizer.zero_grad()
            cross_entropy(reference(inputs), targets).backward()
            reference_optimizer.step()
            assert all(torch.equal(p, q) for p, q in zip(blocks.parameters(), reference.parameters()))
        assert len(ex.io_plan.reuse) > early
        # blocks alike: the gradient a backward node leaves and frees has the layout of a block's paged value
        assert any(donor[0] == "free" for donor in ex.io_plan.reuse.values())
        stats = ex.last_stats
        assert stats.reads_into_kept == len(ex.io_plan.reuse)  # every planned reuse found its memory free
        # their bytes and time are the kept part of the page-ins: what the reused reads brought in, no more
        reused_bytes = sum(graph.nodes[node].bytes for _, node in ex.io_plan.reuse)
        assert stats.bytes_read_into_kept == reused_bytes
        assert 0 < stats.io_in_kept_seconds <= stats.io_in_seconds
        assert (stats.bytes_read_into_kept < stats.bytes_paged_in) == (stats.io_in_kept_seconds < stats.io_in_seconds)
        assert ex.last_stats.peak_with_inflight_bytes <= budget  # kept memory counted while it waits


def test_a_cancelled_step_stops_between_instructions_and_changes_nothing(tmp_path):
    torch.manual_seed(0)
    model, example = mlp(), mlp_example()
    graph, segments = extract(model, example, cross_entropy, repeats=1, refine=False)
    instructions = page_everything(graph)
    asked = []

    def cancel_at_the_tenth() -> bool:
        asked.append(True)
        return len(asked) >= 10

    with Executor(model, segments, graph, schedule_for(graph, instructions), swap_dir=tmp_path) as ex:
        before = copy.deepcopy(model.state_dict())
        rng = torch.get_rng_state()
        with pytest.raises(StepCancelled, match="instruction 9 of"):
            ex.step(*example, cancel=cancel_at_the_tenth)
        assert len(asked) == 10  # asked before every instruction, none run after the answer
        assert all(p.grad is None for p in model.parameters())
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        assert torch.equal(torch.get_rng_state(), rng)
        assert not list(Path(tmp_path).glob("*.page*"))  # the step's page files are gone
        ex.step(*example, cancel=lambda: False)  # and the next step runs
        assert all(p.grad is not None for p in model.parameters())
