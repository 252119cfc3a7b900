from __future__ import annotations

from agent.digits import SmallCNN
from agent.personalization import strategy


def test_finetune_and_none_keep_nothing_personal_and_train_one_model() -> None:
    for name in ("finetune", "none"):
        chosen = strategy(name)
        assert chosen.personal_keys(SmallCNN()) == frozenset()
        assert not (chosen.trains_beside or chosen.partial_tuning or chosen.simulation_only)
