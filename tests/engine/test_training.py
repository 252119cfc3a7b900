"""The one training path: updates in the backward pass, optimizer state on flash, the whole step's memory checked.

Every test trains a model and its copy side by side: the copy with plain ``loss.backward()``,
``clip_grad_norm_(foreach=False)`` where clipping is on, and the same optimizer's ``step()`` run per tensor;
parameters, buffers and optimizer state must then be equal bit for bit.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
import torch

from engine.errors import MemoryBoundError, ScheduleRefusedError, UpdateInterrupted
from engine.extract import extract, segments_matching
from engine.optim.chunks import EXACT_COLUMNS
from engine.optim.modes import ApplyNow, ByRows, HoldForClipping, InBackground
from engine.parity import bits_equal
from engine.training import OptimizerSettings, Training
from agent.zoo import Workload, logits_cross_entropy
from tests.engine.models import (TiedLM, bert_classifier, bert_example, cross_entropy, leaky_mlp, mlp, mlp_example,
                                page_everything, recompute_everything, tied_example, whole_step_schedule, WideHead,
                                wide_example)

SETTINGS = {
    "sgd momentum": OptimizerSettings("sgd", learning_rate=0.05, momentum=0.9),
    "sgd nesterov weight decay": OptimizerSettings("sgd", learning_rate=0.05, momentum=0.9, nesterov=True,
                                                   weight_decay=1e-3),
    "adam weight decay": OptimizerSettings("adam", learning_rate=1e-2, weight_decay=1e-3),
    "adamw": OptimizerSettings("adamw", learning_rate=1e-2, weight_decay=1e-2),
}
POLICIES = {"recompute": recompute_everything, "page": page_everything}


def train_side_by_side(model_fn: Callable, example_fn: Callable, settings: OptimizerSettings, policy: Callable,
                       swap: Path, *, steps: int = 3, on_flash: bool = True, chunk: int = 4096,
                       loss_fn: Callable = cross_entropy) -> Training:
    """``steps`` steps through :class:`Training` and plain PyTorch from the same weights, batches and RNG;
    asserts equality after each."""
    torch.manual_seed(0)
    model = model_fn().train()
    reference = copy.deepcopy(model)
    graph, segments = extract(model, example_fn(), loss_fn, repeats=1, refine=False)
    schedule = whole_step_schedule(graph, policy(graph), settings.spec(chunk_bytes=chunk), on_flash=on_flash)
    training = Training(Workload("test", model, *example_fn(), loss_fn), graph, segments, schedule, settings,
                        swap, check_memory=False)
    optimizer = settings.build(reference.parameters())
    try:
        for _ in range(steps):
            batches = [example_fn() for _ in range(settings.accumulation)]
            rng = torch.get_rng_state()
            for inputs, targets in batches:
                loss_fn(reference(inputs), targets).backward()
            if settings.clip is not None:
                torch.nn.utils.clip_grad_norm_(reference.parameters(), settings.clip_norm, foreach=False)
            optimizer.step()
            optimizer.zero_grad()
            after = torch.get_rng_state()
            torch.set_rng_state(rng)
            training.step(batches)
            assert torch.equal(torch.get_rng_state(), after)
            assert_same(model, reference, training, optimizer)
    except BaseException:
        training.close()
        raise
    return training


def built(model_fn: Callable, settings: OptimizerSettings, policy: Callable, swap: Path, **options) -> Training:
    """``model_fn()``'s training under a hand-made whole-step schedule (``policy``), every state chunk on flash."""
    torch.manual_seed(0)
    model = model_fn().train()
    graph, segments = extract(model, mlp_example(), cross_entropy, repeats=1, refine=False)
    schedule = whole_step_schedule(graph, policy(graph), settings.spec(chunk_bytes=4096))
    return Training(Workload("test", model, *mlp_example(), cross_entropy), graph, segments, schedule, settings, swap,
                    **options)


def assert_same(model: torch.nn.Module, reference: torch.nn.Module, training: Training,
                optimizer: torch.optim.Optimizer) -> None:
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert bits_equal(a, b), name
    ours, theirs = training.fused.state_dict(), optimizer.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        assert ours["state"][index].keys() == state.keys()
        for key, value in state.items():
            assert bits_equal(ours["state"][index][key], value), f"optimizer state {index}.{key}"
    assert all(p.grad is None for p in model.parameters())  # applied and freed, every one


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("optimizer", SETTINGS)
def test_updates_in_the_backward_pass_are_exact(optimizer: str, policy: str, tmp_path: Path) -> None:
    training = train_side_by_side(mlp, mlp_example, SETTINGS[optimizer], POLICIES[policy], tmp_path)
    try:  # every state chunk on flash: updated on the update thread, beside the next backward node
        assert {type(s.mode) for s in training.fused.slots} == {InBackground}
    finally:
        training.close()


