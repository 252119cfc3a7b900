"""Parity checks: the executor's step against plain autograd on a copy, as `validate --check-exact` runs it."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

from engine.executor import Executor
from engine.parity import bits_equal, check_parity
from agent.zoo import Workload, cross_entropy, load_workload
from common.cli import main
from common.exit_codes import ExitCode
from engine.extract import extract
from tests.engine.models import page_everything, recompute_everything, schedule_for


def test_bits_equal_tells_nans_and_signed_zeros_apart():
    nan = torch.tensor([float("nan"), 1.0])
    assert bits_equal(nan, nan.clone()) and not torch.equal(nan, nan.clone())
    assert not bits_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bits_equal(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not bits_equal(torch.ones(2), torch.ones(1, 2))
    assert bits_equal(torch.arange(3), torch.arange(3)) and not bits_equal(torch.arange(3), torch.arange(1, 4))
    assert bits_equal(None, None) and not bits_equal(None, torch.zeros(1))


class SystemNoise(nn.Module):
    """Scales by bytes from the operating system's entropy (``os.urandom``): no generator's state replays them,
    so a plain step and the executor's step, or a computation and its recomputation, differ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (1.0 + int.from_bytes(os.urandom(2), "little") / 65536)


class OutsideNoise(nn.Module):
    """Scales by numbers from NumPy's global generator and Python's ``random``, as model code draws them
    (Wav2Vec2's SpecAugment masks come from NumPy's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(1.0 + np.random.rand()) * (1.0 + random.random())


def noisy_workload() -> Workload:
    """A factory for ``poet-edge validate --module``: a model whose steps are not reproducible."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), SystemNoise(), nn.ReLU(), nn.Linear(32, 4)).train()
    return Workload("noisy", model, torch.randn(8, 16), torch.randint(0, 4, (8,)), cross_entropy)


def _executor(workload: Workload, schedule_of, swap_dir) -> Executor:
    graph, segments = extract(workload.model, workload.example, workload.loss_fn, repeats=1, refine=False)
    return Executor(workload.model, segments, graph, schedule_for(graph, schedule_of(graph)), swap_dir=swap_dir)


@pytest.mark.parametrize("schedule_of", [page_everything, recompute_everything])
def test_paging_and_recomputing_steps_with_dropout_and_batchnorm_are_exact(schedule_of, tmp_path):
    workload = load_workload("unet", (2, 3, 16, 16))
    with _executor(workload, schedule_of, tmp_path) as ex:
        report = check_parity(ex, workload)
    model = workload.model
    assert report.exact, report.mismatched
    assert report.compared == 2 + len(list(model.parameters())) + len(list(model.buffers()))
    assert all(p.grad is not None for p in model.parameters())  # the executor's step's gradients stay
    assert "bit-identical" in report.summary()


def test_a_step_that_is_not_reproducible_is_reported_with_what_differs(tmp_path):
    workload = noisy_workload()
    with _executor(workload, recompute_everything, tmp_path) as ex:
        report = check_parity(ex, workload)
    assert not report.exact
    assert "loss" in report.mismatched and "0.weight.grad" in report.mismatched
    assert "RNG state" not in report.mismatched  # torch's generator was not touched
    assert report.summary().startswith(f"DIFFERENT from plain autograd in {len(report.mismatched)} of")


def _profile_and_plan(tmp_path, model_options: list[str]) -> tuple[str, str]:
    graph, schedule = str(tmp_path / "g.json"), str(tmp_path / "s.json")
    assert main(["profile", *model_options, "--swap-dir", str(tmp_path / "swap"), "-o", graph,
                 "--device-out", str(tmp_path / "d.json"), "--repeats", "1"]) == ExitCode.OK
    assert main(["solve", graph, "--baseline", "checkpoint-all", "-o", schedule]) == ExitCode.OK
    return graph, schedule


def test_validate_check_exact_passes_on_a_zoo_model(tmp_path, capsys):
    options = ["--model", "unet", "--input", "1x3x8x8"]
    graph, schedule = _profile_and_plan(tmp_path, options)
    capsys.readouterr()
    assert main(["validate", *options, "--schedule", schedule, "--graph", graph, "--steps", "1",
                 "--check-exact"]) == ExitCode.OK
    assert "bit-identical to plain autograd" in capsys.readouterr().out


def test_validate_check_exact_fails_with_its_own_exit_code(tmp_path, capsys):
    options = ["--module", "tests.engine.test_parity:noisy_workload"]
    graph, schedule = _profile_and_plan(tmp_path, options)
    capsys.readouterr()
    code = main(["validate", *options, "--schedule", schedule, "--graph", graph, "--steps", "1", "--check-exact"])
    assert code == ExitCode.NOT_EXACT
    captured = capsys.readouterr()
    assert "DIFFERENT from plain autograd" in captured.out and "not exact" in captured.err


@pytest.mark.parametrize("schedule_of", [recompute_everything, page_everything])
def test_numbers_drawn_from_numpy_and_pythons_random_are_replayed_on_recomputation(schedule_of, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), OutsideNoise(), nn.ReLU(), nn.Linear(32, 4)).train()
    workload = Workload("outside", model, torch.randn(8, 16), torch.randint(0, 4, (8,)), cross_entropy)
    np.random.seed(3)
    random.seed(3)
    with _executor(workload, schedule_of, tmp_path) as ex:
        for _ in range(3):  # the first step learns which units draw; the later ones replay only those
            report = check_parity(ex, workload)
            assert report.exact, report.mismatched
        assert len(ex.runtime.replay.drawing_outside) == 1  # the noise's unit, found in the first step
