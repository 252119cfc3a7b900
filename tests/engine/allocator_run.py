"""Train a model under a whole-step schedule in a process of its own, for the allocator's tests; prints JSON.

``python -m tests.engine.allocator_run --model M --schedule S --steps N --swap DIR``: the model's weights and
batches are seeded, the step runs through :class:`engine.training.Training` with its memory check on (a step
over budget plus tolerance ends the run with exit code 3), and the output holds a hash of the parameters,
buffers and optimizer state after the steps, the largest step memory the check saw, the budget, and the
allocator's figures over the steps and its limit (``null`` where it is off: ``POET_EDGE_ALLOCATOR=off``),
and what the plan counts for small parameters' gradients and state (malloc's, not the allocator's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict
from typing import Callable

import torch


def _models() -> dict[str, tuple[Callable, Callable, Callable]]:
    from agent.zoo import logits_cross_entropy
    from tests.engine.models import TinyUNet, bert_classifier, bert_example, cross_entropy, unet_example

    def resnet18() -> torch.nn.Module:
        import torchvision

        return torchvision.models.resnet18(num_classes=10)

    def swin() -> torch.nn.Module:  # windowed attention: shifted windows, relative position bias
        import torchvision

        return torchvision.models.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                                  window_size=[4, 4], num_classes=10)

    def images(batch: int, side: int) -> Callable:
        return lambda: (torch.rand(batch, 3, side, side), torch.randint(0, 10, (batch,)))

    return {
        "unet": (TinyUNet, lambda: unet_example(batch=4, size=32), cross_entropy),
        "bert": (lambda: bert_classifier(layers=2, hidden=128), lambda: bert_example(batch=4, length=64),
                 logits_cross_entropy),
        "swin": (swin, images(4, 32), cross_entropy),
        "resnet18": (resnet18, images(16, 64), cross_entropy),
    }


def _digest(training) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(training.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    for index, state in sorted(training.fused.state_dict()["state"].items()):
        for key, value in sorted(state.items()):
            digest.update(f"{index}.{key}".encode())
            digest.update(value.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                          if isinstance(value, torch.Tensor) else repr(value).encode())
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    from engine import allocator
    from engine.errors import MemoryBoundError
    from engine.executor import planned_in_heap
    from engine.extract import extract
    from engine.training import DEFAULT_TOLERANCE_BYTES, OptimizerSettings, Training
    from engine.workload import Workload
    from tests.engine.models import page_everything, recompute_everything, whole_step_schedule

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="unet")
    parser.add_argument("--schedule", choices=("recompute", "page"), default="recompute")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--swap", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model_fn, example_fn, loss_fn = _models()[args.model]
    torch.manual_seed(0)
    model = model_fn().train()
    graph, segments = extract(model, example_fn(), loss_fn, repeats=1, refine=False)
    settings = OptimizerSettings("sgd", learning_rate=0.05, momentum=0.9)
    policy = {"recompute": recompute_everything, "page": page_everything}[args.schedule]
    schedule = whole_step_schedule(graph, policy(graph), settings.spec(chunk_bytes=1 << 20),
                                   on_flash=args.schedule == "page")
    training = Training(Workload(args.model, model, *example_fn(), loss_fn), graph, segments, schedule, settings,
                        args.swap)
    held = allocator.installed()
    before = None
    if held is not None:  # the figures are the steps' own: extraction timed its nodes from the cache too
        held.reset_peak()
        before = held.stats()
    torch.manual_seed(1)
    batches = [example_fn() for _ in range(4)]  # the same few batches in turn: no data cost in the step
    peak, code = 0, 0
    try:
        for step in range(args.steps):
            report = training.step([batches[step % len(batches)]])
            peak = max(peak, report.memory_bytes or 0)
    except MemoryBoundError as exc:
        print(exc, file=sys.stderr)
        peak, code = max(peak, exc.report.memory_bytes or 0), 3
    steps = None
    if held is not None and before is not None:
        steps = asdict(held.stats())
        for count in ("hits", "misses", "released_bytes"):
            steps[count] -= getattr(before, count)
    small = sum(p.nbytes for p in model.parameters() if p.requires_grad and p.nbytes < allocator.LARGE_BYTES)
    print(json.dumps({"digest": _digest(training), "peak_bytes": peak, "budget_bytes": schedule.memory_budget,
                      "tolerance_bytes": DEFAULT_TOLERANCE_BYTES, "allocator": steps,
                      "limit_bytes": held.limit_bytes if held is not None else None,
                      "live_at_start": before.live_bytes if before is not None else None,
                      "runtime_bytes": graph.runtime_bytes, "heap_bytes": planned_in_heap(graph, schedule),
                      "small_parameter_bytes": small}))
    training.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
