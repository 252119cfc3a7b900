"""Image data sets from a local copy: a directory Hugging Face ``datasets`` saved, read without the network.

A fleet simulation trains on the shipped digits unless its run config names a data set (``dataset``): a
directory that ``datasets.Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` wrote.  FEMNIST and CIFAR-10,
for example, are fetched once on a machine with internet::

    python -c "import datasets; datasets.load_dataset('flwrlabs/femnist').save_to_disk('femnist')"
    python -c "import datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('cifar10')"

The image column is the one of type ``Image`` (PNG/JPEG, any mode: grey stays one channel, the rest become
RGB); the label column is the one of type ``ClassLabel`` unless the run config names it (``label-column``).
A ``DatasetDict`` keeps its ``train`` and ``test`` splits; a single split is split by the seed, as the digits
are.  With ``partition-by`` (FEMNIST's ``writer_id``) the data are partitioned by that column's natural ids
(Flower Datasets' :class:`~flwr_datasets.partitioner.NaturalIdPartitioner`): device ``i`` is the ``i``-th id
(its writer), and only the images of the fleet's ids are decoded.

:func:`image_set_shape` reads one image only (what the model is sized to); :func:`load_image_set` decodes the
images a fleet needs, as float32 arrays in [0, 1].
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.errors import DataError

SAVE_HINT = ("a directory written by datasets' save_to_disk, e.g. on a machine with internet: python -c \"import "
             "datasets; datasets.load_dataset('uoft-cs/cifar10').save_to_disk('cifar10')\"")


@dataclass(frozen=True)
class ImageSet:
    """A data set's images as arrays: ``x`` float32 ``(n, channels, height, width)`` in [0, 1], ``y`` int64.

    ``test_x``/``test_y`` are its test split (``None``: it has one split only).  Under natural partitioning
    ``train_ids`` gives each training row's partition (the device it belongs to), else it is ``None``."""

    name: str
    classes: int
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    train_ids: np.ndarray | None = None


@dataclass(frozen=True)
class ImageShape:
    """What a model for the data set is sized to: an image's ``(channels, height, width)`` and the classes."""

    channels: int
    side: int
    classes: int


def image_set_shape(path: str, label_column: str = "") -> ImageShape:
    """The data set at ``path``: its images' shape (from its first image) and its number of classes."""
    train, _ = _splits(path)
    image, label = _columns(train, label_column, path)
    first = _to_array(train[0][image])
    if first.shape[1] != first.shape[2]:
        raise DataError(f"{path}: images are {first.shape[1]}x{first.shape[2]}; the fleet's model needs square "
                        "images (resize them before save_to_disk)")
    return ImageShape(first.shape[0], first.shape[1], _class_count(train, label))


def load_image_set(path: str, label_column: str = "", partition_by: str = "", partitions: int = 0) -> ImageSet:
    """The data set at ``path`` decoded; with ``partition_by``, only the first ``partitions`` natural ids'
    training rows (and no test split: a device is tested on its own held-out rows)."""
    train, test = _splits(path)
    image, label = _columns(train, label_column, path)
    classes = _class_count(train, label)
    name = Path(path).name
    if partition_by:
        rows, ids = _natural_rows(train, partition_by, partitions, path)
        train = train.select(rows)
        x, y = _arrays(train, image, label, path)
        return ImageSet(name, classes, x, y, train_ids=ids)
    x, y = _arrays(train, image, label, path)
    if test is None:
        return ImageSet(name, classes, x, y)
    _columns(test, label, path)
    test_x, test_y = _arrays(test, image, label, path)
    return ImageSet(name, classes, x, y, test_x, test_y)


def _splits(path: str) -> tuple[Any, Any]:
    """The saved data set's training split and its test split (``None`` if it has none)."""
    import datasets

    if not Path(path, "dataset_info.json").exists() and not Path(path, "dataset_dict.json").exists():
        raise DataError(f"dataset {path!r} is not a saved data set: expected {SAVE_HINT}")
    datasets.disable_progress_bars()
    try:
        saved = datasets.load_from_disk(path)
    except (OSError, ValueError, FileNotFoundError) as exc:
        raise DataError(f"dataset {path!r} cannot be read ({exc}): expected {SAVE_HINT}") from exc
    if isinstance(saved, datasets.Dataset):
        return saved, None
    if "train" not in saved:
        raise DataError(f"dataset {path!r} has splits {sorted(saved)} but no 'train'")
    return saved["train"], saved.get("test")


