"""A device agent's part of a federated run, kept on disk so that it outlives its SuperNode.

Flower keeps what a ClientApp remembers between a run's messages in ``context.state``, in the SuperNode's
memory: personal layers (``fedper``, ``fedbn``), the next batch's position and the steps of each round (which
the local-only baseline repeats).  A SuperNode or agent restart would reset them, and the device would carry on
the run with its initial personal layers, unseen.  The device agent's ClientApp therefore mirrors
``context.state`` to ``STATE_DIR/flower/runs/<run id>.pt`` after each message that changes it, in one file
written atomically (the layers and the position always agree), and a fresh context restores it first.

Between a personalization and the fleet's choice (``train.keep``) the device's candidates (the global model, its
personalized one, its local-only one) wait in files of their own under ``STATE_DIR/flower/candidates/<run id>/``,
not in ``context.state``: three more copies of the model in the SuperNode's memory for as long as the fleet takes
to choose, and in every write of the run's file, is what a device with a large model has no room for.

The files hold tensors and plain values only and are read with ``weights_only``: no code runs.  A file that
cannot be read, or holds layers of another model, stops the device's part of the run with an error that names
it and is left where it is: nothing is lost.  The newest :data:`KEEP_RUNS` runs' files are kept.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from agent.errors import FederationError
from common.files import write_atomically

KEEP_RUNS = 4  # the newest runs' files a device keeps; older ones are removed as a new one is written


def state_file(state_dir: Path, run_id: int) -> Path:
    """Where the device's state of Flower run ``run_id`` is kept."""
    return state_dir / "flower" / "runs" / f"{run_id}.pt"


def restore(context: Context, state_dir: Path, model: dict[str, torch.Tensor]) -> bool:
    """Fill an empty ``context.state`` from the run's file, if there is one; whether it did.

    ``model`` is the device's full state dict: every array restored must be one of its entries, of its shape and
    dtype (else another model's state: :class:`~agent.errors.FederationError`)."""
    path = state_file(state_dir, int(context.run_id))
    if len(context.state) or not path.exists():
        return False
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        arrays, configs = saved["arrays"], saved["configs"]
    except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds on a damaged file
        raise FederationError(f"cannot read this device's state of run {context.run_id} from {path} ({exc}): "
                              "move the file away to take part in the run with fresh personal layers") from exc
    for key, tensors in arrays.items():
        _check_layers(path, key, tensors, model)
        context.state[key] = ArrayRecord({name: tensor for name, tensor in tensors.items()})
    for key, values in configs.items():
        context.state[key] = ConfigRecord(values)
    return True


def persist(context: Context, state_dir: Path) -> Path:
    """Write ``context.state`` to the run's file (atomically), and remove the files of older runs."""
    arrays: dict[str, dict[str, torch.Tensor]] = {}
    configs: dict[str, dict[str, Any]] = {}
    for key, record in context.state.items():
        if isinstance(record, ArrayRecord):
            arrays[key] = record.to_torch_state_dict()
        elif isinstance(record, ConfigRecord):
            configs[key] = dict(record)
    path = state_file(state_dir, int(context.run_id))
    _save(path, {"arrays": arrays, "configs": configs})
    _prune(path.parent)
    return path


def candidates_folder(state_dir: Path, run_id: int) -> Path:
    """Where the candidates of run ``run_id``'s personalization wait for the fleet's choice."""
    return state_dir / "flower" / "candidates" / str(run_id)


def write_candidates(state_dir: Path, run_id: int, candidates: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """Write each candidate's weights to a file of its own (atomically, one at a time), and remove the candidates
    of runs older than the newest :data:`KEEP_RUNS`, whose fleet never chose (a run personalizing beside this
    one on the same SuperNode keeps its own)."""
    folder = candidates_folder(state_dir, run_id)
    for name, weights in candidates.items():
        _save(folder / f"{name}.pt", {key: tensor.detach() for key, tensor in weights.items()})
    runs = folder.parent.iterdir() if folder.parent.is_dir() else ()  # none where there were no candidates
    others = sorted((f for f in runs if f != folder), key=lambda f: f.stat().st_mtime, reverse=True)
    for stale in others[KEEP_RUNS - 1:]:
        shutil.rmtree(stale, ignore_errors=True)


def read_candidate(state_dir: Path, run_id: int, name: str, model: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Candidate ``name`` of run ``run_id``, checked against ``model`` (the device's full state dict).

    Raises :class:`~agent.errors.FederationError` where its file is missing, cannot be read, or holds another
    model's layers."""
    path = candidates_folder(state_dir, run_id) / f"{name}.pt"
    if not path.exists():
        raise FederationError(f"the {name} candidate of run {run_id} is not at {path}: it was removed while the "
                              "fleet chose; the device keeps the model it kept at personalization")
    try:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load raises many kinds on a damaged file
        raise FederationError(f"cannot read the {name} candidate of run {run_id} from {path} ({exc}); the device "
                              "keeps the model it kept at personalization") from exc
    _check_layers(path, name, weights, model, "the device keeps the model it kept at personalization")
    return weights


def remove_candidates(state_dir: Path, run_id: int) -> None:
    """Let run ``run_id``'s candidates go (once the fleet chose)."""
    shutil.rmtree(candidates_folder(state_dir, run_id), ignore_errors=True)


def _save(path: Path, saved: dict[str, Any]) -> None:
    """``torch.save`` of ``saved`` to ``path``, atomically."""
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    write_atomically(path, buffer.getvalue())


def _check_layers(path: Path, key: str, tensors: dict[str, torch.Tensor], model: dict[str, torch.Tensor],
                  remedy: str = "move the file away to take part with fresh personal layers") -> None:
    for name, tensor in tensors.items():
        own = model.get(name)
        if own is None or own.shape != tensor.shape or own.dtype != tensor.dtype:
            found = "not in it" if own is None else f"{tuple(own.shape)} {own.dtype}"
            raise FederationError(
                f"{path} holds {key} layer {name} ({tuple(tensor.shape)} {tensor.dtype}) for another model (the "
                f"device's: {found}): the agent's model changed during the run; {remedy}")


def _prune(folder: Path) -> None:
    runs = sorted(folder.glob("*.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in runs[KEEP_RUNS:]:
        old.unlink(missing_ok=True)