@pytest.mark.parametrize("optimizer", ["sgd momentum", "adamw"])
def test_accumulation_over_micro_batches_is_exact(optimizer: str, tmp_path: Path) -> None:
    settings = OptimizerSettings(**{**SETTINGS[optimizer].__dict__, "accumulation": 3})
    training = train_side_by_side(mlp, mlp_example, settings, page_everything, tmp_path)
    try:  # the update thread runs only beside a single micro-batch's backward pass
        assert {type(s.mode) for s in training.fused.slots} == {ApplyNow}
    finally:
        training.close()


@pytest.mark.parametrize("optimizer", ["sgd nesterov weight decay", "adam weight decay"])
def test_clipping_by_global_norm_is_exact(optimizer: str, tmp_path: Path) -> None:
    settings = OptimizerSettings(**{**SETTINGS[optimizer].__dict__, "clip_norm": 0.05, "accumulation": 2})
    training = train_side_by_side(mlp, mlp_example, settings, recompute_everything, tmp_path)
    try:  # one mode for the whole step: it takes the total norm over every held gradient
        (mode,) = {id(s.mode): s.mode for s in training.fused.slots}.values()
        assert isinstance(mode, HoldForClipping)
    finally:
        training.close()


@pytest.mark.parametrize("optimizer", ["sgd momentum", "adamw"])
def test_tied_weights_are_updated_once_after_their_last_contribution(optimizer: str, tmp_path: Path) -> None:
    training = train_side_by_side(TiedLM, tied_example, SETTINGS[optimizer], page_everything, tmp_path)
    try:
        (tied,) = [p for p in training.graph.parameters if len(p.nodes) > 1]
        assert tied.name == "embed.weight"
    finally:
        training.close()


def test_optimizer_state_in_ram_is_exact_too(tmp_path: Path) -> None:
    training = train_side_by_side(mlp, mlp_example, SETTINGS["adamw"], recompute_everything, tmp_path, on_flash=False)
    try:
        assert training.pages is None and training.fused.resident_state_bytes > 0
        assert {type(s.mode) for s in training.fused.slots} == {ApplyNow}
    finally:
        training.close()


@pytest.mark.parametrize("features, chunk", [(1024, 1 << 20), (1090, 45 * 2048 * 4)])
def test_a_large_weight_streams_its_gradient_in_blocks_and_stays_exact(tmp_path: Path, features: int,
                                                                        chunk: int) -> None:
    # 45 columns a chunk, 1090 in all: narrow blocks and a 10-column tail, which BLAS computes with other
    # kernels than the whole product's; the blocks are widened and the tail joined so that no bit changes
    training = train_side_by_side(partial(WideHead, features), partial(wide_example, features=features),
                                  SETTINGS["sgd momentum"], page_everything, tmp_path, chunk=chunk)
    try:
        (streamed,) = [p for p in training.graph.parameters if p.streamed]
        assert streamed.name == "wide.weight" and streamed.block_bytes == 2048 * 4 * EXACT_COLUMNS
        bounds = training.fused.chunking_of(training.model.wide.weight).bounds
        assert all(start % EXACT_COLUMNS == 0 and end - start >= EXACT_COLUMNS for start, end in bounds)
        assert bounds[-1][1] == features
        # the 8 MiB gradient never existed whole: its two factors wait for the background update, which makes
        # and applies it a block at a time, as the plan holds memory for
        assert 0 < streamed.stream_bytes < 1 << 20
        assert training.fused.peak_grad_bytes <= streamed.stream_bytes + 2 * streamed.chunk_bytes(chunk)
        assert training.fused.peak_grad_bytes <= training.schedule.step.gradient_peak_bytes
        assert training.pages.bytes_out > 8 << 20  # its momentum went to flash, block by block
    finally:
        training.close()


