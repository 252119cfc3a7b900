from __future__ import annotations

import torch.nn as nn

from agent.digits import SmallCNN
from agent.personalization import strategy


def test_every_batchnorm_entry_is_personal_and_nothing_else() -> None:
    model = SmallCNN()
    keys = strategy("fedbn").personal_keys(model)
    batchnorms = [name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(batchnorms) == 2
    assert keys == {f"{b}.{k}" for b in batchnorms
                    for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}


def test_layer_norms_are_shared() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    assert strategy("fedbn").personal_keys(model) == frozenset()
