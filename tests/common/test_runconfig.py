"""The fleet's typed run configuration against the app bundle that declares it, and its checks."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from common.errors import RunConfigError
from common.runconfig import RunConfig

APP = Path(__file__).parents[2] / "server" / "federated" / "flwr_app" / "pyproject.toml"


def test_the_app_bundle_declares_exactly_the_typed_keys_with_their_defaults() -> None:
    declared = tomllib.loads(APP.read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == RunConfig.defaults()  # flwr run overrides only declared keys: none missing, none stale
    assert all(type(declared[k]) is type(v) for k, v in RunConfig.defaults().items())


def test_a_run_config_reads_back_what_it_writes_and_takes_flowers_text_overrides() -> None:
    config = RunConfig(num_server_rounds=7, fraction_train=0.25, personalization="fedbn", local_baseline=True,
                       availability="night", dropout=0.1)
    assert RunConfig.from_mapping(config.to_mapping()) == config
    text = RunConfig.from_mapping({"num-server-rounds": "3", "local-baseline": "true", "lr": 1})
    assert (text.num_server_rounds, text.local_baseline, text.lr) == (3, True, 1.0)


def test_every_problem_of_a_run_config_is_named_at_once() -> None:
    with pytest.raises(RunConfigError) as caught:
        RunConfig.from_mapping({"num-server-round": 3, "fraction-train": "half", "local-baseline": "yes",
                                "local-steps": 2.5})
    text = str(caught.value)
    assert "unknown key 'num-server-round'" in text and "fraction-train must be a number" in text
    assert "local-baseline must be true or false" in text and "local-steps must be a whole number" in text
    with pytest.raises(RunConfigError) as caught:
        RunConfig.from_mapping({"num-server-rounds": -1, "fraction-train": 2.0, "personalization": "x",
                                "initial-version": "newest", "availability": "weekends", "dropout": 1.0,
                                "quantity-skew": 0.5})
    text = str(caught.value)
    for key in ("num-server-rounds", "fraction-train", "personalization", "availability", "dropout",
                "quantity-skew needs samples"):
        assert key in text, key
    assert "initial-version must be latest, none or a version number" in text
    with pytest.raises(RunConfigError) as caught:
        RunConfig.from_mapping({"viewpoint-centre": 200.0})
    assert "viewpoint-centre must be in [-180, 180] degrees" in str(caught.value)
    assert "has no centre" in str(caught.value)  # the default viewpoints, 360, are all the way round
    RunConfig.from_mapping({"viewpoint-centre": 90.0, "viewpoints": 30.0}).check()


def test_a_whole_number_stands_for_text_where_flower_parses_an_override_as_one() -> None:
    assert RunConfig.from_mapping({"initial-version": 3}).initial_version == "3"  # flwr run -c initial-version=3
    with pytest.raises(RunConfigError, match="personalization must be text"):
        RunConfig.from_mapping({"personalization": 1.5})
