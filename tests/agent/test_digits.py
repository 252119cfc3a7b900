"""The digits fleet data and the federated task's small rules: pools, partitions, viewpoints, metric keys, personal layers."""

from __future__ import annotations

import pytest
import torch

from agent.digits import device_angle, device_dataset, load_digits, rotate, vendor_dataset
from agent.errors import DataError, FederationError
from agent.federated.task import METRIC_KEYS, metric_values
from agent.federated.virtual import FleetData
from common.runconfig import RunConfig


def _indices(images: torch.Tensor) -> list[int]:
    """Each upright image's index among all the digits (every image of the set is unique)."""
    x, _ = load_digits()
    where = {row.tobytes(): i for i, row in enumerate(x)}
    return [where[row.numpy().tobytes()] for row in images]


def test_devices_train_on_disjoint_partitions_and_are_tested_on_digits_nobody_trained_on() -> None:
    x, _ = load_digits()
    shares = [device_dataset(i, 4, angle=0) for i in range(4)]
    trained = [set(_indices(d.train_x)) for d in shares]
    assert sum(len(t) for t in trained) == len(set().union(*trained))  # disjoint
    assert len(set().union(*trained)) == len(x) - int(0.25 * len(x))  # the whole training pool is shared out
    held = set().union(*(_indices(d.holdout_x) for d in shares))
    assert held and not held & set().union(*trained)
    assert all(len(d.holdout_x) == FleetData().holdout for d in shares)
    again = device_dataset(1, 4, angle=0)
    assert torch.equal(again.train_x, shares[1].train_x) and torch.equal(again.holdout_y, shares[1].holdout_y)


def test_viewpoints_spread_the_devices_angles_evenly() -> None:
    assert [device_angle(i, 5, 90) for i in range(5)] == [-45.0, -22.5, 0.0, 22.5, 45.0]
    assert [device_angle(i, 4) for i in range(4)] == [0.0, 90.0, 180.0, 270.0]
    turned = device_dataset(0, 5, data=FleetData(viewpoints=90))
    assert turned.source.name.endswith("@-45deg")
    # a fleet-wide shift: the same spread about another centre, the images turned by it
    assert [device_angle(i, 3, 30, centre=90) for i in range(3)] == [75.0, 90.0, 105.0]
    assert device_angle(0, 1, 30, centre=90) == 90.0
    sideways = device_dataset(0, 5, data=FleetData(viewpoints=90, viewpoint_centre=90))
    assert sideways.source.name.endswith("@45deg")
    assert torch.allclose(sideways.train_x, rotate(turned.train_x, 90), atol=1e-5)


def test_rotation_by_a_quarter_turn_is_a_quarter_turn_and_a_full_turn_changes_nothing() -> None:
    x = torch.from_numpy(load_digits()[0][:8])
    assert torch.equal(rotate(x, 360), x)
    turned = rotate(x, 90)
    assert any(torch.allclose(turned, torch.rot90(x, k, dims=(2, 3)), atol=1e-5) for k in (1, 3))
    each = rotate(x[:2], torch.tensor([0.0, 90.0]))  # an angle per image
    assert torch.allclose(each[0], x[0], atol=1e-6) and torch.allclose(each[1], turned[1], atol=1e-6)


def test_a_small_label_alpha_gives_each_device_a_few_classes_and_its_test_digits_the_same_mix() -> None:
    fleet = [device_dataset(i, 10, data=FleetData(samples=32, label_alpha=0.1)) for i in range(10)]
    top_two = [sorted(torch.bincount(d.train_y, minlength=10).tolist())[-2:] for d in fleet]
    assert sum(sum(t) for t in top_two) / (32 * len(fleet)) > 0.6  # mostly two classes a device
    for d in fleet:
        assert set(d.holdout_y.tolist()) <= set(d.train_y.tolist())  # tested on what its own mix holds
    natural = [device_dataset(i, 10, data=FleetData(samples=32)) for i in range(10)]
    assert min(len(set(d.train_y.tolist())) for d in natural) >= 7


def test_a_fleet_larger_than_the_data_set_gets_its_samples_by_augmentation() -> None:
    data = FleetData(samples=16, label_alpha=1.0, viewpoints=90)
    devices = 200  # 3,200 digits wanted, 1,348 in the training pool
    first, last = device_dataset(0, devices, data=data), device_dataset(devices - 1, devices, data=data)
    assert len(first.train_x) == len(last.train_x) == 16
    assert not torch.equal(first.train_x, last.train_x)
    assert torch.equal(device_dataset(devices - 1, devices, data=data).train_x, last.train_x)


def test_bad_fleet_data_is_refused_with_the_setting_named() -> None:
    with pytest.raises(DataError, match="out of range"):
        device_dataset(4, 4)
    with pytest.raises(FederationError, match="samples 8 is fewer than a batch of 16"):
        device_dataset(0, 4, data=FleetData(samples=8))
    with pytest.raises(FederationError, match="label-alpha"):
        device_dataset(0, 4, data=FleetData(label_alpha=-1))
    with pytest.raises(DataError, match="set samples"):
        device_dataset(0, 400)  # a whole partition of the pool is 3 digits: fewer than a batch
    with pytest.raises(FederationError, match="quantity-skew needs samples"):
        device_dataset(0, 4, data=FleetData(quantity_skew=1.0))
    data = FleetData(32, 0.5, 90, quantity_skew=0.5)
    assert FleetData.from_run_config(RunConfig(**data.run_config())) == data


