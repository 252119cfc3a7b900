"""``benchmarks.server_load --quick``: a real server process under simulated devices and operators yields figures,
no errors."""

from __future__ import annotations

import re

import pytest

from benchmarks.server_load import main


@pytest.mark.slow  # a benchmark run against a real server (about 30 s), out of the default run to keep it short
def test_a_quick_sqlite_run_prints_figures_with_zero_errors(capsys) -> None:
    assert main(["--quick", "--backends", "sqlite", "--knee-max", "40"]) == 0  # the main window only
    out = capsys.readouterr().out
    rate = float(re.search(r"^requests per second\s+([0-9.]+)", out, re.M).group(1))
    p99 = float(re.search(r"^device API p99 latency \(ms\)\s+([0-9.]+)", out, re.M).group(1))
    fleet_p99 = float(re.search(r"^fleet page p99 latency \(ms\)\s+([0-9.]+)", out, re.M).group(1))
    pages = int(re.search(r"^fleet pages measured\s+([0-9,]+)", out, re.M).group(1).replace(",", ""))
    assert rate > 10 and 0 < p99 < 10_000 and 0 < fleet_p99 < 10_000
    assert pages >= 2  # two operators, each a page every 2 s over the 4 s window
    assert re.search(r"^errors\s+0 met", out, re.M), out
    assert re.search(r"^server RSS growth \(MB\)\s+[-+][0-9.]+ ", out, re.M), out
    assert "WARNING" not in out
