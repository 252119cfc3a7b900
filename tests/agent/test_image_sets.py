"""Saved image data sets as a fleet's data: CIFAR-10-like (train and test splits) and FEMNIST-like (writers).

The data sets are generated here and written with ``datasets``' own ``save_to_disk``, in the layout the Hub's
copies have (CIFAR-10: ``img`` and a ``label`` ClassLabel in ``train``/``test``; FEMNIST: one split with
``image``, ``writer_id`` and a ``character`` ClassLabel); nothing is downloaded.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

from agent.digits import device_dataset, fleet_workload
from agent.errors import DataError, FederationError
from agent.federated.virtual import FleetData
from agent.image_sets import image_set_shape, load_image_set


def _pictures(rng: np.random.Generator, n: int, side: int, mode: str, height: int | None = None) -> list[Image.Image]:
    shape = (height or side, side) if mode == "L" else (height or side, side, 3)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode) for _ in range(n)]


@pytest.fixture(scope="module")
def cifar_like(tmp_path_factory) -> str:
    """RGB 32x32 images of 4 classes, in train and test splits; each image's first pixel is its row number."""
    rng = np.random.default_rng(0)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=list("abcd"))})
    splits = {}
    for split, n in (("train", 240), ("test", 80)):
        pictures = _pictures(rng, n, 32, "RGB")
        for i, p in enumerate(pictures):  # a mark to find each image again: split and row
            p.putpixel((0, 0), (i % 256, i // 256, 0 if split == "train" else 255))
        splits[split] = datasets.Dataset.from_dict({"img": pictures, "label": [i % 4 for i in range(n)]},
                                                   features=features)
    path = tmp_path_factory.mktemp("cifar") / "cifar10"
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return str(path)


@pytest.fixture(scope="module")
def femnist_like(tmp_path_factory) -> str:
    """Grey 28x28 images of 62 classes by 6 writers (one split); each image's first pixel is its writer."""
    rng = np.random.default_rng(1)
    writers = [f"f{w:04d}" for w in (3, 1, 4, 1, 5, 9)]  # 5 distinct writers, out of order
    rows = [(w, i) for i in range(30) for w in writers]
    pictures = _pictures(rng, len(rows), 28, "L")
    for (writer, _), p in zip(rows, pictures):
        p.putpixel((0, 0), int(writer[1:]))
    features = datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                                  "character": datasets.ClassLabel(num_classes=62)})
    table = datasets.Dataset.from_dict({"image": pictures, "writer_id": [w for w, _ in rows],
                                        "character": [int(rng.integers(62)) for _ in rows]}, features=features)
    path = tmp_path_factory.mktemp("femnist") / "femnist"
    table.save_to_disk(str(path))
    return str(path)


def _marks(images: torch.Tensor) -> set[tuple[int, ...]]:
    """The first pixel of each image, as 0-255 values per channel."""
    return {tuple(round(float(v) * 255) for v in image[:, 0, 0]) for image in images}


def test_a_saved_data_set_with_splits_trains_a_model_sized_to_it_and_tests_on_its_test_split(cifar_like) -> None:
    data = FleetData(samples=32, viewpoints=0, dataset=cifar_like)
    assert image_set_shape(cifar_like).__dict__ == {"channels": 3, "side": 32, "classes": 4}
    work = fleet_workload(data, seed=0)
    assert work.name == "cifar10-cnn" and work.example[0].shape[1:] == (3, 32, 32)
    assert work.model(work.example[0]).shape == (16, 4)
    shares = [device_dataset(i, 4, data=data) for i in range(4)]
    trained = [_marks(s.train_x) for s in shares]
    assert all(len(s.train_x) == 32 for s in shares)
    assert sum(map(len, trained)) == len(set().union(*trained))  # disjoint partitions of the train split
    assert all(m[2] == 0 for t in trained for m in t)  # training images come from the train split only,
    assert all(m[2] == 255 for s in shares for m in _marks(s.holdout_x))  # held-out ones from the test split
    assert all(set(s.holdout_y.tolist()) <= set(s.train_y.tolist()) for s in shares)  # in the device's label mix
    loss = work.loss_fn(work.model(shares[0].train_x[:16]), shares[0].train_y[:16])
    assert torch.isfinite(loss)
    again = device_dataset(2, 4, data=data)
    assert torch.equal(again.train_x, shares[2].train_x) and torch.equal(again.holdout_x, shares[2].holdout_x)


def test_a_dirichlet_partition_of_a_saved_data_set_skews_each_devices_labels(cifar_like) -> None:
    skewed = [device_dataset(i, 4, data=FleetData(samples=16, label_alpha=0.1, viewpoints=0, dataset=cifar_like))
              for i in range(4)]
    even = [device_dataset(i, 4, data=FleetData(samples=16, viewpoints=0, dataset=cifar_like)) for i in range(4)]
    top = [np.bincount(s.train_y.numpy(), minlength=4).max() / 16 for s in skewed]
    assert np.mean(top) > max(np.bincount(s.train_y.numpy(), minlength=4).max() / 16 for s in even)


