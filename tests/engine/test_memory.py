"""Real memory: under a tight schedule the process's peak RSS grows less than under store-all.

Measured in a fresh interpreter with ``MALLOC_MMAP_THRESHOLD_`` set so freed
activations return to the system (see ``engine.rss``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, torch
from engine.executor import Executor
from engine.extract import extract
from schedules.plan import plan
from tests.engine.models import TinyUNet, cross_entropy, page_everything, schedule_for

torch.manual_seed(0)
model = TinyUNet(c=16).train()
example = (torch.randn(8, 3, 128, 128), torch.randint(0, 4, (8, 128, 128)))
graph, segments = extract(model, example, cross_entropy, repeats=1, refine=False)
tight = page_everything(graph)
schedules = {"store-all": plan(graph, "rpi4", method="store-all").schedule,
             "tight": schedule_for(graph, tight, budget=None)}
out = {}
for name, schedule in schedules.items():
    with Executor(model, segments, graph, schedule, swap_dir=sys.argv[1]) as ex:
        growth = []
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            ex.step(*example)
            growth.append(ex.last_stats.peak_rss_growth_bytes)
        out[name] = {"growth": min(growth[1:]), "ledger": ex.last_stats.ledger_peak_bytes}
print(json.dumps(out))
"""


def test_peak_rss_is_lower_under_a_tight_schedule(tmp_path):
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    full, tight = result["store-all"], result["tight"]
    assert tight["ledger"] < full["ledger"] / 2
    # the real process memory follows the ledger: most of the saving shows up in RSS
    assert tight["growth"] < full["growth"] - 0.5 * (full["ledger"] - tight["ledger"]), result


_HEAP_SCRIPT = """
import json, sys
from engine import rss
trimmer = rss.HeapTrimmer(threshold=1 << 20)
if not trimmer.enabled:
    print(json.dumps(None)); sys.exit()
# 32 KiB blocks come from the heap (below the mmap threshold); a small block kept between each pair pins them
# in the middle of the heap, where free() alone never returns them
freed, kept = [], []
for _ in range(400):
    block = bytearray(32 << 10)
    block[::4096] = b"x" * len(block[::4096])
    freed.append(block)
    kept.append(bytearray(600))
before = rss.current()
trimmer.after_free()
untrimmed = trimmer.trims
del freed
still = rss.current()
trimmer.after_free()
print(json.dumps({"untrimmed": untrimmed, "trims": trimmer.trims, "before": before, "still": still,
                  "after": rss.current()}))
"""


def test_freed_heap_memory_is_trimmed_once_enough_of_it_is_free():
    out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT], capture_output=True, text=True, check=True,
                         cwd=REPO, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    figures = json.loads(out.stdout)
    if figures is None:
        pytest.skip("no glibc mallinfo2/malloc_trim here")
    assert figures["untrimmed"] == 0 and figures["trims"] == 1  # nothing free before; 12.8 MB free after
    assert figures["still"] > figures["before"] - (4 << 20)      # free() alone kept the pages
    assert figures["after"] < figures["still"] - (8 << 20)       # the trim gave them back
