"""``fedbn``: each device keeps its own BatchNorm layers (Li et al., ICLR 2021, "FedBN"), statistics and affine
parameters; everything else is federated."""

from __future__ import annotations

import torch.nn as nn

from agent.personalization.base import Strategy, register


@register
class FedBN(Strategy):
    """Every BatchNorm layer's state (running statistics, affine parameters, batch count) is personal."""

    name = "fedbn"

    def personal_keys(self, model: nn.Module) -> frozenset[str]:
        keys: set[str] = set()
        for name, module in model.named_modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                keys |= {f"{name}.{k}" for k in module.state_dict()}
        return frozenset(keys)
