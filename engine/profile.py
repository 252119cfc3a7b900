"""The profiler: measure a model's training graph and this machine's costs, for the planner.

``poet-edge profile`` runs :func:`profile_workload`, which measures on the
machine it runs on:

* **the graph** -- :func:`engine.extract.extract` already times every node
  (one warm-up run, then the median of ``repeats`` runs through the executor's
  own runtime) and measures its bytes; those figures are used as they are,
  not measured a second time;
* **the swap path** (:func:`measure_swap_path`) -- page-out and page-in of
  pages of the sizes the graph really has, through the executor's page file
  functions (:mod:`engine.pagefile`: the CRC, ``fdatasync`` and
  ``posix_fadvise(DONTNEED)`` included, so the page cache never serves a
  read); ``seconds = latency + bytes / bandwidth`` is fitted by least
  squares to the median time of each size, per direction; then pages as
  many bytes as a step would, back to back, and where that sustained rate is
  lower (an SD card's write cache, a rate limiter's burst allowance serve
  short lone transfers faster than a step's stream) the bandwidth is the
  sustained one;
* **overlap** (:func:`measure_overlap`) -- the model's own training step and
  page transfers of about the same length on a background thread (as the
  executor's pager does), each alone and then together: the share of the
  shorter one hidden by the concurrency says whether paging overlaps compute
  (:attr:`Profile.overlap` keeps the share itself);
* **the optimizer's update** (:func:`measure_update`) -- SGD's, SGD with momentum's, AdamW's and the
  device's own optimizer's, through the engine's update rules on a scratch parameter: a cost per chunk and
  per byte (the device profile's ``update_costs``), which a whole-step plan adds to its step time;
* **power** (:func:`measure_power`) -- idle, computing and paging power from
  the best meter :func:`engine.energy.detect_meter` finds; with no meter the
  nominal powers of a named device or of a generic host, labelled estimates;
  with a real meter also each node's compute energy
  (:func:`measure_node_energy`).

Every figure carries its source (:attr:`Profile.sources`); the device
profile's ``sources`` map holds them too, so a profile file says where each
number came from.  The graph comes back priced with the measured profile, so
``poet-edge solve graph.json`` takes it directly.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from engine import allocator, pagefile, rss
from engine.pagefile import SYSTEM, SystemCalls
from engine.energy import Activity, EnergyMeter, MeterConfig, NominalPowers, detect_meter
from engine.errors import ProfileError
from schedules.budgets import floor_text
from schedules.device import DeviceProfile, price_graph
from schedules.graph import TrainingGraph

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as each part of the profile advances."""



def _quiet(stage: str, done: int, total: int) -> None:
    """The default progress callback: says nothing."""


# -- the swap path ---------------------------------------------------------------------
@dataclass(frozen=True)
class TransferSample:
    """One timed page transfer: ``direction`` is ``"out"`` or ``"in"``."""

    direction: str
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class SwapPath:
    """Measured swap-path figures, per direction, and the samples they were fitted to."""

    pageout_bandwidth_bps: float
    pagein_bandwidth_bps: float
    pageout_latency_s: float
    pagein_latency_s: float
    page_sizes: tuple[int, ...]
    samples: tuple[TransferSample, ...]
    directory: str
    sustained_out_bps: float | None = None
    """Back-to-back page-out rate over a step's volume (``None``: not measured); the bandwidth is at most this."""
    sustained_in_bps: float | None = None
    burst_bps: tuple[float, float] | None = None
    """``(out, in)`` bandwidth fitted to lone transfers, where the sustained rate replaced it."""


def graph_page_sizes(graph: TrainingGraph, max_sizes: int = 6) -> list[int]:
    """Up to ``max_sizes`` distinct node sizes spanning the graph's, smallest to largest.

    These are the pages a schedule can write; measuring at them (rather than
    one large file) catches a latency that dominates small pages.
    """
    sizes = sorted({n.bytes for n in graph.nodes if n.bytes > 0})
    if len(sizes) <= max_sizes:
        return sizes
    picks = {round(i * (len(sizes) - 1) / (max_sizes - 1)) for i in range(max_sizes)}
    return [sizes[i] for i in sorted(picks)]


