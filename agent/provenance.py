"""Where a device's personalized model came from (``STATE_DIR/personal/model.json``), read without torch.

:mod:`agent.personal_model` writes it beside the weights; ``poet-edge agent status`` shows it and the daemon puts
the kept model and its margins into its status (and so its heartbeats) from it.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

FOLDER = "personal"
WEIGHTS = "model.pt"
PROVENANCE = "model.json"


@dataclass(frozen=True)
class Provenance:
    """Where a personalized model came from."""

    model: str  # the workload's model name
    input: str  # the input shape it was trained on, e.g. 16x1x8x8
    global_version: int | None  # the server's global model version it started from (None: not stored there)
    run_id: int  # the Flower run that personalized it
    personalization: str  # finetune, fedper, fedbn, ...
    steps: int
    accuracy_before: float  # held-out (test half) accuracy of the global model on this device's data
    accuracy_after: float  # ... of the personalized model
    sha256: str  # of model.pt
    saved_at: float
    # the device's configured pretrained weights (agent.weights.fingerprint; None: seeded initial weights)
    weights_sha256: str | None = None
    # which candidate model.pt is (common.keep_best: global, personal or local), chosen on the selection half
    kept: str = "personal"
    accuracy_kept: float | None = None  # its test-half accuracy
    accuracy_local: float | None = None  # the local-only model's, where the run trained one


def folder(state_dir: Path) -> Path:
    """Where the personalized model lives in ``state_dir``."""
    return Path(state_dir) / FOLDER


def read_provenance(state_dir: Path) -> Provenance | None:
    """The kept model's provenance, or ``None`` when none is kept (or its file is unreadable)."""
    try:
        data = json.loads((folder(state_dir) / PROVENANCE).read_text())
        return Provenance(**{f.name: data[f.name] for f in fields(Provenance)
                             if f.name in data or f.default is MISSING})  # older files lack the newer fields
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept_summary(state_dir: Path) -> dict[str, Any]:
    """The status fields of the kept model: which candidate, its held-out accuracy and its margins over the
    global and the local-only model in points of accuracy as a share (``None`` where unknown)."""
    p = read_provenance(state_dir)
    if p is None:
        return {"kept_model": None, "kept_accuracy": None, "kept_margin_global": None, "kept_margin_local": None}
    accuracy = p.accuracy_kept if p.accuracy_kept is not None else p.accuracy_after
    return {"kept_model": p.kept, "kept_accuracy": accuracy,
            "kept_margin_global": accuracy - p.accuracy_before,
            "kept_margin_local": None if p.accuracy_local is None else accuracy - p.accuracy_local}
