"""The whole-step benchmark's yardstick: plain PyTorch as its users run it, ours as the agent runs."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import memory
from benchmarks.default_allocator import MMAP_VARIABLE


def test_plain_runs_with_glibcs_default_allocator_and_the_threads_asked_for(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(MMAP_VARIABLE, "65536")  # as a process that ran the executor has it
    figures = memory._child("resnet18", "plain", tmp_path, 2, input="2x3x32x32")
    assert figures[MMAP_VARIABLE] is None and not figures["caching_allocator"]
    assert figures["threads"] == 2
    assert figures["memory"] > 0 and figures["seconds"] > 0 and figures["over"] == 0
    assert os.environ[MMAP_VARIABLE] == "65536"  # the benchmark's own process is left alone


def test_the_noise_is_how_far_plain_again_lies_from_plain() -> None:
    rows = [memory.Row("plain", "plain", ratios=[1.0] * 9), memory.Row("plain again", "plain",
                                                                       ratios=[1.0, 1.02, 0.98, 1.01, 0.99] * 2)]
    quiet = memory.noise({"rows": [memory.asdict(r) for r in rows]})
    rows[1].ratios = [1.0, 1.2, 0.8, 1.1, 0.9] * 2
    loud = memory.noise({"rows": [memory.asdict(r) for r in rows]})
    assert quiet < memory.NOISE_LIMIT <= loud
