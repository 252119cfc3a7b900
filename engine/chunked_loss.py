"""Opt-in chunked next-token loss: a language model's logits are never all in memory.

With a large vocabulary the logits set a decoder's activation floor: plain
cross-entropy's backward holds the logits, their softmax and their gradient,
three ``tokens x vocabulary`` tensors (134 MB each for 8x128 tokens over 32,768
ids), more than the whole rest of the model.  :func:`chunk_loss` moves the
output projection into the loss: the model hands its last hidden states over
(its head becomes a :class:`DeferredHead`, same weight, same state-dict key),
and :class:`ChunkedCrossEntropy` computes ``cross_entropy(hidden @ weight.T,
targets)`` a few tokens at a time, in forward and again in backward, so one
chunk's logits are the most it holds.

**Not bit-identical to plain cross-entropy.**  It is the same mathematics, but
the mean is summed chunk by chunk and each chunk's matrix product may round
differently, so the loss and gradients differ from the unchunked loss in their
last bits.  A chunked workload says so in its name (``gpt2 (chunked loss)``),
which every graph, schedule, report and checkpoint provenance carries.  The
executor is still bit-identical to plain autograd *on the chunked loss*: that is
what ``poet-edge validate`` checks.

The cost: each chunk's logits are computed twice (forward and backward), one
more ``tokens x hidden x vocabulary`` matrix product per step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.workload import Workload, next_token_cross_entropy

CHUNK_LOGITS_BYTES = 8 << 20
"""Bytes of float32 logits one chunk may hold: its token count is this over the vocabulary's four bytes a row."""

IGNORE_INDEX = -100
"""Targets with this id count for nothing, as in ``F.cross_entropy``."""

CHUNKED_LABEL = " (chunked loss)"
"""Appended to a chunked workload's name: the label that travels with its graphs and schedules."""


def _loss_dtype(hidden: torch.Tensor) -> torch.dtype:
    """Logits are reduced in at least float32 (half and bfloat16 hidden states are upcast, float64 kept)."""
    return torch.promote_types(hidden.dtype, torch.float32)


class ChunkedCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(hidden @ weight.T, targets)`` (mean over the targets not ignored), chunk by chunk.

    Saves only ``hidden``, ``weight`` and ``targets``; backward computes each chunk's logits again, turns them
    into the chunk's softmax minus its one-hot targets, and adds the chunk's share into the gradients of
    ``hidden`` and ``weight``.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk: int) -> torch.Tensor:
        count = (targets != IGNORE_INDEX).sum()
        total = torch.zeros((), dtype=_loss_dtype(hidden), device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            logits = (hidden[start:start + chunk] @ weight.t()).to(_loss_dtype(hidden))
            total += F.cross_entropy(logits, targets[start:start + chunk], reduction="sum",
                                     ignore_index=IGNORE_INDEX)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk = chunk
        ctx.count = count
        return (total / count).to(hidden.dtype)

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets = ctx.saved_tensors
        scale = grad_loss.to(_loss_dtype(hidden)) / ctx.count.clamp(min=1)  # all ignored: zero gradients
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = hidden[start:start + ctx.chunk]
            wanted = targets[start:start + ctx.chunk]
            grad_logits = torch.softmax((rows @ weight.t()).to(_loss_dtype(hidden)), dim=-1)
            kept = wanted != IGNORE_INDEX
            picked = torch.arange(len(wanted), device=wanted.device)[kept]
            grad_logits[picked, wanted[kept]] -= 1.0
            grad_logits[~kept] = 0.0
            grad_logits = (grad_logits * scale).to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[start:start + ctx.chunk])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), rows)
        return grad_hidden, grad_weight, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_bytes: int = CHUNK_LOGITS_BYTES) -> torch.Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T`` against ``targets``, never holding more than
    ``chunk_bytes`` of float32 logits.

    ``hidden`` is ``(..., H)``, ``weight`` ``(V, H)``, ``targets`` the leading shape of ``hidden`` (ids, or
    :data:`IGNORE_INDEX`).  Not bit-identical to ``F.cross_entropy`` on the whole logits (see the module
    docstring).
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not match hidden states of shape "
                         f"{tuple(hidden.shape)} (expected {tuple(hidden.shape[:-1])})")
    chunk = max(1, chunk_bytes // (4 * weight.shape[0]))
    return ChunkedCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), chunk)


