"""What one training step needs: a model in training mode, one batch and its loss (:class:`Workload`), and the
losses the zoo's models train with.  The engine's extraction, profiling and training take a workload; the
device's model zoo (:mod:`agent.zoo`) and a user's own factory build one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True)
class Workload:
    """A model in training mode with one batch and its loss: what one training step needs.

    Attributes
    ----------
    name:
        Zoo name or ``package.module:factory``.
    model:
        The model, in ``train()`` mode.
    inputs:
        A tensor, or a tuple of positional arguments for ``model``.
    targets:
        What ``loss_fn`` compares the output with.
    loss_fn:
        ``loss_fn(model(*inputs), targets)`` is the scalar loss.  A loss that uses the model's parameters
        itself (:class:`engine.chunked_loss.ChunkedNextTokenLoss`) has ``for_model(copy)``, the same loss for a
        copy of the model.
    segments:
        Qualified module names extraction cuts at, or ``None`` for its default rule.
    """

    name: str
    model: nn.Module
    inputs: Any
    targets: Any
    loss_fn: LossFn
    segments: tuple[str, ...] | None = None

    @property
    def example(self) -> tuple[Any, Any]:
        """``(inputs, targets)``, as :func:`engine.extract.extract` and ``Executor.step`` take them."""
        return self.inputs, self.targets


def cross_entropy(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Classification loss on logits (per sample or per pixel)."""
    return F.cross_entropy(output, targets)


def logits_cross_entropy(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on a transformers model output (its ``.logits``)."""
    return F.cross_entropy(output.logits, targets)


def mse(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Regression loss for outputs that are not class scores."""
    return F.mse_loss(output, targets)


def next_token_cross_entropy(output: Any, targets: torch.Tensor) -> torch.Tensor:
    """Causal-LM loss on a transformers output's ``.logits``: each position predicts the token after it."""
    logits = output.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
