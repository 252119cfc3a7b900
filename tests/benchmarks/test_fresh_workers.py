"""``python -m benchmarks.fresh_workers``: the daemon's own worker, in fresh processes, on one prepared plan."""

from __future__ import annotations

import re

import pytest

from benchmarks import fresh_workers


@pytest.mark.slow  # profiles a model and starts three workers (about a minute), out of the default run
def test_each_fresh_worker_reports_its_steps_against_the_budget_and_the_prepared_plan_is_reused(tmp_path,
                                                                                                  capsys) -> None:
    argv = ["--model", "agent.digits:digits_workload", "--input", "16x1x8x8", "--budget", "64MB",
            "--steps", "3", "--dir", str(tmp_path)]
    assert fresh_workers.main([*argv, "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"worker \d: first step \d+\.\d\d MB", out)) == 2
    assert "the plan: activations" in out
    assert re.search(r"2 fresh workers x 3 steps: .* 0 of 2 had a step over the budget, 0 over", out)
    prepared = sorted(tmp_path.glob("state/prepared/*/graph.json"))
    assert len(prepared) == 1
    stamp = prepared[0].stat().st_mtime_ns
    assert fresh_workers.main([*argv, "--workers", "1"]) == 0  # the same folder: profiled once, not again
    assert prepared[0].stat().st_mtime_ns == stamp
    assert "1 fresh workers x 3 steps" in capsys.readouterr().out
