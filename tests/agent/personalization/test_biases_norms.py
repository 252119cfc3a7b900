from __future__ import annotations

import torch.nn as nn

from agent.digits import SmallCNN
from agent.personalization import strategy


def test_only_biases_and_norm_parameters_stay_trainable() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), nn.Conv2d(2, 2, 3, bias=False),
                          nn.LayerNorm(4, bias=False), nn.Linear(4, 4))
    strategy("biases-norms").freeze(model)
    trainable = {k for k, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"0.bias", "1.weight", "1.bias", "3.weight", "4.bias"}


def test_it_tunes_part_of_the_model_and_keeps_nothing_personal() -> None:
    chosen = strategy("biases-norms")
    assert chosen.partial_tuning and chosen.simulation_only
    assert chosen.personal_keys(SmallCNN()) == frozenset()
