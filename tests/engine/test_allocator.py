"""The caching CPU allocator (engine.allocator): bit-identical on and off, freed blocks reused, RSS in budget.

It is PyTorch's CPU allocator for the whole process once installed, so each case runs in processes of its
own (:mod:`tests.engine.allocator_run`), with ``POET_EDGE_ALLOCATOR`` on or off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import allocator

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, model: str, schedule: str, steps: int, switch: str = "on", **env: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.engine.allocator_run", "--model", model, "--schedule",
                           schedule, "--steps", str(steps), "--swap", str(tmp_path / f"swap-{switch}")],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200,
                          env={**os.environ, allocator.SWITCH: switch, **env})
    assert done.returncode in (0, 3), done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["over"] = done.returncode == 3
    figures["stderr"] = done.stderr
    return figures


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    if allocator.enabled():  # the suite runs where the project's install compiled it
        allocator.build()


@pytest.mark.parametrize("model, schedule", [("unet", "recompute"), ("bert", "page")])
def test_training_is_bit_identical_with_the_allocator_on_and_off(model, schedule, tmp_path) -> None:
    on, off = run(tmp_path, model, schedule, 3), run(tmp_path, model, schedule, 3, "off")
    assert off["allocator"] is None and on["allocator"] is not None
    assert on["digest"] == off["digest"]


def test_freed_blocks_are_reused_and_everything_it_holds_stays_in_the_plan(tmp_path) -> None:
    figures = run(tmp_path, "unet", "recompute", 6)
    stats = figures["allocator"]
    # after the first step nearly every large request finds a block the step before freed
    assert stats["hits"] > 5 * stats["misses"]
    # the cache is bounded by what the step plans to hold in large tensors: never past the budget, less the
    # runtime's own and what malloc holds for the small parameters (their gradients and momentum)
    assert figures["heap_bytes"] == 2 * figures["small_parameter_bytes"] > 0
    assert figures["limit_bytes"] <= (figures["live_at_start"] + figures["budget_bytes"] - figures["runtime_bytes"]
                                      - figures["heap_bytes"])
    assert stats["peak_bytes"] <= figures["limit_bytes"]
    assert not figures["over"]


@pytest.mark.parametrize("model, schedule", [
    ("unet", "recompute"),
    ("bert", "page"),
    ("swin", "recompute"),
    pytest.param("resnet18", "recompute", marks=pytest.mark.slow),
])
def test_rss_stays_within_budget_and_tolerance_over_20_steps(model, schedule, tmp_path) -> None:
    figures = run(tmp_path, model, schedule, 20)
    assert not figures["over"], figures["stderr"][-2000:]
    assert figures["peak_bytes"] <= figures["budget_bytes"] + figures["tolerance_bytes"]
    assert figures["allocator"]["hits"] > figures["allocator"]["misses"]


def test_without_a_compiler_training_keeps_the_fresh_mapping_path(tmp_path) -> None:
    # a fresh library folder and no compiler: nothing to load, a warning, and the same exact training
    figures = run(tmp_path, "unet", "recompute", 2, POET_EDGE_ALLOCATOR_DIR=str(tmp_path / "lib"),
                  CXX=str(tmp_path / "no-such-compiler"))
    assert figures["allocator"] is None
    assert "caching allocator unavailable" in figures["stderr"]
    assert figures["digest"] == run(tmp_path, "unet", "recompute", 2, "off")["digest"]


def test_the_status_command_says_where_the_library_is(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "engine.allocator", "status"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, allocator.DIRECTORY: str(tmp_path)})
    assert done.returncode == 0 and "not built" in done.stdout and str(tmp_path) in done.stdout


ADVISED = """
import torch
from engine import allocator
assert allocator.load() is not None
def advised(tensor):  # the smaps VmFlags of the mapping holding the tensor: hg = advised to use huge pages
    address, flags = tensor.data_ptr(), {}
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif line.startswith("VmFlags:") and inside:
            return "hg" in line.split()[1:]
