"""scikit-learn's 8x8 handwritten digits, split across devices that each see them from their own viewpoint.

The 1,797 digits ship inside scikit-learn (``sklearn.datasets.load_digits`` reads
a bundled file; nothing is downloaded).  :func:`device_dataset` gives device
``partition`` of ``partitions`` its own disjoint share, rotated by the device's
own angle (the viewpoint problem of edge training: a camera mounted at an angle)
and, optionally, with a skewed label mix.  The global model must serve every
viewpoint at once; a model personalized on one device only needs its own.

:class:`DigitsNet` is the small CNN the federation trains: a convolutional body
with BatchNorm (what FedBN keeps local) and a linear ``head`` (what FedPer keeps
local).  Everything is a function of its seed: every device builds the same
initial weights and the same split.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent.data import LocalDataset, _split
from agent.errors import DataError
from agent.zoo import Workload, cross_entropy

CLASSES = 10
SIDE = 8  # pixels per side
BATCH_SIZE = 16


class DigitsNet(nn.Module):
    """Two 3x3 convolutions with BatchNorm, a hidden layer, and a linear ``head`` over 10 classes."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),      # B x w x 8 x 8
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(),                                            # B x 2w*16
            nn.Linear(2 * width * 16, 64), nn.ReLU(),                                 # B x 64
        )
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def digits_workload(seed: int = 0, batch_size: int = BATCH_SIZE) -> Workload:
    """:class:`DigitsNet` at its seeded initial weights, with an example batch of the training shape."""
    torch.manual_seed(seed)
    model = DigitsNet().train()
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.rand(batch_size, 1, SIDE, SIDE, generator=generator)
    targets = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    return Workload("digits-cnn", model, inputs, targets, cross_entropy)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """All digits: ``x`` float32 ``(n, 1, 8, 8)`` scaled to [0, 1], ``y`` int64 ``(n,)``."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as exc:
        raise DataError("the digits data set comes with scikit-learn: pip install 'poet-edge[sim]'") from exc
    bunch = sklearn_digits()
    x = (bunch.images.astype(np.float32) / 16.0).reshape(-1, 1, SIDE, SIDE)
    return x, bunch.target.astype(np.int64)


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """Images ``(n, 1, H, W)`` rotated about their centre by ``degrees`` (bilinear, zeros outside)."""
    if degrees % 360 == 0:
        return x.clone()
    a = math.radians(degrees)
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(len(x), 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


def device_angle(partition: int, partitions: int) -> float:
    """Device ``partition``'s viewpoint: the devices' angles spread evenly around the circle."""
    return 360.0 * partition / partitions


def device_dataset(partition: int, partitions: int, *, angle: float | None = None, skew: float = 0.0,
                   seed: int = 0, holdout: float = 0.25, batch_size: int = BATCH_SIZE) -> LocalDataset:
    """Device ``partition``'s digits: its disjoint share, rotated by its angle, split into train and holdout.

    ``skew`` in [0, 1) biases the share towards the device's two favourite classes: each digit of
    another class is dropped with probability ``skew`` (0 keeps the natural mix).
    """
    if not 0 <= partition < partitions:
        raise DataError(f"partition {partition} out of range for {partitions} partitions")
    if not 0 <= skew < 1:
        raise DataError(f"skew must be in [0, 1); got {skew}")
    x, y = load_digits()
    rng = np.random.default_rng(seed)
    share = np.sort(rng.permutation(len(x))[partition::partitions])  # disjoint, about n / partitions each
    if skew:
        favourite = {partition % CLASSES, (partition + 1) % CLASSES}
        keep = np.array([y[i] in favourite or rng.random() >= skew for i in share])
        share = share[keep]
    degrees = device_angle(partition, partitions) if angle is None else angle
    images = rotate(torch.from_numpy(x[share]), degrees)
    labels = torch.from_numpy(y[share])
    held, train = _split(len(share), holdout, seed + partition)
    if len(train) < batch_size:
        raise DataError(f"partition {partition} of {partitions} leaves {len(train)} training digits, fewer than "
                        f"a batch of {batch_size}; use fewer partitions or a lower skew")
    return LocalDataset(train_x=images[train], train_y=labels[train], holdout_x=images[held],
                        holdout_y=labels[held], batch_size=batch_size, seed=seed + partition,
                        source=_source(partition, partitions, degrees))


def _source(partition: int, partitions: int, degrees: float) -> Path:
    """A name for the share in logs (no file backs it)."""
    return Path(f"sklearn-digits/{partition}-of-{partitions}@{degrees:.0f}deg")


def write_device_data(path: Path, partition: int, partitions: int, *, angle: float | None = None,
                      skew: float = 0.0, seed: int = 0) -> Path:
    """Device ``partition``'s digits (all of its share, seen from its angle) as a ``.npz`` data file with
    arrays ``x`` and ``y``: the data a device agent trains on (``[data] path``) with the
    ``agent.digits:digits_workload`` model.  The agent splits off its own held-out part."""
    data = device_dataset(partition, partitions, angle=angle, skew=skew, seed=seed)
    x = torch.cat([data.train_x, data.holdout_x]).numpy()
    y = torch.cat([data.train_y, data.holdout_y]).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:  # a file object: np.savez would append .npz to a name without it
        np.savez(out, x=x, y=y)
    return path
