"""A model's loss and accuracy on a local data set's held-out samples: what the agent's windows and a federated
round's evaluation both report."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from agent.data import LocalDataset
from common.keep_best import interleaved_halves


@dataclass(frozen=True)
class Evaluation:
    """The model on the held-out data."""

    loss: float
    accuracy: float | None  # a share of samples, pixels or tokens; None for regression targets
    samples: int


def evaluate(model: torch.nn.Module, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
             data: LocalDataset) -> Evaluation | None:
    """``model`` in eval mode on ``data``'s held-out samples (``None`` without any); its mode is restored.

    Accuracy is the share of targets that the highest class score names: per sample (``(B, C)`` scores),
    per pixel (``(B, C, H, W)``) or per token (a language model's ``(B, L, V)``, each position's next token).
    Float targets (regression), or outputs with no class axis for the targets, get no accuracy.
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
                axis = _class_axis(logits, targets, classes_last=logits is not output)
                if axis is None:
                    classify = False
                else:
                    correct += int((logits.argmax(dim=axis) == targets).sum())
                    labels += targets.numel()
                count += len(targets)
    finally:
        model.train(was_training)
    return Evaluation(total_loss / count, correct / labels if classify and labels else None, count)


def _class_axis(logits: Any, targets: torch.Tensor, classes_last: bool) -> int | None:
    """The axis of ``logits`` that holds class scores for ``targets``, or ``None`` where there is none.

    It is the axis whose removal leaves the targets' shape: 1 in torch's layout (``(B, C)``, ``(B, C, H, W)``
    per pixel, as ``F.cross_entropy`` takes them), the last in Hugging Face's (``(B, L, V)`` per token).  Where
    both fit (a sequence as long as the vocabulary), the output's kind decides: a transformers output
    (``classes_last``, its ``.logits``) keeps Hugging Face's layout, a bare tensor torch's.
    """
    if (not isinstance(logits, torch.Tensor) or targets.dtype.is_floating_point
            or logits.dim() != targets.dim() + 1 or logits.dim() < 2):
        return None
    shape = tuple(logits.shape)
    fits = [axis for axis in (1, logits.dim() - 1) if shape[:axis] + shape[axis + 1:] == tuple(targets.shape)]
    if not fits:
        return None
    return fits[-1] if classes_last else fits[0]


def holdout_halves(data: LocalDataset) -> tuple[LocalDataset, LocalDataset]:
    """``data`` twice, holding out its selection and its test half (:func:`common.keep_best.interleaved_halves`):
    a device chooses the model it keeps on one and reports every candidate on the other."""
    selection, test = interleaved_halves(len(data.holdout_y))
    return tuple(replace(data, holdout_x=data.holdout_x[list(rows)], holdout_y=data.holdout_y[list(rows)])
                 for rows in (selection, test))
