"""Preparing a workload on this device: its training graph and costs measured here once, then a schedule.

The first time a workload runs on a device it is profiled there (as
``poet-edge profile`` does) and the graph and device profile are cached under
``state_dir/prepared/KEY/``, KEY naming the model, input, seed, node bound and
PyTorch version.  Later starts cut the model again without timing anything
(:func:`engine.extract.segments_matching`) and check the cut still gives the
cached graph.  The schedule comes from the configured source (a signed file,
the fleet server with a local solve while it is unreachable, or a local solve)
through the verified cache of :mod:`agent.schedule_sources`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch

from agent.config import AgentConfig
from agent.schedule_sources import (FileScheduleSource, LocalSolveSource, Request, ScheduleCache, ScheduleSource,
                                  get_schedule)
from agent.errors import ZooError
from engine.errors import ScheduleRefusedError
from agent.weight_files import fingerprint as weights_fingerprint
from agent.weights import load_weights, pretrained_workload
from agent.zoo import Workload, load_workload, parse_shape
from schedules.device import DeviceProfile
from schedules.errors import FormatError
from schedules.graph import TrainingGraph
from schedules.schedule import Schedule
from schedules.step_memory import TrainingSpec

log = logging.getLogger("poet-agent")


@dataclass
class Prepared:
    """Everything a training window needs that does not change between windows."""

    key: str
    workload: Workload
    graph: TrainingGraph
    device: DeviceProfile
    segments: Any
    schedule: Schedule
    schedule_from: str
    profiled: bool
    # what the model's first run in this process (the cut's, or the profile's where this process profiled) left
    # in the process's own memory: it counts in every step (engine.training.Training's first_run_bytes), as the
    # profile reserved it
    first_run_bytes: int = 0
    # the pretrained weights the model started from (agent.weights.fingerprint), None for seeded weights
    weights_sha256: str | None = None


def workload_key(config: AgentConfig, weights_sha256: str | None = None) -> str:
    """Names the prepared workload: what changes the graph or its times changes the key, and so do the
    pretrained weights (``weights_sha256``, :func:`agent.weights.fingerprint`; hashed here when not given):
    other weights are another model, with checkpoints of its own."""
    w = config.workload
    parts = [w.model, w.input, w.seed, w.max_nodes, torch.__version__]
    if w.adapters != "none":  # another model to train: only the adapters, planned without the base's gradients
        parts.append(["adapters", w.adapters, w.lora_rank, w.lora_alpha, w.lora_dropout, list(w.lora_targets)])
    if w.weights is not None:
        parts.append(f"weights {weights_sha256 or weights_fingerprint(w.weights)}")
    if w.chunked_loss:  # added only when set: a device that does not chunk keeps its prepared workload
        parts.append("chunked loss")
    if w.compute_threads != 1:  # the profile's times are the thread count's: another count profiles again
        parts.append(f"{w.compute_threads} threads")
    text = json.dumps(parts)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_workload(config: AgentConfig) -> Workload:
    """The model at its initial weights: ``workload.weights`` where configured, else seeded (every process
    builds the same either way); wrapped in LoRA adapters where ``workload.adapters`` says so (their initial
    weights seeded too)."""
    workload = _base_workload(config)
    if config.workload.adapters == "lora":
        from agent.adapters import LoraSettings, with_adapters

        torch.manual_seed(config.workload.seed + 1)  # the adapters' initial weights, the same in every process
        workload = with_adapters(workload, LoraSettings.from_config(config.workload))
    return workload


def _base_workload(config: AgentConfig) -> Workload:
    w = config.workload
    shape = parse_shape(w.input) if w.input else None
    if w.weights is not None and not w.model:  # the model is the save_pretrained folder's own
        torch.manual_seed(w.seed)
        workload = pretrained_workload(w.weights, shape)
        if w.chunked_loss:
            from engine.chunked_loss import chunk_loss

            try:
                workload = chunk_loss(workload)
            except ValueError as exc:
                raise ZooError(f"chunked loss for {workload.name}: {exc}") from exc
        return workload
    workload = load_workload(w.model, shape, seed=w.seed, chunked_loss=w.chunked_loss)
    if w.weights is not None:
        load_weights(workload.model, w.weights)
    return workload


def training_spec(config: AgentConfig) -> TrainingSpec:
    """What the schedule is planned for: the configured optimizer, accumulation and clipping."""
    from engine.training import OptimizerSettings

    return OptimizerSettings.from_config(config.training).spec()


def schedule_source(config: AgentConfig, say: Callable[[str], None] = log.info) -> ScheduleSource:
    """The configured source: the operator's signed file; else the fleet server, falling back to a local solve
    while it is unreachable (``say`` tells why); else a local solve."""
    if config.schedule.file is not None:
        return FileScheduleSource(config.schedule.file, config.schedule.public_key)
    local = LocalSolveSource(config.schedule.solve_time_limit)
    if config.server.url:
        from agent.fleet import FallbackSource, ServerScheduleSource

        return FallbackSource([ServerScheduleSource.from_config(config), local], say=say)
    return local


def trusted_key(config: AgentConfig) -> Path | None:
    """The key the schedule cache trusts beside the agent's own: the key of whoever signs this device's
    schedules (the operator's for a schedule file, else the fleet server's)."""
    if config.schedule.file is None and config.server.url:
        return config.server.public_key
    return config.schedule.public_key


def prepare(config: AgentConfig, say: Callable[[str], None] = log.info,
            source: ScheduleSource | None = None) -> Prepared:
    """Profile (once per workload and device), then get and verify the schedule for the configured budget."""
    weights_sha256 = weights_fingerprint(config.workload.weights) if config.workload.weights is not None else None
    key = workload_key(config, weights_sha256)
    directory = config.device.state_dir / "prepared" / key
    graph_path, device_path = directory / "graph.json", directory / "device.json"
    graph = device = None
    if graph_path.is_file() and device_path.is_file():
        try:
            graph, device = TrainingGraph.load(graph_path), DeviceProfile.load(device_path)
        except FormatError as exc:
            say(f"cached profile unreadable, profiling again: {exc}")
            graph = device = None
    workload = build_workload(config)
    segments, first_run_bytes = None, 0
    if graph is not None:
        try:
            segments, first_run_bytes = _cut(config, workload, graph)
        except ScheduleRefusedError as exc:
            say(f"cached profile no longer matches the model, profiling again: {exc}")
            graph = None
    if graph is not None and (not graph.parameters or any(p.streamed and not p.block_bytes
                                                          for p in graph.parameters)):
        say("cached profile lacks its parameter layout or streamed column blocks (an earlier release made it), "
            "profiling again")
        graph = None
    profiled = graph is None
    if profiled:
        say(f"profiling {workload.name} on this device (first run of this workload)")
        graph, device, residue = _profile(config, workload, directory)
        workload = build_workload(config)  # profiling ran steps: start again from the initial weights
        segments, first_run_bytes = _cut(config, workload, graph)
        # the profile ran the model first: what that left (kernels, the libraries' caches and pools) is already
        # in this process when the cut reads its baseline, so the cut sees little of it, yet a fresh worker's cut
        # sees all of it.  Count it here too, or this window's steps measure less than the next window's.
        first_run_bytes = max(first_run_bytes, residue)
    spec = training_spec(config)
    if not profiled and spec.update_kind not in device.update_costs:  # another optimizer than profiled
        say(f"timing the update of {config.training.optimizer} on this device (the profile has not timed it)")
        device = _with_update_cost(config, device, graph, device_path)
    request = Request(graph, device, config.training.memory_budget, spec, config.training.runtime_budget)
    chosen = source or schedule_source(config, say)
    say(f"getting a schedule for a step in {config.training.memory_budget:,} B from {chosen.description}")
    schedule, origin = get_schedule(chosen, ScheduleCache(directory, trusted_key(config)), request)
    return Prepared(key, workload, graph, device, segments, schedule, origin, profiled, first_run_bytes,
                    weights_sha256)


def _cut(config: AgentConfig, workload: Workload, graph: TrainingGraph) -> tuple[Any, int]:
    """The model cut as ``graph`` was, and what that first run left in the process's own memory
    (:func:`engine.rss.anonymous_growth_since`), the optimizer's code loaded before (the first optimizer of a
    process imports PyTorch's compiler machinery, as plain training's does)."""
    from engine import allocator, rss
    from engine.extract import segments_matching
    from engine.optim.rules import warm_up
    from engine.training import OptimizerSettings

    # its updates' kernels too: their code, faulted in by a step, would count in a fresh process's steps alone
    warm_up(OptimizerSettings.from_config(config.training).build([torch.zeros(1 << 16, requires_grad=True)]))
    allocator.release_cache()  # blocks cached before would serve what the first run keeps, unseen
    loaded = rss.settled_anonymous()
    segments = segments_matching(workload, graph, config.workload.max_nodes)
    return segments, rss.anonymous_growth_since(loaded)


@contextmanager
def _training_threads(config: AgentConfig) -> Iterator[None]:
    """Inside, torch computes with the thread count the windows train with; after, with what it had."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.workload.compute_threads)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _with_update_cost(config: AgentConfig, device: DeviceProfile, graph: TrainingGraph, path: Path) -> DeviceProfile:
    """``device`` with the configured optimizer's update timed at the windows' thread count, saved to ``path``."""
    from engine.profile import measure_updates
    from engine.training import OptimizerSettings

    with _training_threads(config):
        measured = measure_updates([OptimizerSettings.from_config(config.training)], graph.parameter_bytes)
    device = replace(device, update_costs={**device.update_costs, **measured})
    device.save(path)
    return device


def _profile(config: AgentConfig, workload: Workload, directory: Path) -> tuple[TrainingGraph, DeviceProfile, int]:
    """Profile ``workload`` on this device and save its graph and device profile in ``directory``; also what the
    model's first run left in the process's own memory (the profile's residue, which its plans reserve)."""
    from engine.profile import profile_workload
    from engine.training import OptimizerSettings

    config.swap_dir.mkdir(parents=True, exist_ok=True)
    with _training_threads(config):  # node times at the count the windows train with
        profile, _ = profile_workload(workload.model, workload.example, workload.loss_fn, config.swap_dir,
                                      name=workload.name, repeats=config.workload.profile_repeats,
                                      max_nodes=config.workload.max_nodes, segments=workload.segments,
                                      meter_config=config.energy,
                                      training=OptimizerSettings.from_config(config.training))
    directory.mkdir(parents=True, exist_ok=True)
    profile.graph.save(directory / "graph.json")
    profile.device.save(directory / "device.json")
    return profile.graph, profile.device, int(profile.compute["residue_bytes"])
