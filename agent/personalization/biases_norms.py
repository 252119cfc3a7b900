"""``biases-norms``: FedAvg, then only the biases and the normalization layers fine-tuned (BitFit, Ben Zaken et
al., 2022, with the norms); simulations only.

Parameter-efficient: the fine-tuning plan comes from a graph extracted with everything else frozen, so it holds
no gradients or optimizer state for the frozen weights.
"""

from __future__ import annotations

import torch.nn as nn

from agent.personalization.base import Strategy, register

NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


@register
class BiasesNorms(Strategy):
    """Fine-tunes every bias and the affine parameters of the normalization layers; see the module docstring."""

    name = "biases-norms"
    simulation_only = True
    partial_tuning = True

    def freeze(self, model: nn.Module) -> nn.Module:
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                param.requires_grad_(isinstance(module, NORMS) or name == "bias")
        return model