def measure_swap_path(
    swap_dir: str | Path,
    page_sizes: Sequence[int],
    repeats: int = 5,
    progress: Progress = _quiet,
    sustained_bytes: int = 0,
    system: SystemCalls = SYSTEM,
) -> SwapPath:
    """Time page-outs and page-ins of each size through :mod:`engine.pagefile` in ``swap_dir``.

    Each page is reserved (``posix_fallocate``, as the executor's pager does
    before a step), written as the pager writes (O_DIRECT where the
    filesystem allows it), dropped from the page cache outside the timed part,
    and read back with its checksum verified.  With
    ``sustained_bytes`` (a step's paging volume), pages of the largest size
    adding up to it are then written back to back and read back the same way;
    where that rate is below the fitted bandwidth, it is the bandwidth.
    ``system`` makes the calls (:mod:`engine.pagefile.system`; the real ones by default).

    Raises
    ------
    ProfileError
        ``swap_dir`` cannot be created or written, or no page size is given.
    """
    sizes = [int(s) for s in page_sizes if s > 0]
    if not sizes:
        raise ProfileError("no page sizes to measure: the graph has no node with bytes")
    directory = _swap_dir(swap_dir)
    path = _page_path(directory)
    samples: list[TransferSample] = []
    sustained: tuple[float, float] | None = None
    try:
        for done, size in enumerate(sizes):
            progress("swap path", done, len(sizes))
            data = _random_storage(size)
            for _ in range(repeats):
                samples.extend(_one_round_trip(path, data, system))
        progress("swap path", len(sizes), len(sizes))
        if sustained_bytes > 0:
            sustained = _stream(directory, max(sizes), sustained_bytes, system)
    except OSError as exc:
        raise ProfileError(f"cannot page in {directory}: {exc.strerror or exc}") from exc
    finally:
        path.unlink(missing_ok=True)
    out_latency, out_bw = fit_transfer(median_per_size([s for s in samples if s.direction == "out"]))
    in_latency, in_bw = fit_transfer(median_per_size([s for s in samples if s.direction == "in"]))
    swap = SwapPath(out_bw, in_bw, out_latency, in_latency, tuple(sizes), tuple(samples), str(directory))
    if sustained is None:
        return swap
    out_stream, in_stream = sustained
    burst = (out_bw, in_bw) if out_stream < out_bw or in_stream < in_bw else None
    return replace(swap, pageout_bandwidth_bps=min(out_bw, out_stream), pagein_bandwidth_bps=min(in_bw, in_stream),
                   sustained_out_bps=out_stream, sustained_in_bps=in_stream, burst_bps=burst)


MAX_STREAM_PAGES = 64  # bounds the sustained measurement's files and time on a graph of tiny pages


def _stream(directory: Path, page_bytes: int, total_bytes: int, system: SystemCalls) -> tuple[float, float]:
    """Bytes per second writing, then reading, pages of ``page_bytes`` back to back up to ``total_bytes``."""
    count = max(1, min(MAX_STREAM_PAGES, math.ceil(total_bytes / page_bytes)))
    data = _random_storage(page_bytes)
    paths = [_page_path(directory) for _ in range(count)]
    try:
        for path in paths:
            pagefile.reserve(path, pagefile.page_size([page_bytes]), system=system)
        started = time.perf_counter()
        written = sum(pagefile.write(path, 0, [data], system=system) for path in paths)
        wrote = time.perf_counter() - started
        for path in paths:
            drop_page_cache(path)
        started = time.perf_counter()
        for path in paths:
            pagefile.read(path, 0, [page_bytes], system=system)
        read = time.perf_counter() - started
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return written / max(wrote, 1e-12), count * page_bytes / max(read, 1e-12)


