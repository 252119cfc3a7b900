"""``python -m benchmarks.executor`` end to end on a small model: every figure it prints comes out of one run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 30 s of profiling and planning: the default run keeps under 20 minutes on 2 cores (the
# yardstick's allocator is also held by tests/benchmarks/test_default_allocator.py and test_memory_benchmark.py)
def test_the_executor_benchmark_runs_and_prints_plain_with_its_default_allocator(tmp_path):
    figures = tmp_path / "figures.json"
    command = [sys.executable, "-m", "benchmarks.executor", "--models", "gpt2:2x32", "--budgets", "1.0,0.5",
               "--repeats", "1", "--time-limit", "10", "--swap-dir", str(tmp_path / "swap"), "--json", str(figures)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [model] = json.loads(figures.read_text())
    assert [row["fraction"] for row in model["rows"]] == [1.0, 0.5]
    assert all(row["feasible"] and row["growth"] is not None for row in model["rows"])
    # the yardstick from its own process: a step time, and the memory it holds for it
    assert model["default_allocator_plain_seconds"] > 0 and model["default_allocator_plain_growth"] > 0
    assert "glibc's default allocator" in run.stdout and "of M) of RSS growth for it" in run.stdout
    assert "step time at 50% of M" in run.stdout