TABLE_VOCAB, TABLE_WIDTH = 4096, 64  # 1 MiB of embedding table: its state is a group of its own


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("optimizer", SETTINGS)
def test_an_embedding_table_is_updated_by_rows_from_its_lookup_and_stays_exact(optimizer: str, policy: str,
                                                                               tmp_path: Path) -> None:
    # the rows a batch does not look up have a zero gradient: their update runs in the background from the lookup
    # on, the looked-up rows' at the end, their state held in RAM until the next step's pass puts it back
    model_fn = partial(bert_classifier, hidden=TABLE_WIDTH, vocab=TABLE_VOCAB)
    example_fn = partial(bert_example, vocab=TABLE_VOCAB)
    training = train_side_by_side(model_fn, example_fn, SETTINGS[optimizer], POLICIES[policy], tmp_path, steps=4,
                                  loss_fn=logits_cross_entropy)
    try:
        table = [p for p in training.graph.parameters if p.rows]
        names = {p.name for p in table}
        assert "bert.embeddings.word_embeddings.weight" in names
        assert all(0 < p.rows <= 2 * 16 for p in table)  # at most a batch's ids
        (slot,) = [s for s in training.fused.slots if s.table is not None]
        assert slot.name == "bert.embeddings.word_embeddings.weight" and isinstance(slot.mode, ByRows)
        # between steps the looked-up rows' state is in RAM, counted and planned as optimizer state
        assert 0 < slot.table.overlay_bytes <= training.schedule.step.resident_state_bytes
        assert training.fused.resident_state_bytes <= training.schedule.step.resident_state_bytes
        assert training.pages.bytes_out >= 4 * slot.param.nbytes  # the whole table's state went to flash each step
    finally:
        training.close()


def test_a_checkpoint_of_a_table_updated_by_rows_holds_its_newest_rows(tmp_path: Path) -> None:
    model_fn = partial(bert_classifier, hidden=TABLE_WIDTH, vocab=TABLE_VOCAB)
    example_fn = partial(bert_example, vocab=TABLE_VOCAB)
    settings = SETTINGS["adamw"]
    training = train_side_by_side(model_fn, example_fn, settings, page_everything, tmp_path / "a", steps=2,
                                  loss_fn=logits_cross_entropy)
    try:
        saved = copy.deepcopy({"model": training.model.state_dict(), "optimizer": training.fused.state_dict()})
        batch = example_fn()
        torch.manual_seed(1)  # dropout's
        training.step([batch])
        expected = {k: v.clone() for k, v in training.model.state_dict().items()}
        # another process restores the checkpoint: its first step must give the same bits
        torch.manual_seed(0)
        model = model_fn().train()
        workload = Workload("test", model, *example_fn(), logits_cross_entropy)
        restored = Training(workload, training.graph, segments_matching(workload, training.graph),
                            training.schedule, settings, tmp_path / "b", check_memory=False)
        try:
            restored.load_state(saved)
            torch.manual_seed(1)
            restored.step([batch])
            for name, value in restored.model.state_dict().items():
                assert bits_equal(value, expected[name]), name
        finally:
            restored.close()
    finally:
        training.close()


def test_a_step_is_checked_part_by_part_and_a_leak_is_named(tmp_path: Path) -> None:
    training = built(leaky_mlp, SETTINGS["sgd momentum"], recompute_everything, tmp_path, tolerance_bytes=2_000_000)
    model, schedule = training.model, training.schedule
    try:
        report = training.step([mlp_example()])
        predicted = schedule.step.parts()
        for part, value in report.parts.items():
            assert value <= predicted[part], part
        model[2].leak_bytes = 24_000_000  # the model's own code keeps 24 MB more at every step
        with pytest.raises(MemoryBoundError) as error:
            training.step([mlp_example()])
        assert error.value.part == "other" and "outside them" in str(error.value)
        assert error.value.report.memory_bytes > schedule.memory_budget  # the step ran (and was applied)
    finally:
        training.close()


def test_a_schedule_for_activations_or_for_another_optimizer_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = mlp().train()
    graph, segments = extract(model, mlp_example(), cross_entropy, repeats=1, refine=False)
    from tests.engine.models import schedule_for

    work = Workload("mlp", model, *mlp_example(), cross_entropy)
    activations_only = schedule_for(graph, recompute_everything(graph), budget=10**9)
    with pytest.raises(ScheduleRefusedError, match="activations only"):
        Training(work, graph, segments, activations_only, SETTINGS["adamw"], tmp_path)
    for_sgd = whole_step_schedule(graph, recompute_everything(graph), SETTINGS["sgd momentum"].spec(chunk_bytes=4096))
    with pytest.raises(ScheduleRefusedError, match="optimizer 'sgd'.*configured 'adamw'"):
        Training(work, graph, segments, for_sgd, SETTINGS["adamw"], tmp_path)


def test_a_cancel_after_the_first_update_lets_the_step_finish(tmp_path: Path) -> None:
    training = built(mlp, SETTINGS["adamw"], page_everything, tmp_path, check_memory=False)
    model = training.model
    try:
        before = [p.detach().clone() for p in model.parameters()]
        asked: list[bool] = []

        def cancel() -> bool:  # asked before every instruction; says yes once updates may have begun
            asked.append(training.fused.started)
            return training.fused.started

        training.step([mlp_example()], cancel)
        assert any(asked) and not all(asked)
        assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # the step was applied
    finally:
        training.close()


