"""The kept model's provenance: written beside its weights, read without torch into the status (and so the
heartbeats), and still read from files written before the kept model was chosen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agent.daemon.status import FIELDS
from agent.personal_model import keep
from agent.provenance import PROVENANCE, folder, kept_summary, read_provenance


def test_the_status_gives_the_kept_model_and_its_margins(tmp_path: Path) -> None:
    assert kept_summary(tmp_path)["kept_model"] is None  # nothing personalized yet
    keep(tmp_path, {"w": torch.ones(2)}, model="digits", input="16x1x8x8", global_version=3, run_id=9,
         personalization="finetune", steps=30, accuracy_before=0.60, accuracy_after=0.70, kept="local",
         accuracy_kept=0.75, accuracy_local=0.75)
    summary = kept_summary(tmp_path)
    assert set(summary) <= set(FIELDS)  # status fields: in every status file and heartbeat
    assert summary["kept_model"] == "local" and summary["kept_accuracy"] == 0.75
    assert summary["kept_margin_global"] == pytest.approx(0.15) and summary["kept_margin_local"] == 0.0


def test_a_provenance_written_before_the_choice_reads_as_the_personalized_model_kept(tmp_path: Path) -> None:
    keep(tmp_path, {"w": torch.ones(2)}, model="digits", input="16x1x8x8", global_version=None, run_id=1,
         personalization="fedbn", steps=5, accuracy_before=0.5, accuracy_after=0.6)
    path = folder(tmp_path) / PROVENANCE
    older = {k: v for k, v in json.loads(path.read_text()).items()
             if k not in ("kept", "accuracy_kept", "accuracy_local", "weights_sha256")}
    path.write_text(json.dumps(older))
    assert read_provenance(tmp_path).kept == "personal"
    assert kept_summary(tmp_path)["kept_margin_global"] == pytest.approx(0.1)
