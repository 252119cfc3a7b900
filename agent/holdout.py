"""A model's loss and accuracy on a local data set's held-out samples: what the agent's windows and a federated
round's evaluation both report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from agent.data import LocalDataset


@dataclass(frozen=True)
class Evaluation:
    """The model on the held-out data."""

    loss: float
    accuracy: float | None  # None for regression targets
    samples: int


def evaluate(model: torch.nn.Module, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
             data: LocalDataset) -> Evaluation | None:
    """``model`` in eval mode on ``data``'s held-out samples (``None`` without any); its mode is restored.

    Accuracy counts class scores per sample or per position (``logits.argmax(dim=1)``); float targets or
    one-dimensional outputs are regression, without accuracy.
    """
    if len(data.holdout_y) == 0:
        return None
    was_training = model.training
    model.eval()
    total_loss, correct, labels, count, classify = 0.0, 0, 0, 0, True
    try:
        with torch.no_grad():
            for inputs, targets in data.holdout_batches():
                output = model(*(inputs if isinstance(inputs, tuple) else (inputs,)))
                total_loss += float(loss_fn(output, targets)) * len(targets)
                logits = getattr(output, "logits", output)
                if targets.dtype.is_floating_point or logits.dim() < 2:
                    classify = False
                else:
                    correct += int((logits.argmax(dim=1) == targets).sum())
                    labels += targets.numel()
                count += len(targets)
    finally:
        model.train(was_training)
    return Evaluation(total_loss / count, correct / labels if classify and labels else None, count)
