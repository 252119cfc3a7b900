"""The fleet's text: next-token prediction on the Python standard library's own source, one package per device.

Real text that every Python installation carries, read from disk (nothing is downloaded), and naturally
non-IID: device ``i`` of a fleet holds the source of one standard-library package (:data:`DEVICE_PACKAGES`, in
that order, those this Python has: ``asyncio`` on one device, ``email`` on the next, ...), a vendor pretrains
on the top-level modules that are in no package (:func:`vendor_text`).  Text is bytes (a vocabulary of 256),
cut into windows of :data:`SEQUENCE` bytes and the byte after each (the next-token targets).  A package's files,
in name order, make one stream: its first 80% trains, the rest is held out (whole windows from text the
device never trained on).  The model is a small GPT-2-style decoder (:func:`text_workload`) with LoRA adapters
on its attention (:mod:`agent.adapters`): the devices train and share only the adapters.

A run config's ``dataset = "python-stdlib"`` (:data:`STDLIB_TEXT`) selects this data in ``poet-edge
simulate``; ``samples`` is then training windows per device (0: all of its package's).
"""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import numpy as np
import torch

from agent.data import LocalDataset
from agent.errors import DataError
from agent.federated.virtual import STDLIB_TEXT
from agent.zoo import Workload

SEQUENCE = 64  # bytes a window holds
VOCABULARY = 256  # bytes
TRAIN_SHARE = 0.8  # of each stream, the first part trains; the rest is held out
# Packages of Python code, largest first, that every CPython 3.10-3.13 has (tkinter and idlelib are left out:
# Debian ships them apart); a fleet's device i holds the i-th of those this Python has, cycling past the end.
DEVICE_PACKAGES = ("asyncio", "email", "multiprocessing", "http", "importlib", "logging", "xml", "ctypes",
                   "urllib", "html", "re", "xmlrpc", "concurrent", "wsgiref", "collections", "json",
                   "zoneinfo", "tomllib", "venv", "curses", "dbm")
LORA_RANK, LORA_ALPHA = 8, 16.0
LAYERS, HIDDEN, HEADS = 2, 64, 4


def stdlib_root() -> Path:
    """This Python's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=1)
def device_packages() -> tuple[str, ...]:
    """The :data:`DEVICE_PACKAGES` this Python has."""
    root = stdlib_root()
    found = tuple(p for p in DEVICE_PACKAGES if (root / p / "__init__.py").is_file())
    if not found:
        raise DataError(f"{root} holds none of the standard library's packages {', '.join(DEVICE_PACKAGES[:4])}...: "
                        "this Python's source is not installed")
    return found


def package_of(partition: int) -> str:
    """The package device ``partition`` holds."""
    packages = device_packages()
    return packages[partition % len(packages)]


@functools.lru_cache(maxsize=64)
def _stream(files: tuple[Path, ...]) -> np.ndarray:
    """The files' bytes, in the order given, each followed by a newline."""
    return np.frombuffer(b"".join(f.read_bytes() + b"\n" for f in files), dtype=np.uint8)


def package_text(package: str) -> np.ndarray:
    """The bytes of a standard-library package's ``.py`` files, in path order."""
    return _stream(tuple(sorted((stdlib_root() / package).rglob("*.py"))))


def vendor_text() -> np.ndarray:
    """The bytes of the top-level modules (``*.py`` in the standard library folder itself, in no package)."""
    return _stream(tuple(sorted(stdlib_root().glob("*.py"))))


def windows(text: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of :data:`SEQUENCE` bytes and, per window, the next byte of each position."""
    count = (len(text) - 1) // SEQUENCE
    x = text[:count * SEQUENCE].reshape(count, SEQUENCE)
    y = text[1:count * SEQUENCE + 1].reshape(count, SEQUENCE)
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))


def text_dataset(text: np.ndarray, *, samples: int, holdout: int, seed: int, batch_size: int,
                 source: str) -> LocalDataset:
    """``samples`` training windows (0: all) from the first :data:`TRAIN_SHARE` of ``text`` and ``holdout``
    windows from the rest, drawn by ``seed``."""
    cut = int(TRAIN_SHARE * len(text))
    train_x, train_y = windows(text[:cut])
    held_x, held_y = windows(text[cut:])
    if len(train_x) < max(samples, batch_size) or len(held_x) < 1:
        raise DataError(f"{source}: {len(train_x)} training windows of {SEQUENCE} bytes, fewer than "
                        f"{max(samples, batch_size)}: lower samples")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.permutation(len(train_x))[:samples]) if samples else np.arange(len(train_x))
    held = np.sort(rng.permutation(len(held_x))[:holdout])
    return LocalDataset(train_x=train_x[rows], train_y=train_y[rows], holdout_x=held_x[held],
                        holdout_y=held_y[held], batch_size=batch_size, seed=seed, source=Path(source))


def device_text(partition: int, *, samples: int, holdout: int, seed: int, batch_size: int) -> LocalDataset:
    """Device ``partition``'s package: its training windows and held-out windows."""
    package = package_of(partition)
    return text_dataset(package_text(package), samples=samples, holdout=holdout, seed=seed + partition,
                        batch_size=batch_size, source=f"{STDLIB_TEXT}/{package}")


def vendor_dataset(*, holdout: int, seed: int, batch_size: int) -> LocalDataset:
    """What a vendor pretrains on: every window of the top-level modules' first part, the rest held out."""
    return text_dataset(vendor_text(), samples=0, holdout=holdout, seed=seed, batch_size=batch_size,
                        source=f"{STDLIB_TEXT}/top-level-modules")


def text_workload(seed: int, batch_size: int, *, adapters: bool = True, initial_weights: str = "") -> Workload:
    """A GPT-2-style decoder over bytes (:data:`LAYERS` layers, width :data:`HIDDEN`), at its seeded weights or
    ``initial_weights`` (the base model's, such as a vendor's pretraining writes), then with ``adapters`` LoRA
    on its attention (rank :data:`LORA_RANK`): the base frozen."""
    from agent.zoo import decoder_lm, next_token_cross_entropy

    torch.manual_seed(seed)
    model = decoder_lm("gpt2", layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCABULARY, positions=SEQUENCE)
    if initial_weights:
        from agent.weights import load_weights

        load_weights(model, Path(initial_weights))
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCABULARY, (batch_size, SEQUENCE + 1), generator=generator)
    work = Workload("stdlib-gpt2", model, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(),
                    next_token_cross_entropy)
    if not adapters:
        return work
    from agent.adapters import LoraSettings, with_adapters

    torch.manual_seed(seed)  # the adapters' own initial weights, the same on every device
    return with_adapters(work, LoraSettings(LORA_RANK, LORA_ALPHA))