def test_natural_partitions_give_each_device_one_writers_images_and_hold_out_its_own(femnist_like) -> None:
    data = FleetData(viewpoints=0, dataset=femnist_like, partition_by="writer_id")
    assert fleet_workload(data).model(torch.zeros(2, 1, 28, 28)).shape == (2, 62)
    shares = [device_dataset(i, 4, data=data) for i in range(4)]
    writers = []
    for s in shares:
        train, held = _marks(s.train_x), _marks(s.holdout_x)
        assert len(train) == 1 and train == held  # one writer, tested on that writer's other images
        writers.append(next(iter(train)))
        assert len(s.holdout_x) == int(0.25 * (len(s.train_x) + len(s.holdout_x)))
    assert len(set(writers)) == 4  # every device another writer
    assert {len(s.train_x) + len(s.holdout_x) for s in shares} == {30, 60}  # f0001 wrote twice as much
    assert not any(torch.equal(a, b) for s in shares for a in s.train_x for b in s.holdout_x[:3])


def test_bad_data_sets_and_settings_say_what_to_change(tmp_path, cifar_like, femnist_like) -> None:
    with pytest.raises(DataError, match="not a saved data set.*save_to_disk"):
        image_set_shape(str(tmp_path))
    with pytest.raises(DataError, match="no column 'writer' to partition by.*writer_id"):
        load_image_set(femnist_like, partition_by="writer", partitions=2)
    with pytest.raises(DataError, match="5 distinct writer_id values, fewer than the fleet's 6 devices"):
        load_image_set(femnist_like, partition_by="writer_id", partitions=6)
    with pytest.raises(DataError, match="no label column 'labels'"):
        image_set_shape(cifar_like, "labels")
    rng = np.random.default_rng(2)
    two_labels = datasets.Dataset.from_dict(
        {"img": _pictures(rng, 4, 8, "L"), "fine": [0, 1, 2, 3], "coarse": [0, 0, 1, 1]},
        features=datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(num_classes=4),
                                    "coarse": datasets.ClassLabel(num_classes=2)}))
    two_labels.save_to_disk(str(tmp_path / "two"))
    with pytest.raises(DataError, match="2 ClassLabel columns.*name the label column"):
        image_set_shape(str(tmp_path / "two"))
    assert image_set_shape(str(tmp_path / "two"), "coarse").classes == 2
    wide = datasets.Dataset.from_dict({"img": _pictures(rng, 2, 12, "L", height=8), "label": [0, 1]},
                                      features=datasets.Features({"img": datasets.Image(),
                                                                  "label": datasets.ClassLabel(num_classes=2)}))
    wide.save_to_disk(str(tmp_path / "wide"))
    with pytest.raises(DataError, match="8x12; the fleet's model needs square images"):
        image_set_shape(str(tmp_path / "wide"))
    with pytest.raises(FederationError, match="partition-by keeps each natural id's own data"):
        device_dataset(0, 2, data=FleetData(samples=16, dataset=femnist_like, partition_by="writer_id"))
    with pytest.raises(FederationError, match="partition-by needs a dataset"):
        device_dataset(0, 2, data=FleetData(partition_by="writer_id"))


def test_a_simulated_device_federates_on_its_writers_images_under_its_budget(femnist_like) -> None:
    from flwr.app import ArrayRecord

    from agent.federated import clientapp
    from tests.test_flower_apps import Device, weights_message

    config = {"dataset": femnist_like, "partition-by": "writer_id", "viewpoints": 0.0,
              "device-classes": "small=rpi4:0.7,large=jetson-orin-nano:1"}
    devices = [Device(i, 4, **config) for i in range(2)]
    initial = devices[0].ask("query.initial", weights_message(ArrayRecord()))
    assert initial.content["model"]["name"] == "femnist-cnn"
    assert initial.content["arrays"]["head.weight"].numpy().shape == (62, 64)  # sized to the 62 characters
    replies = [d.ask("train", weights_message(initial.content["arrays"])) for d in devices]
    for reply, share in zip(replies, [clientapp.data_for(clientapp.DeviceSetup.from_context(d.context))
                                      for d in devices]):
        metrics = reply.content["metrics"]
        assert metrics["num-examples"] == 3 * 16 and metrics["steps"] == 3
        assert metrics["budget-bytes"] == -1 or metrics["peak-bytes"] <= metrics["budget-bytes"] + 8 * 2**20
        assert share.source.parent.name == "femnist" and len(_marks(share.train_x)) == 1
    assert replies[0].content["metrics"]["budget-bytes"] > 0


def test_simulate_refuses_a_data_set_that_cannot_make_the_fleet_before_anything_starts(femnist_like, capsys) -> None:
    from common.cli import main

    assert main(["simulate", "--devices", "6", "--dataset", femnist_like, "--partition-by", "writer_id"]) == 2
    assert "5 distinct writer_id values, fewer than the fleet's 6 devices" in capsys.readouterr().err
    assert main(["simulate", "--partition-by", "writer_id"]) == 2
    assert "partition-by needs a dataset" in capsys.readouterr().err
    assert main(["simulate", "--dataset", femnist_like, "--partition-by", "writer_id", "--samples", "16"]) == 2
    assert "leave samples, label-alpha and quantity-skew at 0" in capsys.readouterr().err