large, small = torch.ones(5 << 20, dtype=torch.uint8), torch.ones(1 << 20, dtype=torch.uint8)
print(advised(large), advised(small), large.data_ptr() % (2 << 20) == 0)
"""


def test_blocks_of_2_mib_and_more_ask_for_transparent_huge_pages_unless_switched_off() -> None:
    def flags(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", ADVISED], capture_output=True, text=True, cwd=ROOT,
                              timeout=300, env={**os.environ, allocator.SWITCH: "on", **env})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    # a 1 MiB block keeps small pages (a huge one would outgrow it); a large block starts on a 2 MiB boundary, so
    # that each whole 2 MiB of it can be one huge page (the kernel aligns only lengths of whole 2 MiB: not 5 MiB)
    assert flags() == ["True", "False", "True"]
    assert flags(**{allocator.HUGE_PAGES: "off"})[:2] == ["False", "False"]


RESHAPED = """
import json, resource
import torch
from engine import allocator
held = allocator.load()
MiB = 1 << 20
held.set_limit(held.stats().live_bytes + 12 * MiB)
figures = {"page": resource.getpagesize()}
def make(name, mib):  # a tensor made and written, with the page faults that took and the allocator's counts
    before, stats = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, held.stats()
    tensor = torch.empty(mib * MiB, dtype=torch.uint8)
    tensor.fill_(1)
    after = held.stats()
    figures[name] = {"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
                     **{key: getattr(after, key) - getattr(stats, key) for key in ("hits", "misses", "reshaped", "moved")},
                     "cached_mib": after.cached_bytes / MiB, "over_limit": after.peak_bytes - held.limit_bytes}
    return tensor
a = make("fresh", 6)
spacer = make("spacer", 1)  # in use throughout, so that the two blocks freed below are not neighbours
c = make("fresh_too", 4)
a_at, c_at = a.data_ptr(), c.data_ptr()
figures["neighbours"] = a_at + 6 * MiB == c_at or c_at + 4 * MiB == a_at
del a, c  # cached: 6 and 4 MiB, with 1 in use
g = make("gathered", 9)  # no room under the limit, no cached block large enough: 6 MiB and 3 of the 4 moved
g_at = g.data_ptr()
del g
h = make("cut", 5)  # the head of the 9 MiB block
figures["cut_in_place"] = h.data_ptr() == g_at
del h  # joins the 4 MiB left of that block again
k = make("joined", 9)
figures["joined_in_place"] = k.data_ptr() == g_at
print(json.dumps(figures))
"""


def test_a_request_with_no_room_under_the_limit_is_made_of_cached_blocks_without_faulting() -> None:
    done = subprocess.run([sys.executable, "-c", RESHAPED], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, allocator.SWITCH: "on", allocator.HUGE_PAGES: "off"})
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    pages = (1 << 20) // figures["page"]
    assert figures["fresh"]["faults"] >= 6 * pages and figures["fresh"]["misses"] == 1  # fresh: every page faults in
    assert not figures["neighbours"]
    gathered = figures["gathered"]
    # two cached blocks moved side by side (the second one cut: its last MiB stays cached), nothing faulted in
    assert gathered["moved"] == 2 and gathered["reshaped"] == 1 and gathered["misses"] == 0
    assert gathered["faults"] < pages // 4 and gathered["cached_mib"] == 1
    # a smaller request takes the head of a cached block in place; freed, it joins the tail again
    assert figures["cut_in_place"] and figures["cut"]["faults"] < pages // 4 and figures["cut"]["moved"] == 0
    assert figures["joined_in_place"] and figures["joined"]["hits"] == 1 and figures["joined"]["faults"] < pages // 4
    assert all(step["over_limit"] <= 0 for step in figures.values() if isinstance(step, dict))


TIMED = """
import json, sys
import torch
from engine import allocator, rss
from engine.executor import Executor
from engine.extract import extract
from tests.engine.models import TinyUNet, cross_entropy, recompute_everything, schedule_for, unet_example
torch.set_num_threads(1)
torch.manual_seed(0)
model, example = TinyUNet(), unet_example(batch=4, size=32)
graph, segments = extract(model, example, cross_entropy, repeats=2, refine=False)
held = allocator.installed()
after_extraction = {"limit": held.limit_bytes, "cached": held.stats().cached_bytes, "hits": held.stats().hits}
everything = [("compute", node) for node in range(graph.size)]  # nothing freed before the step ends
stored = Executor(model, segments, graph, schedule_for(graph, everything), swap_dir=sys.argv[1])
stored_limit = held.limit_bytes
live = held.stats().live_bytes
tight = Executor(model, segments, graph, schedule_for(graph, recompute_everything(graph)), swap_dir=sys.argv[1])
stored.step(*example)
print(json.dumps({**after_extraction, "stored_limit": stored_limit, "limit_after_its_step": held.limit_bytes,
                  "tight_limit": tight._cache_limit, "live": live,
                  "planned": stored.schedule.predicted_peak_bytes - graph.runtime_bytes}))