def test_a_failure_after_updates_began_is_reported_as_interrupted(tmp_path: Path) -> None:
    training = built(mlp, SETTINGS["sgd momentum"], page_everything, tmp_path, check_memory=False)
    try:
        training.step([mlp_example()])  # every parameter's momentum is on flash now
        for page in tmp_path.glob("poet-*-s*.page"):
            data = bytearray(page.read_bytes())
            data[4096 + 10] ^= 0xFF  # flash returning other bytes than it was given (data follows the header)
            page.write_bytes(bytes(data))
        with pytest.raises(UpdateInterrupted, match="restore it from the last checkpoint"):
            training.step([mlp_example()])
    finally:
        training.close()


def test_a_federated_round_trains_with_the_configured_optimizer_under_the_same_check(tmp_path: Path) -> None:
    import numpy as np

    from agent.data import open_dataset
    from agent.federated.task import DevicePlan, Task
    from schedules.budgets import memory_lower_bound

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "data.npz", x=rng.normal(size=(64, 32)).astype(np.float32), y=rng.integers(0, 5, 64))
    data = open_dataset(tmp_path / "data.npz", (8, 32), holdout=0.0)
    torch.manual_seed(0)
    model = leaky_mlp().train()
    settings = SETTINGS["adam weight decay"]
    task = Task(Workload("leaky", model, *mlp_example(), cross_entropy), tmp_path / "swap", settings=settings,
                tolerance_bytes=2_000_000)
    # a budget below a plain step's, halfway to the least any schedule could need (which extraction measures:
    # 0.9 of plain's was once 99 B under it)
    floor = memory_lower_bound(task.graph, settings.spec())
    planned = task.plan("rpi4", (floor + task.plain_peak_bytes) // 2)
    assert planned.schedule.step.training.optimizer == "adam"
    start = {k: v.clone() for k, v in task.initial.items()}
    reference = copy.deepcopy(model)
    reference.load_state_dict(start)
    outcome = task.train(start, data, planned, steps=3)
    optimizer = settings.build(reference.parameters())
    position = (0, 0)
    for _ in range(3):
        inputs, targets = data.batch(*position)
        cross_entropy(reference(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        position = data.position_after(*position)
    for key, value in reference.state_dict().items():
        assert bits_equal(outcome.weights[key], value), key
    assert 0 < outcome.peak_bytes <= planned.schedule.memory_budget + 2_000_000
    model[2].leak_bytes = 24_000_000
    with pytest.raises(MemoryBoundError, match="outside them"):
        task.train(start, data, planned, steps=2)
    with pytest.raises(ScheduleRefusedError, match="planned for other training"):
        task.adopt(DevicePlan("rpi4", None, Task(task.workload, tmp_path / "s2", graph=task.graph,
                                                 segments=task.segments).plan("rpi4", None).schedule))


UPDATES_IN_A_FRESH_PROCESS = """
import json, sys
import torch
from engine.optim.rules import rule_for, warm_up
from engine.training import OptimizerSettings

def file_backed_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssFile"))

settings = OptimizerSettings(sys.argv[1], learning_rate=0.01, momentum=0.9)
if sys.argv[2] == "warm":
    warm_up(settings.build([torch.zeros(1 << 16, requires_grad=True)]))
param, grad = torch.randn(1 << 18, requires_grad=True), torch.randn(1 << 18)
optimizer = settings.build([param])
rule, state = rule_for(optimizer, optimizer.param_groups[0]), {}
tensors, grown = [None] * len(rule.state_names), []
for _ in range(2):
    before = file_backed_kib()
    rule.begin(state, param.detach())
    tensors = list(rule.update(state, param.detach(), grad, tensors))
    grown.append(file_backed_kib() - before)
print(json.dumps(grown))
"""


def test_warming_up_an_optimizer_faults_in_its_first_and_later_updates_code_before_a_step_would() -> None:
    """What a fresh worker's steps would otherwise count and the worker that profiled never does: the code of
    the first update's kernels and of a later update's (SGD's momentum is a clone, then a multiply-add)."""
    def grown(mode: str) -> list[int]:
        done = subprocess.run([sys.executable, "-c", UPDATES_IN_A_FRESH_PROCESS, "sgd", mode], check=True,
                              capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=120)
        return json.loads(done.stdout.splitlines()[-1])

    assert sum(grown("cold")) >= 256  # kiB: the measurement sees the code a cold process faults in ...
    assert grown("warm") == [0, 0]  # ... and after the warm-up neither update faults in any
