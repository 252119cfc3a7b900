"""The agent's ``flower-supernode`` command line: what it tells Flower about the device and its key."""

from __future__ import annotations

from pathlib import Path

from agent.config import load_config
from agent.federated.supernode import supernode_command
from demo.devices import FakeDevice, write_config


def command(tmp_path: Path, **flower) -> list[str]:
    overrides = {f"flower_{k}": v for k, v in flower.items()}
    path = write_config(tmp_path, FakeDevice(tmp_path / "root"), tmp_path / "data.csv", "tests.engine.models:mlp",
                        "8x32", device_name="pi-hall", flower_enabled=True, flower_superlink="fleet.example:9092",
                        **overrides)
    return supernode_command(load_config(path))


def test_the_supernode_authenticates_with_the_agents_key_and_names_the_agents_config(tmp_path: Path) -> None:
    args = command(tmp_path)
    key = args[args.index("--auth-supernode-private-key") + 1]
    assert key == str((tmp_path / "state/flower/supernode.key").resolve())
    node_config = args[args.index("--node-config") + 1]
    assert node_config == f'device-name="pi-hall" agent-config="{(tmp_path / "agent.toml").resolve()}"'
    assert args[args.index("--superlink") + 1] == "fleet.example:9092"


def test_without_authentication_the_supernode_gets_no_key_and_registers_itself(tmp_path: Path) -> None:
    # Flower never self-registers a SuperNode that brings a key: a SuperLink run with --no-flower-auth
    # would refuse it unless its key was registered all the same
    assert "--auth-supernode-private-key" not in command(tmp_path, auth=False)