def _columns(split: Any, label_column: str, path: str) -> tuple[str, str]:
    """The split's image column and its label column (``label_column``, else its one ``ClassLabel``)."""
    import datasets

    features = split.features
    images = [c for c, f in features.items() if isinstance(f, datasets.Image)]
    if len(images) != 1:
        raise DataError(f"dataset {path!r} has {len(images)} image columns ({images or 'none'}) among "
                        f"{sorted(features)}; the fleet trains on one")
    if label_column:
        if label_column not in features:
            raise DataError(f"dataset {path!r} has no label column {label_column!r}: its columns are "
                            f"{sorted(features)}")
        return images[0], label_column
    labels = [c for c, f in features.items() if isinstance(f, datasets.ClassLabel)]
    if len(labels) != 1:
        raise DataError(f"dataset {path!r} has {len(labels)} ClassLabel columns ({labels or 'none'}): name the "
                        f"label column (run config label-column; its columns are {sorted(features)})")
    return images[0], labels[0]


def _class_count(split: Any, label: str) -> int:
    """The number of classes: the ``ClassLabel``'s, else one more than the largest integer label."""
    import datasets

    feature = split.features[label]
    if isinstance(feature, datasets.ClassLabel):
        return int(feature.num_classes)
    values = np.asarray(split[label])
    if values.dtype.kind not in "iu" or len(values) == 0 or values.min() < 0:
        raise DataError(f"label column {label!r} holds {values.dtype} values; labels must be integers from 0 "
                        "or a ClassLabel")
    return int(values.max()) + 1


def _natural_rows(train: Any, column: str, partitions: int, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the first ``partitions`` natural ids of ``column`` and, per row, its partition."""
    import datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    if column not in train.features:
        raise DataError(f"dataset {path!r} has no column {column!r} to partition by: its columns are "
                        f"{sorted(train.features)}")
    table = datasets.Dataset.from_dict({"row": np.arange(len(train)), column: list(train[column])})
    partitioner = NaturalIdPartitioner(partition_by=column)
    partitioner.dataset = table
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar, in every device's log otherwise
        available = partitioner.num_partitions
    if available < partitions:
        raise DataError(f"dataset {path!r} has {available} distinct {column} values, fewer than "
                        f"the fleet's {partitions} devices: use fewer devices")
    rows, ids = [], []
    with contextlib.redirect_stderr(io.StringIO()):
        for partition in range(partitions):
            mine = np.asarray(partitioner.load_partition(partition)["row"], dtype=np.int64)
            rows.append(mine)
            ids.append(np.full(len(mine), partition, dtype=np.int64))
    return np.concatenate(rows), np.concatenate(ids)


def _arrays(split: Any, image: str, label: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's images as float32 ``(n, c, h, w)`` in [0, 1] and its labels as int64."""
    x = [_to_array(picture) for picture in split[image]]
    shapes = {a.shape for a in x}
    if len(shapes) != 1:
        raise DataError(f"dataset {path!r} holds images of {len(shapes)} shapes ({sorted(shapes)[:3]}...): "
                        "resize them to one before save_to_disk")
    y = np.asarray(split[label])
    if y.dtype.kind not in "iu":
        raise DataError(f"label column {label!r} of {path!r} holds {y.dtype} values, not integer classes")
    return np.stack(x).astype(np.float32) / 255.0, y.astype(np.int64)


def _to_array(picture: Any) -> np.ndarray:
    """A decoded image (PIL) as uint8 ``(c, h, w)``: grey stays one channel, every other mode becomes RGB."""
    if picture.mode not in ("L", "RGB"):
        picture = picture.convert("L" if picture.mode in ("1", "I", "I;16", "F") else "RGB")
    array = np.asarray(picture, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
