"""Weights files in and out of the version store, read and written with NumPy (the server has no torch).

:func:`read_weights` takes what an operator holds of a pretrained model: a ``.safetensors`` file, a folder
written by transformers' ``save_pretrained`` (its ``model.safetensors``, or every shard a
``model.safetensors.index.json`` names), or an ``.npz`` of arrays; a pickled ``.pt``/``.bin`` is refused with
the one line that converts it, since unpickling could run code.  :func:`write_weights` writes a version's
arrays as ``.safetensors`` (what ``[workload] weights``, transformers and most tools read) or ``.npz``.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from common.files import write_atomically
from common.shard_index import SAFETENSORS_INDEX, shard_files
from server.errors import ModelVersionError
from server.model_versions import encode_weights

FORMATS = {".safetensors": "safetensors", ".npz": "npz"}
_CONVERT = ("python -c \"import sys, torch; from safetensors.torch import save_file; "
            "save_file({k: v.contiguous() for k, v in torch.load(sys.argv[1], weights_only=True).items()}, "
            "sys.argv[2])\" IN.pt OUT.safetensors")


def read_weights(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a pretrained model at ``path``, by name.

    Raises :class:`ModelVersionError` for a missing or unreadable file, a format the server cannot read without
    running code, or a dtype NumPy has not (bfloat16).
    """
    path = Path(path)
    if path.is_dir():
        return _read_folder(path)
    suffix = path.suffix.lower()
    if suffix in (".pt", ".pth", ".bin"):
        raise ModelVersionError(f"{path} is a pickled torch file, which the server does not unpickle (it could run "
                                f"code); convert it to safetensors where torch is installed: {_CONVERT}")
    if suffix not in FORMATS:
        raise ModelVersionError(f"{path}: unknown kind of weights file; give a .safetensors or .npz file, or a "
                                "folder written by save_pretrained")
    if not path.is_file():
        raise ModelVersionError(f"{path} does not exist")
    if suffix == ".npz":
        return _read_npz(path)
    return _read_safetensors(path)


def write_weights(arrays: Mapping[str, np.ndarray], out: Path) -> Path:
    """``arrays`` written atomically to ``out`` in the format its suffix names (:data:`FORMATS`)."""
    out = Path(out)
    kind = FORMATS.get(out.suffix.lower())
    if kind is None:
        raise ModelVersionError(f"{out}: write a .safetensors or .npz file (the suffix picks the format)")
    contiguous = {name: np.asarray(value, order="C") for name, value in arrays.items()}  # 0-d stays 0-d
    try:
        if kind == "safetensors":
            from safetensors.numpy import save

            data = save(contiguous)
        else:
            data = encode_weights(contiguous)
        write_atomically(out, data)
    except OSError as exc:
        raise ModelVersionError(f"cannot write {out}: {exc.strerror or exc}") from exc
    return out


def _read_folder(folder: Path) -> dict[str, np.ndarray]:
    if (folder / "model.safetensors").is_file():
        return _read_safetensors(folder / "model.safetensors")
    if (folder / SAFETENSORS_INDEX).is_file():
        try:
            shards = shard_files(folder / SAFETENSORS_INDEX)
        except ValueError as exc:
            raise ModelVersionError(str(exc)) from exc
        arrays: dict[str, np.ndarray] = {}
        for shard in shards:
            arrays.update(_read_safetensors(shard))
        return arrays
    raise ModelVersionError(f"{folder} holds no model.safetensors or {SAFETENSORS_INDEX}: save the model with "
                            "save_pretrained(..., safe_serialization=True), or give a .safetensors file")


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except OSError as exc:
        raise ModelVersionError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (SafetensorError, ValueError, TypeError) as exc:
        raise ModelVersionError(f"{path} is not a safetensors file NumPy can read ({exc}); bfloat16 weights "
                                "need converting to float32 or float16 first") from exc


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelVersionError(f"{path} is not an .npz of arrays: {exc}") from exc
