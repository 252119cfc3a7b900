"""The digits fleet data and the federated task's small rules: shares, viewpoints, metric keys, personal layers."""

from __future__ import annotations

import pytest
import torch

from agent.digits import DigitsNet, device_dataset, load_digits, rotate
from agent.errors import DataError, FederationError
from agent.fedtask import METRIC_KEYS, metric_values, personal_keys


def test_devices_get_disjoint_shares_of_every_digit_each_from_its_own_angle() -> None:
    x, _ = load_digits()
    shares = [device_dataset(i, 4) for i in range(4)]
    assert sum(len(d.train_x) + len(d.holdout_x) for d in shares) == len(x)  # every digit once
    assert shares[0].source.name.endswith("@0deg") and shares[1].source.name.endswith("@90deg")
    again = device_dataset(1, 4)
    assert torch.equal(again.train_x, shares[1].train_x)  # a function of the seed
    assert len(set(shares[2].train_y.tolist())) == 10


def test_rotation_by_a_quarter_turn_is_a_quarter_turn_and_a_full_turn_changes_nothing() -> None:
    x = torch.from_numpy(load_digits()[0][:8])
    assert torch.equal(rotate(x, 360), x)
    turned = rotate(x, 90)
    assert any(torch.allclose(turned, torch.rot90(x, k, dims=(2, 3)), atol=1e-5) for k in (1, 3))


def test_a_skewed_share_favours_two_classes_and_bad_arguments_are_refused() -> None:
    skewed = device_dataset(3, 4, skew=0.9)
    labels = torch.cat([skewed.train_y, skewed.holdout_y])
    assert int(((labels == 3) | (labels == 4)).sum()) > len(labels) / 2
    with pytest.raises(DataError):
        device_dataset(4, 4)
    with pytest.raises(DataError):
        device_dataset(0, 400)  # too few digits for a batch


def test_every_report_has_every_metric_key_and_no_other() -> None:
    values = metric_values(accuracy=0.5)
    assert tuple(values) == METRIC_KEYS and values["accuracy"] == 0.5 and values["energy-j"] == -1
    with pytest.raises(FederationError):
        metric_values(loss=1.0)


def test_personal_layers_are_the_head_for_fedper_and_batchnorm_for_fedbn() -> None:
    model = DigitsNet()
    assert personal_keys(model, "fedper") == {"head.weight", "head.bias"}
    fedbn = personal_keys(model, "fedbn")
    assert "body.1.running_mean" in fedbn and "body.1.weight" in fedbn and "body.0.weight" not in fedbn
    assert personal_keys(model, "finetune") == frozenset()
    with pytest.raises(FederationError):
        personal_keys(model, "fedprox")
