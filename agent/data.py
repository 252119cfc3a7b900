"""The device's local data set: training data that lives on the device, loaded for the executor's steps.

:func:`open_dataset` reads one of six layouts and returns a :class:`LocalDataset`:

==========================  ================================================================
layout                      contents
==========================  ================================================================
a directory                 one subfolder per class (class index = sorted folder names) of
                            PNG/JPEG images; each is decoded with Pillow, converted to RGB
                            (L for a 1-channel sample shape), resized to the sample's H x W
                            and scaled to float32 in [0, 1], channels first
``.npz``                    arrays ``x`` and ``y`` (or ``inputs`` and ``targets``)
``.pt``                     ``torch.load(weights_only=True)`` of a dict with ``x``/``y`` (or
                            ``inputs``/``targets``) or a tuple ``(x, y)``; ``x`` may also be a
                            list of per-sample tensors
``.csv``                    a header row; the label column is ``label``, else the last one;
                            every other column is a number
``.npy``                    token ids for a next-token model (input batch x L): a 1-D stream,
                            cut into non-overlapping windows of L + 1 tokens (a last part
                            shorter than a window is dropped), or a 2-D array n x (L + 1) of
                            windows; each window gives ``x = window[:-1]``, ``y = window[1:]``
``.txt``                    UTF-8 text, tokenized once at open (without special tokens) by the
                            tokenizer passed as ``tokenizer`` (``[data] tokenizer`` in the
                            agent's config), into one stream cut as a ``.npy`` stream is
==========================  ================================================================

Float features become float32 and integer features int64 (token ids; images stored as integers are
not rescaled); integer labels become int64 class indices, float labels stay float32 (regression).

Token windows (``.npy``, ``.txt``) are int64 inputs and targets of shape ``(L,)``: the samples of a causal
language model (``gpt2``, ``llama``), whose loss compares the output at each position with the next token.
A window is one sample: the held-out split and the batch order are those of any other layout.  A 2-D
array must have L + 1 columns: windows of only L tokens would leave the last position without its next
token.  Token ids must be integers from 0 to the model's vocabulary less one (``vocabulary``), and a
tokenizer must not have more tokens than that vocabulary; anything else is refused at open, naming the
file, the offending id and its window and position.  The tokenizer is a ``tokenizers`` JSON file (``Tokenizer.save``, ``tokenizer.json``) or a folder
that ``transformers.AutoTokenizer.from_pretrained`` reads (``save_pretrained``'s), read from disk only.

A sample that cannot be read (a corrupt image, a CSV row with a non-number or the wrong number of
columns, an ``x`` row of the wrong shape) is skipped and counted; a problem with the whole file
raises :class:`agent.errors.DataError`, whose message names the file and what to fix.

Memory: every sample is decoded once, at open, and kept resident as tensors (data sets on a device
are small, and decoding in every epoch would cost more energy than the training step it feeds).
The resident size is samples x sample size x 4 bytes: 10,000 RGB 32x32 images take 123 MB; opening
briefly needs about twice that while the split copies the samples.  Token windows take 16 bytes a token
(int64 inputs and targets): a million tokens, 16 MB.

Batches are a pure function of ``(seed, epoch, index)``: a restarted run that saved only its data
position gets the very same batches (:meth:`LocalDataset.batch`).
"""

from __future__ import annotations

import csv
import math
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from agent.errors import AgentError, DataError

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
MAX_SKIPPED_EXAMPLES = 5
_KEY_PAIRS = (("x", "y"), ("inputs", "targets"))
_LAYOUTS = ("a folder of class subfolders of PNG/JPEG images, a .npz, a .pt or a .csv file, or token ids "
            "(a .npy file, or a .txt file with a tokenizer)")
# Pillow's decoders raise many types for corrupt or hostile files; one bad image must not end the run.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error,
                  Image.DecompressionBombError)
_NPZ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)  # a damaged archive or member
_TOKENIZER_HINT = ("set data.tokenizer (the tokenizer= argument) to a tokenizers JSON file (tokenizer.json, "
                   "written by Tokenizer.save) or a folder written by a transformers tokenizer's save_pretrained")


