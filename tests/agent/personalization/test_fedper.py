from __future__ import annotations

import torch.nn as nn

from agent.digits import SmallCNN
from agent.personalization import strategy


def test_the_head_is_personal() -> None:
    assert strategy("fedper").personal_keys(SmallCNN()) == {"head.weight", "head.bias"}


def test_the_head_is_the_last_module_with_parameters_even_when_a_parameterless_one_follows() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2), nn.Softmax(dim=-1))
    assert strategy("fedper").personal_keys(model) == {"1.weight", "1.bias"}