def _swap_dir(swap_dir: str | Path) -> Path:
    directory = Path(swap_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfileError(f"cannot create swap directory {directory}: {exc.strerror or exc}") from exc
    if not os.access(directory, os.W_OK):
        raise ProfileError(f"swap directory {directory} is not writable by this user; pick one on the device's "
                           "flash that is")
    return directory


def _page_path(directory: Path) -> Path:
    # The pager's naming, so a profile killed mid-way leaves a file the next pager removes as stale.
    return directory / f"poet-{os.getpid()}-{uuid.uuid4().hex[:8]}-n0.page"


def measure_runtime_bytes(swap_dir: str | Path) -> int:
    """The memory the executor's machinery holds beside a step's values, gradients and optimizer state.

    Its paging thread (:func:`engine.pager.paging_thread`, which moves activation and optimizer-state pages)
    keeps a bounce buffer and disk threads once it has moved a page.  Measured as the process's RSS growth
    while a fresh thread moves the largest page that goes through the bounce buffer whole
    (:data:`engine.pagefile.page.SMALL_PAGE`) and then a page of a whole bounce buffer's size, less the pages
    read back.  Where tensors lie on block boundaries (the caching allocator's) a large page moves straight from
    and into its memory, and only the small page fills part of the bounce buffer; elsewhere the large page
    fills all of it.  A whole-step plan keeps this much of the budget free at every stage.
    """
    from engine import rss
    from engine.pagefile.page import SMALL_PAGE
    from engine.pagefile.pipeline import CHUNK, SLICES

    path = _page_path(_swap_dir(swap_dir))
    pages = [_random_storage(SMALL_PAGE - pagefile.data_offset(1)), _random_storage(SLICES * CHUNK)]
    read_bytes = sum(page.nbytes() for page in pages)
    figures: list[int | None] = []

    def round_trip() -> None:
        before = rss.start_window()
        back = []  # held to the end: what is read back is the pages' own memory, not the runtime's
        for page in pages:
            pagefile.write(path, 0, [page])
            back.append(pagefile.read(path, 0, [page.nbytes()]))
        peak = rss.peak_since_start()
        del back
        figures.append(None if before is None or peak is None else peak - before - read_bytes)

    # what an earlier transfer left cached, or free but resident in malloc's heap, would take the pages read
    # back and the bounce buffer without growing the process, and they would then go uncounted
    allocator.release_cache()
    rss.trim_heap()
    try:
        worker = threading.Thread(target=round_trip, name="poet-runtime-probe")
        worker.start()
        worker.join()
    finally:
        path.unlink(missing_ok=True)
    return max(0, figures[0] or 0) if figures else 0


def measure_executor_bytes(model: torch.nn.Module, segments: Any, graph: TrainingGraph, example: tuple[Any, Any],
                           swap_dir: str | Path, device: DeviceProfile | str | None = None, steps: int = 2) -> int:
    """The memory an executor's step holds beyond what a plan counts for it: the executor's own objects in the
    heap while it runs (its instruction loop's, autograd's graph beside the values), the library code its
    first step faults in, the allocator's rounding.

    Measured as the agent measures a step -- peak RSS above the process before the executor is built, heap
    given back first -- over ``steps`` store-all steps of ``graph`` (its nodes' bytes and workspaces from
    extraction), less what the plan predicts for them (values and workspace) and the parameter gradients the
    steps allocate.  A whole-step plan keeps this much of its budget free at every stage (part of
    ``runtime_bytes``).  ``device`` prices a graph without energies (the plan needs them, not the figure).
    0 where peak RSS cannot be read (not Linux).
    """
    from engine.executor import Executor
    from schedules.plan import plan

    schedule = plan(graph, device, method="store-all").schedule
    gradients = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    allocator.release_cache()  # blocks cached before are not this executor's
    rss.trim_heap()
    before = rss.current()
    peak: int | None = None
    try:
        with Executor(model, segments, graph, schedule, swap_dir, measure_rss=False) as executor:
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                if rss.start_window() is None:
                    return 0
                executor.step(*example)
                top = rss.peak_since_start()
                peak = top if peak is None or (top is not None and top > peak) else peak
    finally:
        model.zero_grad(set_to_none=True)
        allocator.release_cache()
    if before is None or peak is None:
        return 0
    return max(0, peak - before - schedule.predicted_peak_bytes - gradients)


def _random_storage(size: int) -> torch.UntypedStorage:
    # Random bytes, not zeros: no filesystem or device may shortcut the transfer.
    return torch.randint(0, 256, (size,), dtype=torch.uint8).untyped_storage()


def _one_round_trip(path: Path, data: torch.UntypedStorage, system: SystemCalls = SYSTEM) -> list[TransferSample]:
    size = data.nbytes()
    pagefile.reserve(path, pagefile.page_size([size]), system=system)
    started = time.perf_counter()
    written = pagefile.write(path, 0, [data], system=system)
    wrote = time.perf_counter() - started
    drop_page_cache(path)
    started = time.perf_counter()
    pagefile.read(path, 0, [size], system=system)
    read = time.perf_counter() - started
    path.unlink()
    return [TransferSample("out", written, wrote), TransferSample("in", size, read)]


def drop_page_cache(path: Path) -> None:
    """Flush ``path`` to the device and drop its pages from the page cache, so a read goes to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def median_per_size(samples: Sequence[TransferSample]) -> list[TransferSample]:
    """One sample per size, its median time: a stray slow ``fdatasync`` must not tilt the fit."""
    by_size: dict[int, list[TransferSample]] = {}
    for s in samples:
        by_size.setdefault(s.nbytes, []).append(s)
    return [TransferSample(group[0].direction, size, statistics.median(s.seconds for s in group))
            for size, group in sorted(by_size.items())]


def fit_transfer(samples: Sequence[TransferSample]) -> tuple[float, float]:
    """Least-squares ``seconds = latency + bytes / bandwidth``; returns ``(latency_s, bandwidth_bps)``.

    With one distinct size, or a fit that makes no physical sense (larger
    pages not slower), the latency is 0 and the bandwidth the plain ratio of
    total bytes to total time.
    """
    xs = [float(s.nbytes) for s in samples]
    ys = [s.seconds for s in samples]
    plain = (0.0, sum(xs) / max(sum(ys), 1e-12))
    if len(set(xs)) < 2:
        return plain
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if slope <= 0:
        return plain
    intercept = my - slope * mx
    if intercept < 0:  # a negative latency is noise: refit through the origin
        return 0.0, sum(x * x for x in xs) / sum(x * y for x, y in zip(xs, ys))
    return intercept, 1.0 / slope


# -- compute, and whether paging overlaps it ------------------------------------------------
@dataclass
class ComputeLoop:
    """A matrix-multiply loop: a stand-in for training compute on the same threads.

    ``iterations`` is set by :meth:`calibrate`; ``flops`` is the work of one run.
    """

    n: int = 512
    iterations: int = 1

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(self.n, self.n, generator=gen)
        self.b = torch.randn(self.n, self.n, generator=gen)

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3 * self.iterations

    def run(self) -> float:
        """Run the loop once; returns its seconds."""
        started = time.perf_counter()
        for _ in range(self.iterations):
            torch.mm(self.a, self.b)
        return time.perf_counter() - started

    def calibrate(self, seconds: float) -> "ComputeLoop":
        """Choose ``iterations`` so one run takes about ``seconds``."""
        self.iterations = 3
        self.run()  # warm-up: thread pool, caches
        per = min(self.run() for _ in range(3)) / self.iterations
        self.iterations = max(1, round(seconds / max(per, 1e-9)))
        return self


@dataclass(frozen=True)
class Overlap:
    """Paging beside compute, measured.

    ``hidden_fraction`` is ``(compute + io - together) / min(compute, io)``:
    1 when the shorter job vanished entirely behind the longer one, 0 when
    running them together took as long as running one after the other.
    """

    compute_s: float
    io_s: float
    together_s: float
    compute_beside_io_s: float
    hidden_fraction: float
    overlaps: bool
    page_bytes: int


OVERLAP_THRESHOLD = 0.5
"""Hidden fraction from which paging counts as overlapping compute."""


def measure_overlap(
    swap_dir: str | Path,
    page_bytes: int,
    compute: ComputeLoop | StepLoop | None = None,
    pages: int | None = None,
    trials: int = 5,
    progress: Progress = _quiet,
) -> Overlap:
    """Run page transfers on a background thread beside a compute loop and compare with each alone.

    Each trial times the compute loop alone, the transfers alone and both
    together, back to back, and yields its own hidden fraction; the median
    trial is kept.  Timing the three apart in separate phases would let a
    shared machine's drift between phases pass for overlap (or its absence).

    Parameters
    ----------
    page_bytes:
        Size of each transferred page (take the graph's largest).
    compute:
        The work to run beside the transfers: best the model's own training
        step (:class:`StepLoop`), which competes for memory bandwidth as
        training does; by default a matrix multiply calibrated to last as long
        as the transfers.
    pages, trials:
        Write-and-read round trips per I/O job (by default as many as last
        about as long as ``compute``, or 6), and trials.
    """
    directory = _swap_dir(swap_dir)
    path = _page_path(directory)
    data = _random_storage(max(int(page_bytes), 4096))
    io = _IoJob(path, data, pages or 1)
    results: list[tuple[float, float, float, float, float]] = []
    try:
        if compute is None:
            io.pages = pages or 6
            compute = ComputeLoop().calibrate(io.run())
        elif pages is None:  # transfers as long as the compute: the overlap is then the most telling
            io.pages = max(2, round(compute.run() / max(io.run(), 1e-6)))
        for trial in range(trials):
            progress("overlap", trial, trials)
            compute_s, io_s = compute.run(), io.run()
            together_s, beside_s = _together(compute, io)
            hidden = (compute_s + io_s - together_s) / min(compute_s, io_s)
            results.append((min(max(hidden, 0.0), 1.0), compute_s, io_s, together_s, beside_s))
        progress("overlap", trials, trials)
    except OSError as exc:
        raise ProfileError(f"cannot page in {directory}: {exc.strerror or exc}") from exc
    finally:
        path.unlink(missing_ok=True)
    hidden, compute_s, io_s, together_s, beside_s = sorted(results)[len(results) // 2]
    return Overlap(compute_s, io_s, together_s, beside_s, hidden, hidden >= OVERLAP_THRESHOLD, data.nbytes())


class StepLoop:
    """One plain training step of the model (forward, backward), undone after each run.

    Gradients, BatchNorm statistics and the RNG are rolled back, so measuring
    leaves the model as it was.
    """

    def __init__(self, model: torch.nn.Module, example: tuple[Any, Any], loss_fn: Callable[[Any, Any], Any]) -> None:
        self.model, self.example, self.loss_fn = model, example, loss_fn

    def run(self) -> float:
        """Run one step; returns its seconds."""
        from engine.runtime import ModelState

        inputs, targets = self.example
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        state = ModelState(self.model)
        try:
            started = time.perf_counter()
            self.loss_fn(self.model(*args), targets).backward()
            return time.perf_counter() - started
        finally:
            state.rollback()


@dataclass
class _IoJob:
    """``pages`` write-then-read round trips of one page, as the pager's I/O thread does them."""

    path: Path
    data: torch.UntypedStorage
    pages: int

    def run(self) -> float:
        started = time.perf_counter()
        for _ in range(self.pages):
            _one_round_trip(self.path, self.data)
        return time.perf_counter() - started


def _together(compute: ComputeLoop, io: _IoJob) -> tuple[float, float]:
    """Wall time of compute and I/O started together, and the compute part's own time."""
    failure: list[BaseException] = []

    def background() -> None:
        try:
            io.run()
        except BaseException as exc:  # re-raised on the main thread
            failure.append(exc)

    thread = threading.Thread(target=background, name="poet-profile-io")
    started = time.perf_counter()
    thread.start()
    compute_part = compute.run()
    thread.join()
    wall = time.perf_counter() - started
    if failure:
        raise failure[0]
    return wall, compute_part


# -- power -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NominalEstimate:
    """Nominal powers for the no-meter fallback, and where they come from."""

    powers: NominalPowers
    label: str


def generic_host_estimate(threads: int | None = None) -> NominalEstimate:
    """Rough powers of a generic computer: 10 W idle, 6 W per busy compute thread, 2 W for an SSD.

    Only a placeholder when neither a meter nor a named device gives better
    figures; the label says so.
    """
    threads = threads or torch.get_num_threads()
    powers = NominalPowers(idle_w=10.0, compute_w=6.0 * threads, memory_w=2.0)
    return NominalEstimate(powers, f"estimate: generic host (10 W idle, 6 W x {threads} compute threads, "
                                   "2 W storage); pass --power-like DEVICE or attach a meter")


def device_estimate(device: DeviceProfile) -> NominalEstimate:
    """The nominal powers of a built-in or saved device profile."""
    powers = NominalPowers(idle_w=device.idle_power_w, compute_w=device.compute_power_w,
                           memory_w=device.memory_power_w)
    return NominalEstimate(powers, f"estimate: nominal powers of device profile {device.name!r}")


@dataclass(frozen=True)
class PowerFigures:
    """Idle power and what computing and paging add above it, W, each with its source."""

    idle_w: float
    compute_w: float
    memory_w: float
    sources: dict[str, str]
    meter: str
    measured: bool
    skipped: tuple[str, ...] = ()


def measure_power(
    meter: EnergyMeter,
    estimate: NominalEstimate,
    compute: ComputeLoop,
    io: Callable[[], float] | None = None,
    idle_s: float = 1.0,
    progress: Progress = _quiet,
    skipped: Sequence[str] = (),
) -> PowerFigures:
    """Idle, compute and paging power from ``meter``; the nominal figures when it is an estimate.

    Computing and paging power are returned *above idle* (the device
    profile's convention): the meter's mean power during the work minus the
    idle power, never below zero.
    """
    if meter.is_estimate:
        p = estimate.powers
        sources = {k: estimate.label for k in ("idle_power_w", "compute_power_w", "memory_power_w")}
        return PowerFigures(p.idle_w, p.compute_w, p.memory_w, sources, meter.source, False, tuple(skipped))
    meter.start()
    progress("power", 0, 3)
    idle_w = _mean_watts(meter, Activity.IDLE, lambda: time.sleep(idle_s))
    progress("power", 1, 3)
    compute_w = max(_mean_watts(meter, Activity.COMPUTE, compute.run) - idle_w, 0.0)
    progress("power", 2, 3)
    memory_w, memory_source = estimate.powers.memory_w, estimate.label
    if io is not None:
        memory_w = max(_mean_watts(meter, Activity.PAGE_OUT, io) - idle_w, 0.0)
        memory_source = f"measured: {meter.source}, paging loop minus idle"
    progress("power", 3, 3)
    sources = {"idle_power_w": f"measured: {meter.source}, {idle_s:g} s idle",
               "compute_power_w": f"measured: {meter.source}, matrix-multiply loop minus idle",
               "memory_power_w": memory_source}
    return PowerFigures(idle_w, compute_w, memory_w, sources, meter.source, True, tuple(skipped))


def _mean_watts(meter: EnergyMeter, activity: Activity, work: Callable[[], Any]) -> float:
    meter.set_activity(activity)
    try:
        with meter.measure() as m:
            work()
    finally:
        meter.set_activity(Activity.IDLE)
    return m.watts


def measure_node_energy(
    model: torch.nn.Module,
    segments: Any,
    example: tuple[Any, Any],
    meter: EnergyMeter,
    idle_w: float,
    repeats: int = 3,
) -> list[float]:
    """Each node's compute energy above idle, J: the median over ``repeats`` store-all runs.

    Runs the step through the executor's runtime, as extraction does, and
    reads the meter's counter around every node.  Only meaningful with a real
    meter; a sampled one resolves nodes no shorter than its interval.
    """
    from engine.runtime import ModelState, Runtime

    state = ModelState(model)
    runtime = Runtime(model, segments)
    samples: list[list[float]] = [[] for _ in range(segments.size)]
    meter.start()
    meter.set_activity(Activity.COMPUTE)
    try:
        for _ in range(repeats):
            runtime.start(*example)
            for node in range(segments.size):
                t0, j0 = time.perf_counter(), meter.read_joules()
                runtime.compute(node)
                joules, seconds = meter.read_joules() - j0, time.perf_counter() - t0
                samples[node].append(max(joules - idle_w * seconds, 0.0))
            runtime.finish()
            for p in model.parameters():
                p.grad = None
    finally:
        meter.set_activity(Activity.IDLE)
        state.rollback()  # gradients, BatchNorm statistics and RNG as they were
    return [statistics.median(s) for s in samples]


# -- the optimizer's update ---------------------------------------------------------------------
UPDATE_BYTES = 32 << 20  # the most of a scratch parameter an update is timed on: past the caches, as a model's are
UPDATE_CHUNKS = (64 << 10, 4 << 20)  # chunk sizes timed: their difference tells a chunk's cost from a byte's


def default_updates() -> tuple[Any, ...]:
    """The optimizers every profile times the update of: SGD, SGD with momentum, AdamW (PyTorch's defaults)."""
    from engine.training import OptimizerSettings

    return OptimizerSettings(), OptimizerSettings(momentum=0.9), OptimizerSettings("adamw")


def measure_update(settings: Any, parameter_bytes: int = UPDATE_BYTES, repeats: int = 5) -> tuple[float, float]:
    """``(seconds per chunk, seconds per byte)`` of ``settings``' update (an
    :class:`engine.training.OptimizerSettings`) through the engine's own update code
    (:mod:`engine.optim.rules`), on a scratch parameter of at most :data:`UPDATE_BYTES`: its chunks are timed
    at two sizes, and ``seconds = chunks * per_chunk + bytes * per_byte`` is solved from their medians."""
    from engine.optim.rules import rule_for

    elements = max(1 << 18, min(parameter_bytes, UPDATE_BYTES)) // 4
    generator = torch.Generator().manual_seed(0)
    param = torch.randn(elements, generator=generator)
    grad = torch.randn(elements, generator=generator) * 1e-3
    optimizer = settings.build([param])
    rule = rule_for(optimizer, optimizer.param_groups[0])
    state: dict[str, Any] = {}
    tensors = [torch.zeros_like(param) for _ in rule.state_names]

    def run(chunk_elements: int) -> float:
        rule.begin(state, param)
        started = time.perf_counter()
        for low in range(0, elements, chunk_elements):
            high = min(elements, low + chunk_elements)
            rule.update(state, param[low:high], grad[low:high], [t[low:high] for t in tensors])
        return time.perf_counter() - started

    sizes = [min(elements, chunk // 4) for chunk in UPDATE_CHUNKS]
    counts = [-(-elements // size) for size in sizes]
    with allocator.caching_everything():  # an update's temporaries come from the cache, as in a training step
        for size in sizes:
            run(size)  # warm-up: the first call of each size
        medians = [statistics.median(run(size) for _ in range(repeats)) for size in sizes]
    if counts[0] == counts[1]:
        return 0.0, medians[1] / (elements * 4)
    per_chunk = max(0.0, (medians[0] - medians[1]) / (counts[0] - counts[1]))
    per_byte = max(0.0, (medians[1] - counts[1] * per_chunk) / (elements * 4))
    return per_chunk, per_byte


def measure_updates(settings: Sequence[Any], parameter_bytes: int) -> dict[str, tuple[float, float]]:
    """:func:`measure_update` of each of ``settings``, keyed by its update kind (the device profile's
    ``update_costs``)."""
    return {s.spec().update_kind: measure_update(s, parameter_bytes) for s in settings}


# -- the whole profile -------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """What :func:`profile_workload` measured: the priced graph, the device profile and the details."""

    graph: TrainingGraph
    device: DeviceProfile
    swap: SwapPath
    overlap: Overlap
    power: PowerFigures
    compute: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict)

    def summary(self) -> list[tuple[str, str, str]]:
        """``(figure, value, source)`` rows for a report."""
        d = self.device
        rows = [
            ("nodes", f"{self.graph.size} ({self.graph.total_compute_ms:,.1f} ms per plain step)",
             self.sources["compute_ms"]),
            ("activations", f"{self.graph.forward_activation_bytes / 1e6:,.2f} MB store-all",
             self.sources["bytes"]),
            ("floor", floor_text(self.graph), "extraction's cut and one plain step's autograd operators"),
            ("page-out", f"{d.pageout_bandwidth_bps / 1e6:,.1f} MB/s + {d.pageout_latency_s * 1e3:.3f} ms",
             self.sources["pageout_bandwidth_bps"]),
            ("page-in", f"{d.pagein_bandwidth_bps / 1e6:,.1f} MB/s + {d.pagein_latency_s * 1e3:.3f} ms",
             self.sources["pagein_bandwidth_bps"]),
            ("overlap", f"{'yes' if d.paging_overlaps_compute else 'no'} "
                        f"({100 * self.overlap.hidden_fraction:.0f}% hidden)", self.sources["paging_overlaps_compute"]),
            ("idle power", f"{d.idle_power_w:.2f} W", self.sources["idle_power_w"]),
            ("compute power", f"{d.compute_power_w:.2f} W above idle", self.sources["compute_power_w"]),
            ("paging power", f"{d.memory_power_w:.2f} W above idle", self.sources["memory_power_w"]),
            ("compute speed", f"{(d.flops_per_s or 0) / 1e9:,.1f} GFLOP/s", self.sources["flops_per_s"]),
            ("optimizer update", ", ".join(f"{kind} {per_byte * 1e9:.2f} ms/MB + {per_chunk * 1e6:.0f} us/chunk"
                                           for kind, (per_chunk, per_byte) in d.update_costs.items()),
             self.sources["update_costs"]),
            ("node energy", "measured per node" if self.power.measured else "priced from the powers above",
             self.sources["compute_j"]),
        ]
        # a source repeated on the next row is said once
        return [(figure, value, "as above" if k and source == rows[k - 1][2] else source)
                for k, (figure, value, source) in enumerate(rows)]


def profile_workload(
    model: torch.nn.Module,
    example: tuple[Any, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    swap_dir: str | Path,
    *,
    name: str = "",
    repeats: int = 5,
    max_nodes: int | None = None,
    segments: Sequence[str] | None = None,
    swap_repeats: int = 5,
    meter_config: MeterConfig | None = None,
    meter: EnergyMeter | None = None,
    estimate: NominalEstimate | None = None,
    idle_s: float = 1.0,
    progress: Progress = _quiet,
    refine: bool = True,
    training: Any = None,
) -> tuple[Profile, Any]:
    """Profile one training step of ``model`` and this machine; returns the profile and the segments.

    Parameters
    ----------
    model, example, loss_fn:
        As :func:`engine.extract.extract` takes them.
    swap_dir:
        Directory on the storage the executor will page to.
    name:
        The model's name in the graph and profile (default its class name).
    repeats:
        Timed runs per node after one warm-up; the median is kept.
    max_nodes:
        Bound on the graph's size, passed to extraction.
    segments:
        Module names to cut at, passed to extraction (``Workload.segments``).
    swap_repeats:
        Round trips per page size on the swap path; the median per size is fitted.
    meter_config:
        Which energy meter to use (default: detect the best one).
    meter:
        A meter to use instead of detecting one (the caller starts and closes it).
    estimate:
        Nominal powers when no meter exists (default :func:`generic_host_estimate`).
    idle_s:
        Seconds of idle measurement with a real meter.
    progress:
        ``progress(stage, done, total)`` as the profile advances.
    refine:
        Cut finer where the floor is set (:func:`engine.extract.extract`'s ``refine``).
    training:
        The :class:`engine.training.OptimizerSettings` the device trains with: its update is timed beside
        :func:`default_updates` (the device profile's ``update_costs``).
    """
    from engine.extract import extract

    estimate = estimate or generic_host_estimate()
    progress("extract", 0, 1)
    started = time.perf_counter()
    # the first optimizer of a process imports PyTorch's compiler machinery (tens of MB, once), as plain
    # training's does: the process's, not what the model's first run leaves
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    allocator.release_cache()  # blocks cached before would serve what the first run keeps, unseen
    loaded = rss.settled_anonymous()
    graph, segments = extract(model, example, loss_fn, max_nodes, segments=segments, repeats=repeats,
                              refine=refine)
    extract_s = time.perf_counter() - started
    # what the cut and the model's first run leave in the process's own memory stays while it trains: the plan
    # keeps room for it (engine.rss.anonymous_growth_since says what is and is not counted)
    residue = rss.anonymous_growth_since(loaded)
    progress("extract", 1, 1)
    swap = measure_swap_path(swap_dir, graph_page_sizes(graph), swap_repeats, progress,
                             sustained_bytes=sum(n.bytes for n in graph.nodes if n.kind == "forward"))
    overlap = measure_overlap(swap_dir, max(graph_page_sizes(graph)), StepLoop(model, example, loss_fn),
                              progress=progress)
    compute = ComputeLoop().calibrate(0.5)
    with _chosen_meter(meter, meter_config, estimate) as (chosen, skipped):
        io = _IoJob(_page_path(_swap_dir(swap_dir)), _random_storage(max(graph_page_sizes(graph))), 4)
        try:
            power = measure_power(chosen, estimate, compute, io.run, idle_s, progress, skipped)
        finally:
            io.path.unlink(missing_ok=True)
        node_j = None
        if power.measured:
            progress("node energy", 0, 1)
            node_j = measure_node_energy(model, segments, example, chosen, power.idle_w)
            progress("node energy", 1, 1)
    flops_per_s = compute.flops / statistics.median(compute.run() for _ in range(3))
    progress("optimizer update", 0, 1)
    updates = measure_updates([*default_updates(), *([training] if training is not None else [])],
                              graph.parameter_bytes)
    progress("optimizer update", 1, 1)
    device = replace(_device(swap, overlap, power, flops_per_s, name or graph.model, repeats), update_costs=updates)
    graph = _named(graph, name)
    if node_j is not None:
        graph = graph.with_nodes(replace(n, compute_j=j) for n, j in zip(graph.nodes, node_j))
    graph = price_graph(graph, device)  # measured node energies stay; the rest priced from this profile
    executor = measure_executor_bytes(model, segments, graph, example, swap_dir, device)
    graph = replace(graph, runtime_bytes=graph.runtime_bytes + measure_runtime_bytes(swap_dir) + residue + executor)
    sources = _sources(swap, overlap, power, repeats, extract_s)
    device = replace(device, sources={k: v for k, v in sources.items() if k in _DEVICE_FIELDS})
    stats = {"extract_s": extract_s, "flops_per_s": flops_per_s, "residue_bytes": float(residue),
             "executor_bytes": float(executor)}
    return Profile(graph, device, swap, overlap, power, stats, sources), segments


@contextmanager
def _chosen_meter(meter: EnergyMeter | None, config: MeterConfig | None,
                  estimate: NominalEstimate) -> Iterator[tuple[EnergyMeter, tuple[str, ...]]]:
    """The caller's meter as it is, or the best one detected (opened and closed here)."""
    if meter is not None:
        yield meter, ()
        return
    detection = detect_meter(config, powers=estimate.powers)
    with detection.meter as detected:
        yield detected, detection.skipped


_DEVICE_FIELDS = ("compute_power_w", "idle_power_w", "memory_power_w", "pagein_bandwidth_bps",
                  "pageout_bandwidth_bps", "pagein_latency_s", "pageout_latency_s", "paging_overlaps_compute",
                  "paging_hidden_fraction", "ram_bytes", "flops_per_s", "update_costs")
"""The device profile's figures whose sources go into its ``sources`` map."""


def _named(graph: TrainingGraph, name: str) -> TrainingGraph:
    if not name:
        return graph
    return replace(graph, model=name, source=graph.source + f"; measured on {socket.gethostname()}")


def _device(swap: SwapPath, overlap: Overlap, power: PowerFigures, flops_per_s: float, model: str,
            repeats: int) -> DeviceProfile:
    host = socket.gethostname()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return DeviceProfile(
        name=f"measured-{host}",
        description=f"{host}: measured by poet-edge profile ({model}, {torch.get_num_threads()} threads, "
                    f"swap in {swap.directory})",
        compute_power_w=power.compute_w,
        idle_power_w=power.idle_w,
        memory_power_w=power.memory_w,
        pagein_bandwidth_bps=swap.pagein_bandwidth_bps,
        pageout_bandwidth_bps=swap.pageout_bandwidth_bps,
        pagein_latency_s=swap.pagein_latency_s,
        pageout_latency_s=swap.pageout_latency_s,
        paging_overlaps_compute=overlap.overlaps,
        # the unhidden rest is counted by the planner; a device whose paging does not overlap pays all of it anyway
        paging_hidden_fraction=round(overlap.hidden_fraction, 3) if overlap.overlaps else None,
        ram_bytes=_ram_bytes(),
        flops_per_s=flops_per_s if math.isfinite(flops_per_s) and flops_per_s > 0 else None,
        source=f"measured on {host} at {when} by poet-edge profile",
    )


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: a placeholder that validation accepts
        return 1 << 30


def _sources(swap: SwapPath, overlap: Overlap, power: PowerFigures, repeats: int, extract_s: float) -> dict[str, str]:
    sizes = f"{len(swap.page_sizes)} page sizes {swap.page_sizes[0] / 1e6:.3g}-{swap.page_sizes[-1] / 1e6:.3g} MB"
    rounds = len(swap.samples) // 2
    path = f"measured: engine.pagefile in {swap.directory}, {sizes}, {rounds} round trips, cache dropped, " \
           "least-squares fit"
    if swap.burst_bps is not None:
        path += (f"; bandwidth capped at the sustained rate of a step's volume back to back (lone transfers ran "
                 f"{swap.burst_bps[0] / 1e6:,.0f} / {swap.burst_bps[1] / 1e6:,.0f} MB/s out / in)")
    return {
        "compute_ms": f"measured: engine.extract, median of {repeats} runs after a warm-up "
                      f"({extract_s:.1f} s)",
        "bytes": "measured: engine.extract, storages each node owns",
        "pageout_bandwidth_bps": path, "pageout_latency_s": path,
        "pagein_bandwidth_bps": path, "pagein_latency_s": path,
        "paging_overlaps_compute": f"measured: {overlap.page_bytes / 1e6:.3g} MB pages on a background thread "
                                   f"beside the model's training step, {100 * overlap.hidden_fraction:.0f}% hidden "
                                   f"(overlap from {100 * OVERLAP_THRESHOLD:.0f}%)",
        "paging_hidden_fraction": f"measured: the same {overlap.page_bytes / 1e6:.3g} MB pages beside the training "
                                  f"step (compute + I/O - both together) / the shorter of the two",
        **power.sources,
        "ram_bytes": "measured: physical memory (sysconf)",
        "flops_per_s": "measured: 512x512 matrix-multiply loop",
        "update_costs": (f"measured: engine.optim.rules on a scratch parameter, chunks of "
                         f"{UPDATE_CHUNKS[0] >> 10} KiB and {UPDATE_CHUNKS[1] >> 20} MiB, median of 5 after a warm-up"),
        "compute_j": (f"measured: {power.meter}, per node above idle" if power.measured
                      else "compute_ms x compute_power_w, paging bytes x the swap path's time x memory_power_w"),
    }
