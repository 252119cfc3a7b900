"""``fedper``: each device keeps its own head (Arivazhagan et al., 2019, "Federated Learning with Personalization
Layers"); the body is federated."""

from __future__ import annotations

import torch.nn as nn

from agent.personalization.base import Strategy, register


@register
class FedPer(Strategy):
    """The last module with parameters (the head) is personal: never sent, never averaged."""

    name = "fedper"

    def personal_keys(self, model: nn.Module) -> frozenset[str]:
        last = [name for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))][-1]
        return frozenset(k for k in model.state_dict() if k.startswith(f"{last}."))
