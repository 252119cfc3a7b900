"""The agent tests' device: the rig of :mod:`demo.devices` with a small MLP and a CSV data set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from demo.devices import (REPO, FakeDevice, agent_command, copy_prepared, read_status, start_agent,  # noqa: F401
                                  stop, wait_for)
from demo.devices import write_config as _write_config

MODEL = "tests.engine.models:mlp"  # 32 features -> 5 classes, dropout between segments
INPUT = "8x32"


def write_csv(path: Path, rows: int = 200, bad_rows: int = 2, seed: int = 0) -> Path:
    """A CSV data set the MLP learns (the label is the argmax of the first five features), with bad rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 32)).astype(np.float32)
    y = x[:, :5].argmax(axis=1)
    lines = [",".join([f"f{i}" for i in range(32)] + ["label"])]
    lines += [",".join(f"{v:.5f}" for v in row) + f",{label}" for row, label in zip(x, y)]
    for k in range(bad_rows):
        lines.insert(5 + k, ",".join(["oops"] * 33))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(directory: Path, device: FakeDevice, data: Path, **overrides: Any) -> Path:
    """The test config: the MLP on ``data``; overrides as :func:`demo.devices.write_config` takes them."""
    return _write_config(directory, device, data, MODEL, INPUT, **overrides)
