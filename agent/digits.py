"""The fleet's image data: scikit-learn's 8x8 digits or a saved data set, split across devices with their own view.

The 1,797 digits ship inside scikit-learn (``sklearn.datasets.load_digits`` reads
a bundled file; nothing is downloaded); a run config's ``dataset`` names a data set
saved by Hugging Face ``datasets`` instead (FEMNIST, CIFAR-10; :mod:`agent.image_sets`).
:func:`device_dataset` gives device ``partition`` of ``partitions`` its partition of a
training pool and held-out images from a test pool, as
:class:`~agent.federated.virtual.FleetData` says (how many, how skewed the label mix),
rotated by the device's own angle (the viewpoint problem of edge training: a camera
mounted at an angle).  Under natural partitioning (``partition-by``) a device is one
natural id (a writer) and is tested on its own held-out images.  The global model must
serve every device at once; a model personalized on one device only needs its own.

:class:`SmallCNN` is the small CNN the federation trains, sized to the images
(:func:`fleet_workload`): a convolutional body with BatchNorm (what FedBN keeps local)
and a linear ``head`` (what FedPer keeps local).  Everything is a function of its seed:
every device builds the same initial weights and the same split.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent.data import LocalDataset
from agent.errors import DataError
from agent.federated.virtual import STDLIB_TEXT, FleetData
from agent.image_sets import ImageSet, ImageShape, image_set_shape, load_image_set
from agent.stdlib_text import device_text, text_workload
from agent.zoo import Workload, cross_entropy

CLASSES = 10
SIDE = 8  # pixels per side
BATCH_SIZE = 16
DIGITS = ImageShape(1, SIDE, CLASSES)
# :func:`residual_digits_workload`: 24 channels (not the CNN's 16) so that the step's activations outgrow
# the runtime's own few MB: its smallest budget is then well under a third of a plain step's memory
RESIDUAL_BLOCKS, RESIDUAL_WIDTH, RESIDUAL_NAME = 8, 24, "digits-resnet"


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a skip connection, at the same width and resolution."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.norm2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu2(x + self.norm2(self.conv2(self.relu1(self.norm1(self.conv1(x))))))


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with BatchNorm, a hidden layer, and a linear ``head`` over the classes.

    Sized to the images: an image wider than 16 pixels is halved after the first convolution until it is
    not, so the hidden layer stays small (the digits' 8x8 take no extra pooling).  ``blocks`` residual blocks
    between the two convolutions make it deeper at the same resolution: a step then holds mostly activations,
    as a larger model's does (the demo's model)."""

    def __init__(self, shape: ImageShape = DIGITS, width: int = 16, blocks: int = 0) -> None:
        super().__init__()
        side, shrink = shape.side, []
        while side > 16:
            shrink.append(nn.MaxPool2d(2))
            side //= 2
        self.body = nn.Sequential(
            nn.Conv2d(shape.channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), *shrink,
            *(ResidualBlock(width) for _ in range(blocks)),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(),                                          # B x 2w * (side/2)^2
            nn.Linear(2 * width * (side // 2) ** 2, 64), nn.ReLU(),                 # B x 64
        )
        self.head = nn.Linear(64, shape.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def digits_workload(seed: int = 0, batch_size: int = BATCH_SIZE, tuning: str = "",
                    shape: ImageShape = DIGITS, name: str = "digits-cnn", blocks: int = 0,
                    width: int = 16) -> Workload:
    """:class:`SmallCNN` for ``shape`` (the digits'), ``width`` channels wide, with ``blocks`` residual blocks at
    its seeded initial weights, with an example batch of the training shape; with ``tuning`` (the name of a
    strategy that tunes part of the model: :attr:`agent.personalization.Strategy.partial_tuning`) only what it
    fine-tunes is trainable."""
    torch.manual_seed(seed)
    model = SmallCNN(shape, width, blocks).train()
    if tuning:
        from agent.personalization import strategy

        strategy(tuning).freeze(model)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.rand(batch_size, shape.channels, shape.side, shape.side, generator=generator)
    targets = torch.randint(0, shape.classes, (batch_size,), generator=generator)
    return Workload(name, model, inputs, targets, cross_entropy)


def residual_digits_workload(seed: int = 0, batch_size: int = BATCH_SIZE, tuning: str = "") -> Workload:
    """The digits' :class:`SmallCNN`, :data:`RESIDUAL_WIDTH` channels wide, with :data:`RESIDUAL_BLOCKS` residual
    blocks (``agent.digits:residual_digits_workload``, model ``digits-resnet``): the demo's, whose plain step
    is mostly activations, so that a budget a third of it still holds the weights, gradients and the runtime's
    own memory."""
    return digits_workload(seed, batch_size, tuning, name=RESIDUAL_NAME, blocks=RESIDUAL_BLOCKS,
                           width=RESIDUAL_WIDTH)


def fleet_workload(data: FleetData, seed: int = 0, batch_size: int = BATCH_SIZE, tuning: str = "",
                   initial_weights: str = "", adapters: bool = True) -> Workload:
    """The model a fleet with ``data`` trains: the digits' :class:`SmallCNN`, or one sized to its data set, at
    its seeded weights or, with ``initial_weights`` (a weights file: :func:`agent.weights.read_state`), at those
    (a pretrained start; a file for another model is a :class:`~agent.errors.WeightsError`).  The standard
    library's text (:mod:`agent.stdlib_text`) trains a byte-level decoder with LoRA ``adapters`` (without: its
    base, as a vendor pretrains it); ``initial_weights`` are then the base's."""
    if data.dataset == STDLIB_TEXT:
        if tuning:
            raise DataError(f"{STDLIB_TEXT} trains LoRA adapters alone: a strategy that tunes part of the model "
                            f"({tuning}) has nothing left to freeze; use finetune")
        return text_workload(seed, batch_size, adapters=adapters, initial_weights=initial_weights)
    if not data.dataset:
        work = digits_workload(seed, batch_size, tuning)
    else:
        shape = image_set_shape(data.dataset, data.label_column)
        work = digits_workload(seed, batch_size, tuning, shape, f"{Path(data.dataset).name}-cnn")
    if initial_weights:
        from agent.weights import load_weights

        load_weights(work.model, Path(initial_weights))
    return work


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """All digits: ``x`` float32 ``(n, 1, 8, 8)`` scaled to [0, 1], ``y`` int64 ``(n,)``."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as exc:
        raise DataError("the digits data set comes with scikit-learn: pip install 'poet-edge[sim]'") from exc
    bunch = sklearn_digits()
    x = (bunch.images.astype(np.float32) / 16.0).reshape(-1, 1, SIDE, SIDE)
    return x, bunch.target.astype(np.int64)


def rotate(x: torch.Tensor, degrees: float | torch.Tensor) -> torch.Tensor:
    """Images ``(n, C, H, W)`` rotated about their centre by ``degrees`` (one angle, or one per image; bilinear,
    zeros outside)."""
    if not isinstance(degrees, torch.Tensor):
        if degrees % 360 == 0:
            return x.clone()
        degrees = torch.full((len(x),), float(degrees))
    a = torch.deg2rad(degrees.to(torch.float64))
    cos, sin, zero = torch.cos(a), torch.sin(a), torch.zeros_like(a)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1).to(x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False)


def device_angle(partition: int, partitions: int, viewpoints: float = 360.0, centre: float = 0.0) -> float:
    """Device ``partition``'s viewpoint: evenly around the circle (``viewpoints`` 360), else evenly over
    ``viewpoints`` degrees centred on ``centre`` (90 about upright: from -45 to +45; 30 about 90: from 75 to
    105, a fleet whose cameras all lie on their side, a view the upright vendor data never showed)."""
    if viewpoints >= 360:
        return 360.0 * partition / partitions
    if partitions == 1:
        return centre + 0.0
    return centre + viewpoints * (partition / (partitions - 1) - 0.5) + 0.0  # + 0.0: never -0.0


def device_dataset(partition: int, partitions: int, *, data: FleetData = FleetData(), angle: float | None = None,
                   seed: int = 0, batch_size: int = BATCH_SIZE) -> LocalDataset:
    """Device ``partition``'s images (see :class:`FleetData`): its training partition and held-out images, both
    seen from its angle.  A function of the arguments: every process builds the same fleet."""
    if not 0 <= partition < partitions:
        raise DataError(f"partition {partition} out of range for {partitions} partitions")
    data.check(partitions, batch_size)
    if data.dataset == STDLIB_TEXT:  # one package's source per device: no pool, no angle
        return device_text(partition, samples=data.samples, holdout=data.holdout, seed=seed, batch_size=batch_size)
    pool = _pool(partitions, data, seed, batch_size)
    rows = pool.rows[partition]
    wanted = pool.counts[partition] if pool.counts else batch_size
    if len(rows) < wanted:
        raise DataError(f"device {partition} of {partitions} gets {len(rows)} training images, fewer than "
                        f"{wanted}: set samples (images per device) or use fewer devices")
    if pool.counts:
        rows = rows[:wanted]
    labels = pool.train_y[rows]
    if pool.held:  # natural partitions: the device's own held-out images
        held = pool.held[partition]
    else:
        held = _held_out(pool, labels, data.holdout, np.random.default_rng([seed, partition]))
    degrees = device_angle(partition, partitions, data.viewpoints, data.viewpoint_centre) if angle is None else angle
    return LocalDataset(train_x=rotate(pool.train_x[rows], degrees), train_y=labels,
                        holdout_x=rotate(pool.test_x[held], degrees), holdout_y=pool.test_y[held],
                        batch_size=batch_size, seed=seed + partition,
                        source=_source(pool.name, partition, partitions, degrees))


def vendor_dataset(partitions: int, *, data: FleetData = FleetData(), seed: int = 0,
                   batch_size: int = BATCH_SIZE, holdout: int = 200) -> LocalDataset:
    """What a vendor pretrains on before any device joins: the training pool's images that no device of the
    fleet holds (nor any turned copy of them), upright, and ``holdout`` images of the test pool to report the
    pretrained model's accuracy on.  A function of the arguments, like :func:`device_dataset`."""
    data.check(partitions, batch_size)
    if data.dataset == STDLIB_TEXT:  # the modules in no package: no device holds any
        from agent.stdlib_text import vendor_dataset as vendor_text

        return vendor_text(holdout=holdout, seed=seed, batch_size=batch_size)
    if data.partition_by:
        raise DataError("a fleet partitioned by natural ids holds every image: no vendor data is left to "
                        "pretrain on; partition the pool (samples, label-alpha) instead")
    pool = _pool(partitions, data, seed, batch_size)
    originals = pool.original_count  # row r of a grown pool is a turned copy of row r % originals
    held = set()
    for rows, count in zip(pool.rows, pool.counts or [len(r) for r in pool.rows]):
        held.update(int(r) % originals for r in rows[:count])
    free = np.array([r for r in range(originals) if r not in held], dtype=np.int64)
    if len(free) < batch_size:
        raise DataError(f"the fleet's {partitions} devices hold all but {len(free)} of the {originals} training "
                        "images: too few to pretrain on; lower samples or use fewer devices")
    picked = np.sort(np.random.default_rng([seed, partitions, 7]).permutation(len(pool.test_x))[:holdout])
    return LocalDataset(train_x=pool.train_x[free], train_y=pool.train_y[free],
                        holdout_x=pool.test_x[picked], holdout_y=pool.test_y[picked],
                        batch_size=batch_size, seed=seed, source=Path(f"{pool.name}/vendor-{len(free)}"))


HOLDOUT_SHARE = 0.25  # of the images, the test pool (under natural partitions, of each device's own)
AUGMENT_DEGREES = 10.0  # a grown pool's copies turn by up to this much either way


@dataclass(frozen=True)
class _Pool:
    name: str
    classes: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    rows: list[np.ndarray]  # per device, its rows of the training pool in its own order
    counts: list[int]  # per device, the training images it keeps (empty: its whole partition)
    held: list[np.ndarray]  # natural partitions: per device, its held-out rows of the test pool (else empty)
    original_count: int = 0  # training images before the pool was grown by turned copies (each follows in order)


_POOLS: dict[tuple[int, FleetData, int, int], _Pool] = {}


def _pool(partitions: int, data: FleetData, seed: int, batch_size: int) -> _Pool:
    """The fleet's pools and partition, made once per process (a ClientApp process serves many devices)."""
    key = (partitions, data, seed, batch_size)
    if key not in _POOLS:
        _POOLS.clear()  # one fleet per process at a time
        if data.partition_by:
            _POOLS[key] = _natural_pool(partitions, data, seed, batch_size)
        else:
            _POOLS[key] = _make_pool(partitions, data, seed, batch_size)
    return _POOLS[key]


def _image_set(data: FleetData, rng: np.random.Generator) -> ImageSet:
    """The digits, or the saved data set, with a test split (a share drawn by ``rng`` where the set has none)."""
    if data.dataset:
        images = load_image_set(data.dataset, data.label_column)
    else:
        x, y = load_digits()
        images = ImageSet("sklearn-digits", CLASSES, x, y)
    if images.test_x is not None:
        return images
    order = rng.permutation(len(images.train_x))
    test = np.sort(order[:int(HOLDOUT_SHARE * len(order))])
    train = np.sort(order[int(HOLDOUT_SHARE * len(order)):])
    return ImageSet(images.name, images.classes, images.train_x[train], images.train_y[train],
                    images.train_x[test], images.train_y[test])


def _make_pool(partitions: int, data: FleetData, seed: int, batch_size: int) -> _Pool:
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, SizePartitioner

    counts = data.sample_counts(partitions, seed, batch_size) if data.samples else []
    rng = np.random.default_rng(seed)
    images = _image_set(data, rng)
    train_x, train_y = torch.from_numpy(images.train_x), torch.from_numpy(images.train_y)
    if not counts:
        wanted = 0  # every device its whole partition of the pool as it is
    elif data.label_alpha:
        wanted = 3 * partitions * max(counts)  # a Dirichlet partition is uneven: room for every device's count
    else:
        wanted = sum(counts)
    copies = max(1, -(-wanted // len(train_x)))
    if copies > 1:
        turns = torch.from_numpy(rng.uniform(-AUGMENT_DEGREES, AUGMENT_DEGREES, (copies - 1) * len(train_x)))
        train_x = torch.cat([train_x, rotate(train_x.repeat(copies - 1, 1, 1, 1), turns.float())])
        train_y = train_y.repeat(copies)
    table = datasets.Dataset.from_dict({"row": np.arange(len(train_y)), "label": train_y.numpy()})
    if data.label_alpha:
        partitioner = DirichletPartitioner(partitions, "label", data.label_alpha,
                                           min_partition_size=max([*counts, batch_size]), self_balancing=True,
                                           shuffle=True, seed=seed)
    elif data.quantity_skew:  # uneven shares of an evenly mixed pool
        partitioner = SizePartitioner(counts)
        table = table.shuffle(seed=seed)
    else:
        partitioner = IidPartitioner(partitions)
        table = table.shuffle(seed=seed)
    partitioner.dataset = table
    try:
        with warnings.catch_warnings():  # it warns at every redraw of a partition too small, then gives up
            warnings.simplefilter("ignore")
            rows = [np.asarray(partitioner.load_partition(i)["row"], dtype=np.int64) for i in range(partitions)]
    except ValueError as exc:
        raise DataError(f"label-alpha {data.label_alpha:g} leaves some of {partitions} devices fewer than "
                        f"{max([*counts, batch_size])} images in every Dirichlet draw ({exc}): raise label-alpha, "
                        "lower samples or lower quantity-skew") from exc
    return _Pool(images.name, images.classes, train_x, train_y, torch.from_numpy(images.test_x),
                 torch.from_numpy(images.test_y), rows, counts, [], len(images.train_x))


def _natural_pool(partitions: int, data: FleetData, seed: int, batch_size: int) -> _Pool:
    """One natural id's images per device (``partition-by``), each split by the seed into training rows and
    its own held-out rows."""
    images = load_image_set(data.dataset, data.label_column, data.partition_by, partitions)
    rows, held = [], []
    for partition in range(partitions):
        mine = np.flatnonzero(images.train_ids == partition)
        mine = mine[np.random.default_rng([seed, partition]).permutation(len(mine))]
        cut = max(1, int(HOLDOUT_SHARE * len(mine)))
        if len(mine) - cut < batch_size:
            raise DataError(f"device {partition} ({data.partition_by} #{partition}) has {len(mine)} images: "
                            f"after its {cut} held out, fewer than a batch of {batch_size} to train on")
        held.append(np.sort(mine[:cut]))
        rows.append(mine[cut:])
    x, y = torch.from_numpy(images.train_x), torch.from_numpy(images.train_y)
    return _Pool(images.name, images.classes, x, y, x, y, rows, [], held)


def _held_out(pool: _Pool, labels: torch.Tensor, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` test-pool rows in the label mix of ``labels`` (each class's images drawn without repeats until
    the class runs out; a class the test pool lacks is left out)."""
    mix = np.bincount(labels.numpy(), minlength=pool.classes) / len(labels)
    wanted = rng.multinomial(count, mix)
    test_y = pool.test_y.numpy()
    picked = []
    for label, n in enumerate(wanted):
        members = np.flatnonzero(test_y == label)
        if len(members):
            picked.append(rng.choice(members, size=n, replace=n > len(members)))
    return np.sort(np.concatenate(picked))


def _source(name: str, partition: int, partitions: int, degrees: float) -> Path:
    """A name for the share in logs (no file backs it)."""
    return Path(f"{name}/{partition}-of-{partitions}@{degrees:.0f}deg")


def write_device_data(path: Path, partition: int, partitions: int, *, data: FleetData = FleetData(),
                      angle: float | None = None, seed: int = 0) -> Path:
    """Device ``partition``'s digits (all of its share, seen from its angle) as a ``.npz`` data file with
    arrays ``x`` and ``y``: the data a device agent trains on (``[data] path``) with the
    ``agent.digits:digits_workload`` model.  The agent splits off its own held-out part."""
    share = device_dataset(partition, partitions, data=data, angle=angle, seed=seed)
    x = torch.cat([share.train_x, share.holdout_x]).numpy()
    y = torch.cat([share.train_y, share.holdout_y]).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:  # a file object: np.savez would append .npz to a name without it
        np.savez(out, x=x, y=y)
    return path
