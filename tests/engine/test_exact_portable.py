"""Exact on the device's own architecture: what the arm64 install runs under emulation (tests/arm64).

A small CNN with BatchNorm and dropout trained with SGD-momentum, and a small transformer with dropout
trained with Adam, each under recompute-everything, page-everything and POET's own schedule at a budget
between its floor and store-all's peak, train bit for bit as plain autograd does over three steps.  The
default suite runs them here on x86_64; ``make test-arm64`` runs this module on an emulated Pi 4 and
Pi 5 with the torch deploy/install.sh picks for each.
"""

from __future__ import annotations

import pytest

from schedules.budgets import memory_lower_bound
from schedules.plan import plan
from tests.engine.models import (
    TinyUNet, bert_classifier, bert_example, cross_entropy, logits_cross_entropy, page_everything,
    recompute_everything, schedule_for, unet_example,
)
from tests.engine.test_executor_exact import assert_exact


def _recompute_everything(graph):
    return schedule_for(graph, recompute_everything(graph))


def _page_everything(graph):
    return schedule_for(graph, page_everything(graph))


def _planned(graph):
    """POET's MILP halfway between the graph's floor and store-all's peak: it must recompute or page."""
    floor = memory_lower_bound(graph)
    store_all = plan(graph, "rpi4", method="store-all").schedule.predicted_peak_bytes
    result = plan(graph, "rpi4", memory_budget=(floor + store_all) // 2, time_limit=60, gap=0.05)
    assert result.feasible, result.status
    return result.schedule


SCHEDULES = {"recompute-everything": _recompute_everything, "page-everything": _page_everything,
             "planned": _planned}
MODELS = {  # model, example batch, loss, optimizer
    "cnn-batchnorm-sgd": (TinyUNet, unet_example, cross_entropy, "sgd"),
    "transformer-dropout-adam": (bert_classifier, bert_example, logits_cross_entropy, "adam"),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("model", list(MODELS))
def test_small_models_train_exactly_under_every_kind_of_schedule(model, schedule, tmp_path):
    model_fn, example_fn, loss_fn, optimizer = MODELS[model]
    ex = assert_exact(model_fn, example_fn, loss_fn, SCHEDULES[schedule], tmp_path, steps=3, optimizer=optimizer)
    ops = [op for op, _ in ex.instructions]
    computed = [node for op, node in ex.instructions if op == "compute"]
    recomputed = len(computed) > len(set(computed))
    if schedule == "page-everything":
        assert "page_in" in ops
    elif schedule == "recompute-everything":
        assert recomputed
    else:
        assert recomputed or "page_in" in ops  # below store-all's peak, something is recomputed or paged
