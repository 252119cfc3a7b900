"""The registry: every run-config name has its strategy, with the flags the server knows without torch."""

from __future__ import annotations

import pytest

from agent.errors import FederationError
from agent.personalization import STRATEGIES, strategy
from agent.personalization.base import Strategy, register
from common.runconfig import PERSONALIZATIONS, SIMULATION_ONLY


def test_the_registry_holds_exactly_the_run_configs_names() -> None:
    assert set(STRATEGIES) == set(PERSONALIZATIONS)


def test_the_server_and_the_registry_agree_on_what_runs_in_simulations_only() -> None:
    assert {name for name, cls in STRATEGIES.items() if cls.simulation_only} == set(SIMULATION_ONLY)


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(FederationError, match="'fedprox' unknown; use one of .*fedper"):
        strategy("fedprox")


def test_a_name_registered_twice_is_refused() -> None:
    class Again(Strategy):
        name = "fedper"

    with pytest.raises(ValueError, match="twice"):
        register(Again)
    assert STRATEGIES["fedper"] is not Again


@pytest.mark.parametrize("name", ["none", "finetune", "fedper", "fedbn", "ditto"])
def test_only_partial_tuning_strategies_freeze(name) -> None:
    from agent.digits import SmallCNN

    with pytest.raises(FederationError, match="fine-tunes the whole model; partial tuning: biases-norms"):
        strategy(name).freeze(SmallCNN())
