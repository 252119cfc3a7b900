"""A device's personalized model: kept in its state directory with where it came from, exported for inference.

``STATE_DIR/personal/model.pt`` holds the whole model's weights (the shared layers as fine-tuned and the
personal ones; ``torch.save`` of the state dict, written atomically) and ``STATE_DIR/personal/model.json``
its provenance (:class:`Provenance`: the global model version it was personalized from, the Flower run, the
steps, held-out accuracy before and after, and the weights file's SHA-256, which ties the two files
together).  A later personalization replaces both; neither ever leaves the device.

:func:`read_provenance` needs no torch (``poet-edge agent status`` shows it); :func:`load` checks the
weights against the hash; :func:`export` writes them as a TorchScript or ONNX file for inference
(``poet-edge agent export``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from agent.errors import PersonalModelError
from common.files import write_atomically

FOLDER = "personal"
WEIGHTS = "model.pt"
PROVENANCE = "model.json"
EXPORT_FORMATS = ("torchscript", "onnx")


@dataclass(frozen=True)
class Provenance:
    """Where a personalized model came from."""

    model: str  # the workload's model name
    input: str  # the input shape it was trained on, e.g. 16x1x8x8
    global_version: int | None  # the server's global model version it started from (None: not stored there)
    run_id: int  # the Flower run that personalized it
    personalization: str  # finetune, fedper, fedbn, ...
    steps: int
    accuracy_before: float  # held-out accuracy of the global model on this device's data
    accuracy_after: float
    sha256: str  # of model.pt
    saved_at: float
    # the device's configured pretrained weights (agent.weights.fingerprint; None: seeded initial weights)
    weights_sha256: str | None = None


def folder(state_dir: Path) -> Path:
    """Where the personalized model lives in ``state_dir``."""
    return Path(state_dir) / FOLDER


def keep(state_dir: Path, weights: dict[str, Any], **provenance: Any) -> Provenance:
    """Write ``weights`` and their provenance atomically (weights first: a provenance file always names the
    weights beside it)."""
    import torch

    target = folder(state_dir)
    buffer = io.BytesIO()
    torch.save({k: v.detach() for k, v in weights.items()}, buffer)
    data = buffer.getvalue()
    write_atomically(target / WEIGHTS, data)
    digest = hashlib.sha256(data).hexdigest()
    record = Provenance(sha256=digest, saved_at=time.time(), **provenance)
    write_atomically(target / PROVENANCE, json.dumps(asdict(record), indent=1).encode())
    return record


def read_provenance(state_dir: Path) -> Provenance | None:
    """The kept model's provenance, or ``None`` when none is kept (or its file is unreadable)."""
    try:
        data = json.loads((folder(state_dir) / PROVENANCE).read_text())
        return Provenance(**{f.name: data[f.name] for f in fields(Provenance)
                             if f.name in data or f.default is MISSING})  # older files lack the newer fields
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(state_dir: Path) -> tuple[Provenance, dict[str, Any]]:
    """The kept model's provenance and weights, the weights checked against the provenance's hash."""
    import torch

    provenance = read_provenance(state_dir)
    if provenance is None:
        raise PersonalModelError(f"no personalized model is kept in {folder(state_dir)}: it is made by a federated "
                                 "run's personalization (poet-edge server federate) with this device taking part")
    path = folder(state_dir) / WEIGHTS
    try:
        if _sha256(path) != provenance.sha256:
            raise PersonalModelError(f"{path} does not match its provenance (another write was cut short, or the "
                                     "file was changed): personalize again")
        return provenance, torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise PersonalModelError(f"cannot read {path}: {exc.strerror or exc}") from exc


def export(state_dir: Path, model: Any, example: Any, out: Path, format: str) -> Path:
    """Write the kept weights in ``model`` (built as the agent builds it, ``example`` one input batch) to
    ``out`` as TorchScript (``torch.jit.trace``) or ONNX (``torch.onnx.export``), in inference mode."""
    _check_format(format)
    _, weights = load(state_dir)
    model.load_state_dict(weights)
    return write_inference(model, example, out, format)


def write_inference(model: Any, example: Any, out: Path, format: str) -> Path:
    """``model`` with the weights it has, in inference mode, to ``out`` as TorchScript or ONNX (see
    :func:`export`)."""
    import torch

    _check_format(format)
    model.eval()
    inputs = example if isinstance(example, tuple) else (example,)
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if format == "torchscript":
            torch.jit.trace(model, inputs).save(str(out))
        else:
            torch.onnx.export(model, inputs, str(out), input_names=["input"], output_names=["output"],
                              dynamo=False)
    return out


def _check_format(format: str) -> None:
    if format not in EXPORT_FORMATS:
        raise PersonalModelError(f"export format {format!r} unknown; use one of {', '.join(EXPORT_FORMATS)}")
    if format == "onnx" and importlib.util.find_spec("onnx") is None:  # torch's exporter writes with it
        raise PersonalModelError("ONNX export needs the onnx package (pip install onnx); "
                                 "--format torchscript needs nothing more")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
