"""Where pretrained weights are and what they are, without reading a tensor: the torch-free half of
:mod:`agent.weights`, which the config check (and the waiting daemon) can import.

:func:`problems` says what is wrong with a ``[workload] weights`` path; :func:`files` lists the files that hold
the weights (a ``save_pretrained`` folder's config and every shard); :func:`fingerprint` hashes them (SHA-256 of
each file's name and bytes, in order), the identity checkpoints and personal models keep.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from agent.errors import WeightsError
from common.shard_index import shard_files

STATE_DICT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
CONFIG = "config.json"
# what save_pretrained writes, in the order transformers itself looks for them
_FOLDER_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")


def is_pretrained_folder(path: Path) -> bool:
    """Whether ``path`` is a ``save_pretrained`` folder (it has ``config.json``)."""
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def problems(path: Path) -> list[str]:
    """What is wrong with ``[workload] weights = path`` without reading a tensor (empty when usable)."""
    path = Path(path)
    if not path.exists():
        return [f"workload.weights {path} does not exist: give a .safetensors or .pt state dict, or a folder "
                "written by save_pretrained"]
    if path.is_dir():
        if not is_pretrained_folder(path):
            return [f"workload.weights {path} is a folder without {CONFIG}: give a folder written by "
                    "save_pretrained, or the state dict file itself"]
        if _folder_weights(path) is None:
            return [f"workload.weights {path} has no weights ({', '.join(_FOLDER_WEIGHTS)}): save the model "
                    "with save_pretrained again"]
        return []
    if path.suffix.lower() not in STATE_DICT_SUFFIXES:
        return [f"workload.weights {path}: unknown kind of file {path.suffix or '(no suffix)'!r}; give a "
                f"state dict ({', '.join(STATE_DICT_SUFFIXES)}) or a save_pretrained folder"]
    return []


def files(path: Path) -> list[Path]:
    """The files that hold the weights at ``path`` (for a folder: its config and every weight shard)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    found = _folder_weights(path)
    if found is None:
        raise WeightsError(problems(path)[0])
    shards = [found]
    if found.name.endswith(".index.json"):
        try:
            shards = shard_files(found)
        except ValueError as exc:
            raise WeightsError(str(exc)) from exc
    return [path / CONFIG, *shards]


def fingerprint(path: Path) -> str:
    """SHA-256 over the weight files' names and contents: what a checkpoint or personal model started from."""
    digest = hashlib.sha256()
    for file in files(path):
        digest.update(file.name.encode() + b"\0")
        try:
            with file.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as exc:
            raise WeightsError(f"cannot read weights {file}: {exc.strerror or exc}") from exc
    return digest.hexdigest()


def describe(sha256: str | None) -> str:
    """A fingerprint for a message: ``pretrained weights 1a2b3c4d5e6f``, or the seeded initial weights."""
    return f"pretrained weights {sha256[:12]}" if sha256 else "seeded initial weights"


# -- a save_pretrained folder ----------------------------------------------------------
def _folder_weights(folder: Path) -> Path | None:
    for name in _FOLDER_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    return None