class DeferredHead(nn.Module):
    """A language model's output projection whose product, in training, the loss makes.

    Holds the head's ``weight`` (the same parameter, so tied embeddings stay tied and the state dict keeps its
    key).  In training mode it hands the hidden states on and :class:`ChunkedNextTokenLoss` multiplies by the
    weight; in eval mode (held-out evaluation, inference, export) it is the projection, and the model's
    ``logits`` are logits again.
    """

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden if self.training else F.linear(hidden, self.weight)


class ChunkedNextTokenLoss:
    """The loss of a chunked workload: ``output.logits`` are the last hidden states (the head is deferred)."""

    parity_note = " on the chunked loss, which is not bit-identical to plain cross-entropy"
    """What a parity check of a step on this loss is of (:class:`engine.parity.ParityReport`)."""

    def __init__(self, head: DeferredHead, chunk_bytes: int = CHUNK_LOGITS_BYTES) -> None:
        self.head = head
        self.chunk_bytes = chunk_bytes

    @classmethod
    def of(cls, model: nn.Module, chunk_bytes: int = CHUNK_LOGITS_BYTES) -> "ChunkedNextTokenLoss":
        """The loss for ``model``, whose head :func:`defer_head` deferred (a copy of a model needs its own)."""
        head = model.get_output_embeddings()
        if not isinstance(head, DeferredHead):
            raise ValueError(f"{type(model).__name__}'s output embedding is not deferred: call defer_head first")
        return cls(head, chunk_bytes)

    def for_model(self, model: nn.Module) -> "ChunkedNextTokenLoss":
        """The same loss for ``model`` (a copy of this loss's model): a bound loss offers this to the parity
        check, which trains a copy beside the executor."""
        return type(self).of(model, self.chunk_bytes)

    def __call__(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        if not self.head.training:  # eval mode: the head made the logits
            return next_token_cross_entropy(output, targets)
        return chunked_cross_entropy(output.logits, self.head.weight, targets, self.chunk_bytes)


def defer_head(model: nn.Module) -> nn.Module:
    """Replace ``model``'s output embedding (``get_output_embeddings()``, a bias-free ``nn.Linear``) by a
    :class:`DeferredHead` holding the same weight; returns ``model``.

    Raises
    ------
    ValueError
        The model has no bias-free linear output embedding to defer.
    """
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(f"{type(model).__name__} has no bias-free linear output embedding "
                         "(get_output_embeddings()) to chunk the loss over: the chunked loss takes a transformers "
                         "causal language model")
    model.set_output_embeddings(DeferredHead(head.weight))
    return model


CHUNKABLE_MODELS = frozenset({"GPT2LMHeadModel", "LlamaForCausalLM"})
"""transformers causal LMs whose logits are their head's product as it is: others scale or cap them after the
head (Cohere, Granite, Gemma 2), which a deferred head would apply to the hidden states instead."""


def chunk_loss(workload: Workload, chunk_bytes: int = CHUNK_LOGITS_BYTES) -> Workload:
    """``workload`` (an :class:`engine.workload.Workload` of a causal language model) with its head deferred
    (:func:`defer_head`), its loss :class:`ChunkedNextTokenLoss` and :data:`CHUNKED_LABEL` added to its name.

    Raises
    ------
    ValueError
        The workload's loss is not the zoo's next-token loss (targets shifted already, logits straight from
        the head), or its model is not one of :data:`CHUNKABLE_MODELS`.
    """
    kind = type(workload.model).__name__
    if workload.loss_fn is not next_token_cross_entropy or kind not in CHUNKABLE_MODELS:
        raise ValueError(f"{kind} with its loss cannot be chunked: the chunked loss replaces the zoo's next-token "
                         f"loss (engine.workload.next_token_cross_entropy) on {', '.join(sorted(CHUNKABLE_MODELS))}, "
                         "whose logits are their head's product as it is")
    defer_head(workload.model)
    return replace(workload, name=workload.name + CHUNKED_LABEL,
                   loss_fn=ChunkedNextTokenLoss.of(workload.model, chunk_bytes))
