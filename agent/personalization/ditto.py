"""``ditto``: a whole personal model trained beside the global one each round and pulled towards it (Li et al.,
ICML 2021, "Ditto"); simulations only.

Each round the device trains the global model as FedAvg does and, on the same batches, its personal model,
each step followed by a proximal pull towards the round's global model with strength ``ditto-lambda``
(:meth:`Ditto.train_personal`).  The personal model is never sent.  It is a second whole model in memory
beside every step, so the device's schedule is planned for its budget less that model.
"""

from __future__ import annotations

import torch

from agent.personalization.base import Strategy, register


@register
class Ditto(Strategy):
    """A personal model beside the global one; see the module docstring."""

    name = "ditto"
    simulation_only = True
    trains_beside = True

    @staticmethod
    def held_bytes(initial: dict[str, torch.Tensor]) -> int:
        """The memory the second model holds beside every step."""
        return sum(t.nbytes for t in initial.values())

    @staticmethod
    def train_personal(task, own: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], data, plan, *,
                       steps: int, lr: float | None, position: tuple[int, int], strength: float):
        """The personal model ``own`` trained ``steps`` steps on ``data`` under ``plan``, each step followed by a
        pull towards ``anchor`` with ``strength`` (``Task.train``'s proximal term); the outcome."""
        return task.train(own, data, plan, steps=steps, lr=lr, position=position, anchor=anchor, prox=strength)