@pytest.mark.parametrize("label_alpha", [0.0, 1.0])
def test_quantity_skew_gives_devices_training_sets_of_seeded_uneven_sizes_with_their_mean_near_samples(
        label_alpha) -> None:
    data = FleetData(samples=32, label_alpha=label_alpha, quantity_skew=1.0)
    sizes = [len(device_dataset(i, 20, data=data).train_y) for i in range(20)]
    assert sizes == data.sample_counts(20, seed=0, batch_size=16)  # the partitioner gave each device its draw
    assert min(sizes) >= 16 and max(sizes) > 3 * min(sizes)  # every device a batch at least, and far from equal
    assert 0.7 * 32 < sum(sizes) / len(sizes) < 1.5 * 32
    assert [len(device_dataset(i, 20, data=data, seed=1).train_y) for i in range(20)] != sizes  # drawn by the seed
    shares = [device_dataset(i, 20, data=data) for i in range(3)]
    assert len({tuple(s.train_x.flatten()[:64].tolist()) for s in shares}) == 3  # no two devices share digits


def test_every_report_has_every_metric_key_and_no_other() -> None:
    values = metric_values(accuracy=0.5)
    assert tuple(values) == METRIC_KEYS and values["accuracy"] == 0.5 and values["energy-j"] == -1
    with pytest.raises(FederationError):
        metric_values(loss=1.0)


@pytest.mark.parametrize("samples", [16, 256])  # 256 digits on 6 devices grow the pool with turned copies
def test_a_vendor_pretrains_on_digits_no_device_holds_nor_any_turned_copy_of_them(samples) -> None:
    from agent.digits import _pool

    data = FleetData(samples=samples, label_alpha=1.0, viewpoints=90.0)
    vendor = vendor_dataset(6, data=data)
    mine = _indices(vendor.train_x)  # upright: each one a digit as shipped, once
    assert len(mine) == len(set(mine)) >= 16
    pool = _pool(6, data, 0, 16)
    digit_of_row = _indices(pool.train_x[:pool.original_count])  # row r of a grown pool copies row r % count
    held = {digit_of_row[int(r) % pool.original_count] for rows, n in zip(pool.rows, pool.counts) for r in rows[:n]}
    if samples == 16:  # without turned copies, the rows held are the devices' own images
        assert held == set().union(*(_indices(device_dataset(i, 6, data=data, angle=0).train_x) for i in range(6)))
    assert not held & set(mine)
    assert not set(_indices(vendor.holdout_x)) & set(mine)  # reported on digits it never saw


def test_no_vendor_data_is_left_where_every_device_keeps_its_whole_partition() -> None:
    with pytest.raises(DataError, match="hold all but 0 of the .* training images"):
        vendor_dataset(4, data=FleetData())


def test_residual_blocks_deepen_the_digits_model_at_its_resolution_and_leave_the_cnn_as_it_was() -> None:
    from agent.digits import RESIDUAL_BLOCKS, RESIDUAL_WIDTH, SmallCNN, residual_digits_workload

    cnn = SmallCNN()
    assert [type(m).__name__ for m in cnn.body] == ["Conv2d", "BatchNorm2d", "ReLU", "Conv2d", "BatchNorm2d", "ReLU",
                                                    "MaxPool2d", "Flatten", "Linear", "ReLU"]
    work = residual_digits_workload(0, 4)
    blocks = [m for m in work.model.body if type(m).__name__ == "ResidualBlock"]
    assert work.name == "digits-resnet" and len(blocks) == RESIDUAL_BLOCKS
    x = torch.rand(4, RESIDUAL_WIDTH, 8, 8)
    assert blocks[0].conv1.in_channels == RESIDUAL_WIDTH > cnn.body[0].out_channels
    assert blocks[0](x).shape == x.shape  # same width and resolution: the step's activations grow with depth
    assert work.model(work.inputs).shape == (4, 10)


def test_the_vendor_pretrains_the_model_it_is_given_and_its_weights_fit_that_model_alone(tmp_path) -> None:
    from agent.digits import digits_workload, residual_digits_workload
    from agent.errors import WeightsError
    from agent.vendor import pretrain
    from agent.weights import load_weights

    vendor = pretrain(3, FleetData(samples=64), 0, 3, 0.05, tmp_path / "vendor.safetensors",
                      model=residual_digits_workload)
    deep = residual_digits_workload(0)
    load_weights(deep.model, vendor.path)
    assert not torch.equal(deep.model.body[3].conv1.weight, residual_digits_workload(0).model.body[3].conv1.weight)
    with pytest.raises(WeightsError):
        load_weights(digits_workload(0).model, vendor.path)