@dataclass(frozen=True, eq=False)
class LocalDataset:
    """A local data set split into training and held-out samples, batched deterministically.

    Attributes
    ----------
    train_x, train_y, holdout_x, holdout_y:
        Samples (``(n, *sample_shape)``) and their labels, in file order within each part.
    batch_size:
        Samples per training batch (the model's ``input_shape[0]``).
    seed:
        Chooses the held-out samples (``seed``) and each epoch's order (``seed + epoch``).
    source:
        The file or folder the samples came from.
    skipped, skipped_examples:
        How many samples could not be read, and up to five ``"file: why"`` lines about them.
    classes:
        Class names of an image folder, in class-index order; empty for other layouts.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    holdout_x: torch.Tensor
    holdout_y: torch.Tensor
    batch_size: int
    seed: int
    source: Path
    skipped: int = 0
    skipped_examples: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    _order: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)  # one epoch's order

    @property
    def batches_per_epoch(self) -> int:
        """Full batches in one epoch; the remainder of each epoch's permutation is dropped."""
        return len(self.train_x) // self.batch_size

    def batch(self, epoch: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``index``-th batch of ``epoch``: ``(inputs, targets)``, always ``batch_size`` samples.

        An epoch visits the training samples in a permutation drawn from ``seed + epoch``, so any
        position can be recomputed after a restart without replaying the ones before it.
        """
        if epoch < 0 or not 0 <= index < self.batches_per_epoch:
            raise IndexError(f"no batch ({epoch}, {index}): epochs start at 0 and an epoch has "
                             f"{self.batches_per_epoch} batches")
        start = index * self.batch_size
        rows = torch.from_numpy(self._epoch_order(epoch)[start:start + self.batch_size])
        return self.train_x[rows], self.train_y[rows]

    def position_after(self, epoch: int, index: int) -> tuple[int, int]:
        """The position of the batch after ``(epoch, index)``, rolling into the next epoch."""
        if index + 1 < self.batches_per_epoch:
            return epoch, index + 1
        return epoch + 1, 0

    def holdout_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The held-out samples in file order, ``batch_size`` at a time (the last batch may be short)."""
        for start in range(0, len(self.holdout_x), self.batch_size):
            yield self.holdout_x[start:start + self.batch_size], self.holdout_y[start:start + self.batch_size]

    def describe(self) -> str:
        """One line for a log, e.g. ``1,200 samples from 10 classes in /data (120 held out, 3 skipped: ...)``."""
        total = len(self.train_x) + len(self.holdout_x)
        text = _count(total, "sample")
        if self.classes:
            text += f" from {_count(len(self.classes), 'class', 'classes')}"
        notes = [f"{len(self.holdout_x):,} held out"]
        if self.skipped:
            notes.append(f"{self.skipped:,} skipped: {self.skipped_examples[0]}")
        return f"{text} in {self.source} ({', '.join(notes)})"

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if epoch not in self._order:
            self._order.clear()  # a run moves forward: one epoch's order is all worth keeping
            self._order[epoch] = np.random.default_rng(self.seed + epoch).permutation(len(self.train_x))
        return self._order[epoch]


def open_dataset(path: str | Path, input_shape: Sequence[int], *, holdout: float = 0.1, seed: int = 0,
                 max_skipped_fraction: float | None = None, tokenizer: str | Path | None = None,
                 vocabulary: int | None = None) -> LocalDataset:
    """Read the local data set at ``path`` for a model whose batch has shape ``input_shape``.

    Parameters
    ----------
    path:
        A folder of class subfolders of images, or a ``.npz``, ``.pt``, ``.csv``, ``.npy`` or ``.txt`` file
        (see the module).
    input_shape:
        The model's batch shape, batch first (``(8, 3, 32, 32)``, ``(16, 64)``): the batch size is
        ``input_shape[0]`` and one sample has shape ``input_shape[1:]``.
    holdout:
        Fraction of the samples held out of training, in ``[0, 1)``; at least one sample when it is
        above zero and there are two samples or more.
    seed:
        Chooses the held-out samples and, with the epoch, each epoch's order.
    max_skipped_fraction:
        Refuse the data set when more than this fraction of its samples cannot be read; ``None``
        accepts any number as long as one full batch remains.
    tokenizer:
        The tokenizer of a ``.txt`` file: a ``tokenizers`` JSON file or a ``save_pretrained`` folder;
        other layouts ignore it.
    vocabulary:
        The model's vocabulary size (:func:`agent.zoo.token_vocabulary`): token windows (``.npy``,
        ``.txt``) must hold ids below it, and a tokenizer must not have more tokens.  ``None`` checks
        only that ids are not negative.

    Raises
    ------
    DataError
        The path is missing or of an unknown layout, its arrays are malformed as a whole, or too few
        samples are usable; token ids are not integers in ``[0, vocabulary)``; a ``.txt`` file has no
        tokenizer, or one that cannot be loaded or has more tokens than ``vocabulary``.
    AgentError
        An argument is out of range (``input_shape``, ``holdout``, ``seed``, ``max_skipped_fraction``,
        ``vocabulary``).
    """
    batch_size, sample_shape = _check_arguments(input_shape, holdout, seed, max_skipped_fraction)
    if vocabulary is not None and vocabulary < 1:
        raise AgentError(f"vocabulary must be a positive number of token ids or None; got {vocabulary}")
    source = Path(path)
    skips = _Skips()
    tokens = _Tokens(None if tokenizer is None else Path(tokenizer), vocabulary)
    x, y, classes = _read(source, sample_shape, skips, tokens)
    _check_usable(source, len(x), skips, max_skipped_fraction)
    held, train = _split(len(x), holdout, seed)
    if len(train) < batch_size:
        raise DataError(f"{source}: {len(x)} usable samples, {len(held)} held out, leave {len(train)} for training, "
                        f"fewer than one batch of {batch_size}; add samples, or lower the batch size or the holdout")
    return LocalDataset(
        train_x=torch.from_numpy(x[train]), train_y=torch.from_numpy(y[train]),
        holdout_x=torch.from_numpy(x[held]), holdout_y=torch.from_numpy(y[held]),
        batch_size=batch_size, seed=seed, source=source, skipped=skips.count,
        skipped_examples=tuple(skips.examples), classes=classes)


class _Skips:
    """Samples that could not be read: how many, and the first few ``"file: why"`` lines."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[str] = []

    def add(self, where: str, why: str) -> None:
        self.count += 1
        if len(self.examples) < MAX_SKIPPED_EXAMPLES:
            self.examples.append(f"{where}: {why}")


def _check_arguments(input_shape: Sequence[int], holdout: float, seed: int,
                     max_skipped_fraction: float | None) -> tuple[int, tuple[int, ...]]:
    if len(input_shape) < 2 or not all(isinstance(n, (int, np.integer)) and n > 0 for n in input_shape):
        raise AgentError(f"input_shape must be a batch size and a sample shape of positive integers, "
                         f"e.g. (8, 3, 32, 32); got {input_shape!r}")
    shape = tuple(int(n) for n in input_shape)
    if not 0 <= holdout < 1:
        raise AgentError(f"holdout must be a fraction in [0, 1); got {holdout}")
    if seed < 0:
        raise AgentError(f"seed must be 0 or more; got {seed}")
    if max_skipped_fraction is not None and not 0 <= max_skipped_fraction <= 1:
        raise AgentError(f"max_skipped_fraction must be in [0, 1] or None; got {max_skipped_fraction}")
    return shape[0], shape[1:]


def _read(source: Path, sample_shape: tuple[int, ...], skips: _Skips,
          tokens: _Tokens) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Every usable sample at ``source``: ``(x, y, classes)``."""
    if source.is_dir():
        try:
            return _read_image_folder(source, sample_shape, skips)
        except OSError as exc:  # a folder that cannot be listed; each image's own errors are skips
            raise DataError(f"{source}: cannot list the image folder ({exc}); make it readable") from exc
    if not source.exists():
        raise DataError(f"{source}: no such file or folder; pass {_LAYOUTS}")
    suffix = source.suffix.lower()
    if suffix == ".npz":
        x, y = _read_npz(source)
    elif suffix == ".pt":
        x, y = _read_pt(source)
    elif suffix == ".csv":
        return (*_read_csv(source, sample_shape, skips), ())
    elif suffix in (".npy", ".txt"):
        ids = _read_npy(source) if suffix == ".npy" else _read_text(source, tokens)
        return (*_next_token_windows(source, ids, sample_shape, tokens.vocabulary), ())
    else:
        raise DataError(f"{source}: unknown data format {suffix or '(no suffix)'!r}; pass {_LAYOUTS}")
    return (*_samples(source, x, y, sample_shape, skips), ())


def _check_usable(source: Path, usable: int, skips: _Skips, max_skipped_fraction: float | None) -> None:
    example = f" (e.g. {skips.examples[0]})" if skips.examples else ""
    if usable == 0:
        raise DataError(f"{source}: no usable samples, {skips.count} skipped{example}; "
                        f"pass {_LAYOUTS} with samples of the model's shape")
    fraction = skips.count / (skips.count + usable)
    if max_skipped_fraction is not None and fraction > max_skipped_fraction:
        raise DataError(f"{source}: {skips.count} of {skips.count + usable} samples ({fraction:.0%}) cannot be read, "
                        f"more than max_skipped_fraction {max_skipped_fraction} allows{example}; "
                        f"repair or remove them")


def _split(n: int, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(held-out rows, training rows)``, each sorted: a ``holdout`` fraction drawn by ``seed``."""
    held_count = 0
    if holdout > 0 and n >= 2:
        held_count = min(max(1, round(n * holdout)), n - 1)  # always some of each
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[:held_count]), np.sort(order[held_count:])


# --- image folders ------------------------------------------------------------------------------------


def _read_image_folder(root: Path, sample_shape: tuple[int, ...],
                       skips: _Skips) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    if len(sample_shape) != 3 or sample_shape[0] not in (1, 3):
        raise DataError(f"{root}: an image folder needs a model input of batch x channels x height x width with "
                        f"1 or 3 channels, e.g. 8x3x32x32; got a sample shape of {_shape(sample_shape)}")
    class_dirs = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                        key=lambda p: p.name)
    if not class_dirs:
        raise DataError(f"{root}: no class subfolders; put each class's images in a subfolder named for it "
                        f"(e.g. {root}/cat/1.png)")
    files = [(path, label) for label, folder in enumerate(class_dirs)
             for path in sorted(folder.iterdir()) if _is_image_file(path)]
    x = np.empty((len(files), *sample_shape), dtype=np.float32)  # filled in place: no second copy of the set
    y = np.empty(len(files), dtype=np.int64)
    kept = 0
    for path, label in files:
        try:
            x[kept] = _decode_image(path, sample_shape)
        except _DECODE_ERRORS as exc:
            why = (str(exc) or type(exc).__name__).replace(f" {str(path)!r}", "")  # the path is said once
            skips.add(str(path.relative_to(root)), why)
            continue
        y[kept] = label
        kept += 1
    return x[:kept], y[:kept], tuple(folder.name for folder in class_dirs)


def _is_image_file(path: Path) -> bool:
    # dot files are a file system's own (macOS writes "._name.png" beside each image on removable media)
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def _decode_image(path: Path, sample_shape: tuple[int, ...]) -> np.ndarray:
    """One image as float32 ``(C, H, W)`` in [0, 1]."""
    channels, height, width = sample_shape
    mode = "L" if channels == 1 else "RGB"
    with Image.open(path) as image:
        image.draft(mode, (width, height))  # JPEG only: decode at a reduced scale, far less memory for photos
        pixels = np.asarray(image.convert(mode).resize((width, height), Image.Resampling.BILINEAR),
                            dtype=np.float32)
    pixels = pixels.reshape(height, width, channels)  # L images come back without a channel axis
    return pixels.transpose(2, 0, 1) / 255.0


# --- arrays: .npz and .pt -----------------------------------------------------------------------------


def _read_npz(source: Path) -> tuple[Any, Any]:
    hint = "write it with numpy.savez(path, x=inputs, y=targets) from plain (non-object) arrays"
    try:
        archive = np.load(source, allow_pickle=False)  # no pickles: a data file must not run code
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise DataError(f"{source}: holds a single array, not arrays 'x' and 'y'; {hint}")
        with archive:
            for x_key, y_key in _KEY_PAIRS:
                if x_key in archive.files and y_key in archive.files:
                    return archive[x_key], archive[y_key]
            keys = sorted(archive.files)
    except _NPZ_ERRORS as exc:
        raise DataError(f"{source}: cannot read it as a NumPy .npz archive ({exc}); {hint}") from exc
    raise DataError(f"{source}: holds {keys}, not arrays 'x' and 'y' (or 'inputs' and 'targets'); {hint}")


def _read_pt(source: Path) -> tuple[Any, Any]:
    hint = "save a dict {'x': inputs, 'y': targets} of tensors, or a tuple (inputs, targets), with torch.save"
    try:
        content = torch.load(source, map_location="cpu", weights_only=True)  # weights_only: runs no code
    except Exception as exc:  # torch.load raises unpickling, zip and runtime errors alike for a bad file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{source}: torch.load(weights_only=True) cannot read it ({reason}); {hint}") from exc
    if isinstance(content, dict):
        for x_key, y_key in _KEY_PAIRS:
            if x_key in content and y_key in content:
                return content[x_key], content[y_key]
        raise DataError(f"{source}: holds a dict with keys {sorted(map(str, content))}, not 'x' and 'y' "
                        f"(or 'inputs' and 'targets'); {hint}")
    if isinstance(content, (tuple, list)) and len(content) == 2:
        return content[0], content[1]
    raise DataError(f"{source}: holds a {type(content).__name__}; {hint}")


def _samples(source: Path, x: Any, y: Any, sample_shape: tuple[int, ...],
             skips: _Skips) -> tuple[np.ndarray, np.ndarray]:
    """Checked ``(x, y)`` arrays from arrays, tensors or lists of per-sample tensors."""
    if _length(x, source, "x") != _length(y, source, "y"):
        raise DataError(f"{source}: x has {_length(x, source, 'x')} samples but y has {_length(y, source, 'y')}; "
                        f"give one label per sample")
    labels = _labels(source, _as_array(y, source, "y"))
    if isinstance(x, (np.ndarray, torch.Tensor)):
        whole = _features(source, _as_array(x, source, "x"))
        if whole.shape[1:] == sample_shape or math.prod(whole.shape[1:]) == math.prod(sample_shape):
            return whole.reshape(len(whole), *sample_shape), labels  # one array: all rows share a shape
        x = list(whole)  # every row is of the wrong shape: each is skipped and counted below
    rows, kept = [], []
    for i, row in enumerate(x):
        sample = _to_numpy(row)
        if sample is None or sample.dtype.kind not in "fiub":
            skips.add(source.name, f"sample {i} is a {type(row).__name__}, not an array of numbers")
            continue
        if sample.size != math.prod(sample_shape):
            skips.add(source.name, f"sample {i} has shape {_shape(sample.shape)}, the model takes "
                                   f"{_shape(sample_shape)} ({math.prod(sample_shape)} values)")
            continue
        rows.append(sample.reshape(sample_shape))
        kept.append(i)
    if not rows:
        return np.empty((0, *sample_shape), dtype=np.float32), labels[:0]
    return _features(source, np.stack(rows)), labels[kept]


def _length(values: Any, source: Path, name: str) -> int:
    try:
        return len(values)
    except TypeError:
        raise DataError(f"{source}: {name} is a {type(values).__name__}, not an array of samples") from None


def _as_array(values: Any, source: Path, name: str) -> np.ndarray:
    array = _to_numpy(values)
    if array is None:
        raise DataError(f"{source}: {name} is a ragged {type(values).__name__}, not an array; "
                        f"give every sample the same shape")
    return array


def _to_numpy(values: Any) -> np.ndarray | None:
    """``values`` as a NumPy array (a tensor moved to the CPU), or ``None`` for ragged nested lists."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu()
        # bfloat16 and half have no NumPy twin; float32 is where features and targets end anyway
        return (values.float() if values.is_floating_point() else values).numpy()
    try:
        return np.asarray(values)
    except ValueError:
        return None


def _features(source: Path, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "fb":
        return x.astype(np.float32, copy=False)
    if x.dtype.kind in "iu":
        return x.astype(np.int64, copy=False)  # token ids and the like
    raise DataError(f"{source}: x holds {x.dtype} values; store numbers (float features or integer ids)")


def _labels(source: Path, y: np.ndarray) -> np.ndarray:
    if y.dtype.kind in "iub":
        return y.astype(np.int64, copy=False)  # class indices, as cross-entropy takes them
    if y.dtype.kind == "f":
        return y.astype(np.float32, copy=False)  # regression targets
    raise DataError(f"{source}: y holds {y.dtype} values; store integer class indices or float targets")


# --- CSV ----------------------------------------------------------------------------------------------


def _read_csv(source: Path, sample_shape: tuple[int, ...], skips: _Skips) -> tuple[np.ndarray, np.ndarray]:
    try:
        with source.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [name.strip() for name in next(reader, [])]
            if not header:
                raise DataError(f"{source}: empty; the first row must name the columns, one of them 'label'")
            label_at = header.index("label") if "label" in header else len(header) - 1
            _check_feature_count(source, len(header) - 1, sample_shape)
            features, labels = _csv_rows(source, reader, header, label_at, skips)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{source}: cannot read it as UTF-8 CSV ({exc}); write a header row, then one "
                        f"sample per row") from exc
    x = np.stack(features) if features else np.empty((0, math.prod(sample_shape)), dtype=np.float32)
    x = x.reshape(len(features), *sample_shape)
    return x, _csv_labels(labels)


def _check_feature_count(source: Path, count: int, sample_shape: tuple[int, ...]) -> None:
    if count != math.prod(sample_shape):
        raise DataError(f"{source}: {count} feature columns, but the model takes samples of "
                        f"{_shape(sample_shape)} ({math.prod(sample_shape)} values); write one column per "
                        f"value plus a 'label' column, or pass the matching input shape")


def _csv_rows(source: Path, reader: Iterator[list[str]], header: list[str], label_at: int,
              skips: _Skips) -> tuple[list[np.ndarray], list[str]]:
    """Feature rows and label texts of the rows that parse; the others are skipped."""
    features: list[np.ndarray] = []
    labels: list[str] = []
    for row in reader:
        if not row:
            continue  # blank line
        where = f"{source.name}: line {reader.line_num}"  # type: ignore[attr-defined]
        if len(row) != len(header):
            skips.add(where, f"{len(row)} columns, the header has {len(header)}")
            continue
        try:
            values = [float(text) for text in row]
        except ValueError:
            column, text = next((name, text) for name, text in zip(header, row) if not _is_number(text))
            skips.add(where, f"{text!r} in column {column!r} is not a number")
            continue
        features.append(np.array(values[:label_at] + values[label_at + 1:], dtype=np.float32))
        labels.append(row[label_at].strip())
    return features, labels


def _csv_labels(texts: list[str]) -> np.ndarray:
    """int64 class indices when every label is an integer, else float32 targets."""
    try:
        return np.array([int(text) for text in texts], dtype=np.int64)
    except ValueError:
        return np.array([float(text) for text in texts], dtype=np.float32)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- token windows: .npy and .txt ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Tokens:
    """How token data is read: the tokenizer of a text file, and the model's vocabulary size."""

    tokenizer: Path | None
    vocabulary: int | None


def _read_npy(source: Path) -> np.ndarray:
    hint = "write it with numpy.save(path, ids) from an integer array"
    try:
        ids = np.load(source, mmap_mode="r", allow_pickle=False)  # mapped: only the windows are copied to RAM
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{source}: cannot read it as a NumPy .npy array ({exc}); {hint}") from exc
    if not isinstance(ids, np.ndarray):  # an .npz archive under another name
        ids.close()
        raise DataError(f"{source}: holds an archive of arrays, not one array of token ids; {hint}")
    return ids


def _read_text(source: Path, tokens: _Tokens) -> np.ndarray:
    """The whole text's token ids, tokenized in one piece, without special tokens (the stream runs on across
    windows, which cut it wherever a window ends)."""
    if tokens.tokenizer is None:
        raise DataError(f"{source}: a .txt file is split into token ids by a tokenizer, and none is given; "
                        f"{_TOKENIZER_HINT}")
    encode, size = _load_tokenizer(source, tokens.tokenizer)
    if tokens.vocabulary is not None and size > tokens.vocabulary:
        raise DataError(f"{source}: the tokenizer {tokens.tokenizer} has {size:,} tokens, more than the model's "
                        f"vocabulary of {tokens.vocabulary:,}; set data.tokenizer to the model's own tokenizer (at "
                        f"most {tokens.vocabulary:,} tokens), or train a model whose vocabulary holds {size:,}")
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{source}: cannot read it as UTF-8 text ({exc}); save the text as UTF-8") from exc
    return np.asarray(encode(text), dtype=np.int64)


def _load_tokenizer(source: Path, path: Path) -> tuple[Callable[[str], list[int]], int]:
    """``(encode, number of tokens)`` of the tokenizer at ``path``, read from disk only (never the Hub)."""
    if not path.exists():
        raise DataError(f"{source}: no tokenizer at {path}; {_TOKENIZER_HINT}")
    try:
        if path.is_dir():
            from transformers import AutoTokenizer
        else:
            from tokenizers import Tokenizer
    except ImportError as exc:
        raise DataError(f"{source}: reading text needs the tokenizers and transformers packages ({exc}); "
                        f"install them with pip install 'poet-edge[zoo]'") from exc
    try:
        if path.is_dir():
            folder = AutoTokenizer.from_pretrained(path, local_files_only=True)
            # verbose=False: a text longer than the tokenizer's model_max_length is a stream here, not an error
            return (lambda text: folder(text, add_special_tokens=False, verbose=False)["input_ids"]), len(folder)
        file = Tokenizer.from_file(str(path))
        return (lambda text: file.encode(text, add_special_tokens=False).ids), file.get_vocab_size(True)
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file, transformers many types
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__  # transformers' run over many lines
        raise DataError(f"{source}: cannot load the tokenizer {path} ({reason}); {_TOKENIZER_HINT}") from exc


def _next_token_windows(source: Path, ids: np.ndarray, sample_shape: tuple[int, ...],
                        vocabulary: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``, int64 ``(n, L)`` each: every window's first ``L`` tokens, and the ``L`` tokens after its first."""
    if len(sample_shape) != 1:
        raise DataError(f"{source}: token ids need a model input of batch x sequence length, e.g. 8x128; got a "
                        f"sample shape of {_shape(sample_shape)}")
    windows = _checked_ids(source, _windows(source, ids, sample_shape[0] + 1), vocabulary)
    return windows[:, :-1], windows[:, 1:]


def _windows(source: Path, ids: np.ndarray, width: int) -> np.ndarray:
    """``ids`` as ``(n, width)`` windows: a 1-D stream cut (its last, shorter part dropped), or 2-D windows."""
    if ids.dtype.kind not in "iu":
        raise DataError(f"{source}: holds {ids.dtype} values, not integer token ids; save the ids as integers, "
                        f"e.g. numpy.save(path, ids.astype(numpy.int32))")
    wanted = f"{width} tokens (the model's sequence length {width - 1} and the token after it)"
    if ids.ndim == 1:
        windows = ids[:len(ids) // width * width].reshape(-1, width)
    elif ids.ndim == 2 and ids.shape[1] == width:
        windows = ids
    else:
        short = ids.ndim == 2 and ids.shape[1] == width - 1
        raise DataError(f"{source}: an array of shape {_shape(ids.shape)}; a token file holds a 1-D stream of ids, "
                        f"or one window per row of {wanted}, shape n x {width}"
                        + ("; rows of only the model's sequence length leave the last position without a next "
                           "token: save rows one token longer, or the whole stream as one 1-D array" if short else ""))
    if len(windows) == 0:
        raise DataError(f"{source}: {_count(ids.size, 'token')}, not one window of {wanted}; add data, or lower the "
                        f"sequence length (the model's input, e.g. workload.input)")
    return windows


def _checked_ids(source: Path, windows: np.ndarray, vocabulary: int | None) -> np.ndarray:
    """``windows`` as int64, once every id is known to be in ``[0, vocabulary)``.

    Checked here, at open, where the model's vocabulary is passed in, rather than at the first step: there
    an id past the embedding fails inside the executor (an index error on a CPU, a device-side assert on
    CUDA) with no word of the file, after the step's memory and page files are set up; here the message
    names the file, the id and where it is, before anything trains, and each id is checked once, not every
    epoch.
    """
    low, high = int(windows.min()), int(windows.max())  # Python ints: a uint64 id cannot wrap
    if low < 0:
        raise DataError(f"{source}: token id {low:,} {_where(windows, windows < 0)} is negative; token ids count "
                        f"from 0 (a padding or ignore marker such as -100 is no token: drop it from the data)")
    limit = vocabulary if vocabulary is not None else int(np.iinfo(np.int64).max) + 1
    if high >= limit:
        where = _where(windows, windows == high)
        if vocabulary is None:
            raise DataError(f"{source}: token id {high:,} {where} is too large for a token id; save the ids the "
                            f"model's tokenizer gives")
        raise DataError(f"{source}: token id {high:,} {where} is outside the model's vocabulary of {vocabulary:,} "
                        f"(ids 0 to {vocabulary - 1:,}); make the ids with the model's own tokenizer, or train a "
                        f"model whose vocabulary holds {high + 1:,} ids")
    return np.array(windows, dtype=np.int64)  # a copy in RAM: a mapped file stays read-only and is let go


def _where(windows: np.ndarray, mask: np.ndarray) -> str:
    row, column = np.unravel_index(int(np.argmax(mask)), windows.shape)  # the first one, in file order
    return f"(window {row}, position {column})"


def _shape(shape: Sequence[int]) -> str:
    return "x".join(map(str, shape)) or "a scalar"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