"""


def test_extraction_times_nodes_from_the_cache_and_each_executor_steps_under_its_own_limit(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", TIMED, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={**os.environ, allocator.SWITCH: "on"})
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    # the timed runs reused freed blocks, as the executor's steps do; afterwards nothing is cached any more,
    # so RSS follows tensors for the workspace runs and the figures after them
    assert figures["hits"] > 0
    assert figures["limit"] == 0 and figures["cached"] == 0
    # the cache holds no more than the step plans to hold
    assert figures["stored_limit"] == figures["live"] + figures["planned"]
    # another executor built since set a tighter limit; the step put back its own
    assert figures["tight_limit"] < figures["stored_limit"] == figures["limit_after_its_step"]


GATED_TRIM = """
import json
import torch
from engine import allocator, rss
held = allocator.load()
trimmer = rss.HeapTrimmer(threshold=1 << 20, freed_bytes=held.heap_freed_bytes)
# 32 KiB tensors come from glibc's heap (below the caching threshold); a small one kept between each pair pins
# them in the middle of the heap, where free() alone never returns them
freed, kept = [], []
for _ in range(400):
    freed.append(torch.ones(8 << 10))
    kept.append(torch.ones(150))
asked = trimmer.checks
for _ in range(50):  # nothing freed since: the heap is not asked
    trimmer.after_free()
quiet = trimmer.checks - asked
still = rss.current()
del freed
trimmer.after_free()
print(json.dumps({"quiet": quiet, "trims": trimmer.trims, "still": still, "after": rss.current()}))
"""


def test_the_heap_is_asked_for_its_free_bytes_only_once_enough_went_back_to_it() -> None:
    done = subprocess.run([sys.executable, "-c", GATED_TRIM], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, allocator.SWITCH: "on"})
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["quiet"] == 0  # mallinfo2 walks the heap's free lists: not after frees that cannot matter
    assert figures["trims"] == 1 and figures["after"] < figures["still"] - (8 << 20)  # 12.8 MB freed: trimmed


RUNTIME = """
import json, sys
from engine import allocator, profile
on = allocator.load() is not None
first = profile.measure_runtime_bytes(sys.argv[1])
again = profile.measure_runtime_bytes(sys.argv[1])  # blocks the first one freed are cached now
print(json.dumps({"on": on, "runtime": first, "again": again}))
"""


def test_the_runtime_a_plan_leaves_room_for_holds_a_small_page_in_the_bounce_buffer_not_a_large_one(tmp_path) -> None:
    from engine.pagefile.pipeline import CHUNK, SLICES

    def measured(switch: str) -> dict:
        done = subprocess.run([sys.executable, "-c", RUNTIME, str(tmp_path / switch)], capture_output=True, text=True,
                              cwd=ROOT, timeout=300, env={**os.environ, allocator.SWITCH: switch})
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    on, off = measured("on"), measured("off")
    assert on["on"] and not off["on"]
    # without the caching allocator glibc's chunks are off block boundaries: a large page fills all of the bounce
    # buffer; with it a large page moves straight from and into its blocks, and only a small page (1 MiB) fills
    # part of it: about 3 MiB less of the budget kept for the runtime
    assert off["runtime"] >= SLICES * CHUNK
    assert off["runtime"] - on["runtime"] >= 2.5 * CHUNK
    # a probe after other transfers still counts the bounce buffer a small page fills: what they left cached
    # does not stand in for the pages read back
    assert on["again"] >= 0.9 * CHUNK and off["again"] >= SLICES * CHUNK
