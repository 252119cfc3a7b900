"""A device's personalized model: kept in its state directory with where it came from, exported for inference.

``STATE_DIR/personal/model.pt`` holds the whole model's weights (the candidate the device kept:
:mod:`common.keep_best`; ``torch.save`` of the state dict, written atomically) and ``STATE_DIR/personal/model.json``
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.errors import PersonalModelError
from agent.provenance import PROVENANCE, WEIGHTS, Provenance, folder, read_provenance  # noqa: F401 - also here
from common.files import write_atomically

EXPORT_FORMATS = ("torchscript", "onnx")


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
    :func:`export`); LoRA adapters are merged into the base weights first."""
    import torch

    from agent.adapters import merged_for_inference

    _check_format(format)
    model = merged_for_inference(model)
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
