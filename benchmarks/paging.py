"""Paging benchmark: the pager's page-out and page-in bandwidth against the filesystem's raw bandwidth, in one run.

For each page size seen in practice (1 to 32 MB) and each slot layout (one
storage; four storages of uneven sizes, as a node's output plus its saved
tensors), pages go through :class:`engine.pager.Pager` exactly as the executor
uses it (reserve, background write, wait, prefetch, read, end of step), and the
bandwidth is bytes / seconds of the pager's I/O thread, the figure the
executor's ``StepStats`` reports.  Each page is read back twice: into fresh
memory, and into the storages of a value of its layout just freed (memory
mapped in already; the executor reads there where the budget allows).  Raw bandwidth: :func:`raw_bandwidth`, a
256 MiB file written with plain ``write`` calls, ``fsync``'d, its page cache
dropped, read back.

Everything runs twice: idle, and while a second thread runs a convolution loop
at one torch thread, as a training step does beside the pager's thread.  Ratios
are to the idle raw bandwidth (what ``benchmarks.executor`` divides by).

Run ``python -m benchmarks.paging`` (``--swap-dir`` to measure another
filesystem; ``--json`` keeps every figure).  ``--throttle MBPS`` (root, cgroup
v1 blkio) runs everything, raw figures included, with the swap disk limited to
that many MB/s each way: flash of an SD card or eMMC's class, where the medium
rather than the host's memory bounds paging.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator

import torch

from engine.pager import Pager

MB = 1e6


@functools.lru_cache(maxsize=1)
def _random_bytes(nbytes: int) -> torch.Tensor:
    """The raw measurement's file contents, made once: the executor benchmark measures raw before every POET
    step, and drawing 256 MiB of random bytes takes longer than writing them."""
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8)


def raw_bandwidth(directory: Path, nbytes: int = 256 << 20, repeats: int = 3) -> tuple[float, float]:
    """Sequential write and read bytes/s of a large file in ``directory`` (fsync'd, page cache dropped)."""
    view = memoryview(_random_bytes(nbytes).numpy()).cast("B")
    into = memoryview(torch.empty(nbytes, dtype=torch.uint8).numpy()).cast("B")
    path = directory / f"raw-{os.getpid()}.bin"
    writes, reads = [], []
    try:
        for _ in range(repeats):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            started = time.perf_counter()
            for start in range(0, nbytes, 8 << 20):
                os.write(fd, view[start:start + (8 << 20)])
            os.fsync(fd)
            writes.append(nbytes / (time.perf_counter() - started))
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
            for start in range(0, nbytes, 8 << 20):
                os.readv(fd, [into[start:start + (8 << 20)]])
            reads.append(nbytes / (time.perf_counter() - started))
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return statistics.median(writes), statistics.median(reads)


def slot_layout(total: int, slots: int) -> list[int]:
    """``total`` bytes cut into ``slots`` uneven storages (halves, then the rest; odd sizes on purpose)."""
    sizes, left = [], total
    for _ in range(slots - 1):
        sizes.append(left // 2 + 3)
        left -= sizes[-1]
    return [*sizes, left]


def pager_bandwidth(directory: Path, slot_bytes: list[int], repeats: int) -> tuple[float, float, float]:
    """Median bytes/s of one page of ``slot_bytes`` through a :class:`Pager`: page-out, page-in into fresh
    memory, and page-in into the storages of a value just freed (what the executor does where
    :func:`schedules.timeline.plan_io` finds a freed value of the page's layout)."""
    storages = [torch.randint(0, 256, (n,), dtype=torch.uint8).untyped_storage() for n in slot_bytes]
    pager = Pager(directory)
    outs, ins, into_freed = [], [], []
    try:
        for _ in range(repeats):
            pager.reset_counters()
            pager.reserve({1: sum(slot_bytes)})
            pager.write(1, storages)
            pager.wait_written(1)
            pager.read(1, slot_bytes)
            outs.append(pager.bytes_out / pager.seconds["out"])
            ins.append(pager.bytes_in / pager.seconds["in"])
            # a value of the same layout, computed (its memory mapped in) and freed
            pager.donate("freed", [torch.zeros(n, dtype=torch.uint8).untyped_storage() for n in slot_bytes])
            pager.reset_counters()
            pager.read(1, slot_bytes, reuse="freed")
            assert pager.reads_into_kept == 1, "the read did not take the freed value's memory"
            into_freed.append(pager.bytes_in / pager.seconds["in"])
            pager.end_step()
    finally:
        pager.close()
    return statistics.median(outs), statistics.median(ins), statistics.median(into_freed)


@contextmanager
def compute_load(active: bool, step: Callable[[], object] | None = None) -> Iterator[list[int]]:
    """A second thread running ``step`` over and over (by default convolutions at one torch thread), as a
    training step runs beside the pager; yields the count of steps done."""
    stop, done = threading.Event(), [0]
    if step is None:
        conv, x = torch.nn.Conv2d(64, 64, 3, padding=1), torch.randn(8, 64, 32, 32)

        def step() -> None:
            with torch.no_grad():
                conv(x)

    def loop() -> None:
        while not stop.is_set():
            step()
            done[0] += 1

    thread = threading.Thread(target=loop, daemon=True) if active else None
    if thread:
        thread.start()
    try:
        yield done
    finally:
        stop.set()
        if thread:
            thread.join()


def run(directory: Path, sizes_mb: list[int], layouts: list[int], repeats: int) -> dict:
    """Every figure, idle and under load."""
    result: dict = {"raw": {}, "pages": []}
    for loaded in (False, True):
        label = "load" if loaded else "idle"
        with compute_load(loaded):
            result["raw"][label] = raw_bandwidth(directory)
            for size in sizes_mb:
                for slots in layouts:
                    out, into, freed = pager_bandwidth(directory, slot_layout(size << 20, slots), repeats)
                    result["pages"].append({"load": label, "mb": size, "slots": slots, "out_bps": out, "in_bps": into,
                                            "in_freed_bps": freed})
                    print(f"  {label} {size:>3} MB x{slots}: out {out / MB:6.0f} MB/s, in {into / MB:6.0f} MB/s, "
                          f"in into a freed value {freed / MB:6.0f} MB/s", flush=True)
    return result


def print_report(result: dict) -> None:
    raw_w, raw_r = result["raw"]["idle"]
    print(f"\nraw idle: write {raw_w / MB:.0f} MB/s, read {raw_r / MB:.0f} MB/s; raw under load: write "
          f"{result['raw']['load'][0] / MB:.0f} MB/s, read {result['raw']['load'][1] / MB:.0f} MB/s")
    print("`in` reads into fresh memory, `freed` into the storages of a value just freed")
    print("| page | slots | idle out MB/s | /raw | idle in MB/s | /raw | freed | /raw "
          "| load out MB/s | /raw | load in MB/s | /raw | freed | /raw |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows: dict[tuple[int, int], dict[str, dict]] = {}
    for page in result["pages"]:
        rows.setdefault((page["mb"], page["slots"]), {})[page["load"]] = page
    for (size, slots), by_load in rows.items():
        cells = []
        for label in ("idle", "load"):
            page = by_load[label]
            cells += [f"{page['out_bps'] / MB:.0f}", f"{page['out_bps'] / raw_w:.2f}",
                      f"{page['in_bps'] / MB:.0f}", f"{page['in_bps'] / raw_r:.2f}",
                      f"{page['in_freed_bps'] / MB:.0f}", f"{page['in_freed_bps'] / raw_r:.2f}"]
        print(f"| {size} MB | {slots} | " + " | ".join(cells) + " |")


@contextmanager
def throttled(directory: Path, mb_per_s: float | None) -> Iterator[None]:
    """Run the block with ``directory``'s disk limited to ``mb_per_s`` each way (cgroup v1 blkio throttle)."""
    if mb_per_s is None:
        yield
        return
    root = Path("/sys/fs/cgroup/blkio")
    if not (root / "blkio.throttle.read_bps_device").exists() or os.geteuid() != 0:
        raise SystemExit("--throttle needs root and a cgroup v1 blkio hierarchy at /sys/fs/cgroup/blkio")
    dev = os.stat(directory).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (block / "partition").exists():  # throttles apply to whole disks
        block = block.resolve().parent
    disk = (block / "dev").read_text().strip()
    group = root / f"poet-bench-{os.getpid()}"
    group.mkdir()
    try:
        rate = int(mb_per_s * MB)
        (group / "blkio.throttle.read_bps_device").write_text(f"{disk} {rate}")
        (group / "blkio.throttle.write_bps_device").write_text(f"{disk} {rate}")
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield
        finally:
            (root / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        group.rmdir()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swap-dir", type=Path, default=None, help="default: a temporary directory in /var/tmp")
    parser.add_argument("--sizes", default="1,2,4,8,16,32", help="page sizes in MiB, comma separated")
    parser.add_argument("--slots", default="1,4", help="storages per page, comma separated")
    parser.add_argument("--repeats", type=int, default=7, help="round trips per page size (the median is kept)")
    parser.add_argument("--throttle", type=float, default=None, metavar="MBPS",
                        help="limit the swap disk to MBPS each way for the whole run (root, cgroup v1 blkio)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with (nullcontext(args.swap_dir) if args.swap_dir else tempfile.TemporaryDirectory(dir="/var/tmp")) as swap:
        swap = Path(swap)
        swap.mkdir(parents=True, exist_ok=True)
        with throttled(swap, args.throttle):
            result = run(swap, [int(s) for s in args.sizes.split(",")], [int(s) for s in args.slots.split(",")],
                         args.repeats)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
