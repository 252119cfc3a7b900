"""Devices' Flower SuperNode keys: registered with the SuperLink and mapped to the server's device names.

With SuperNode authentication on, the SuperLink admits only SuperNodes whose
public key was registered; the key also gives the device a node id that
stays the same across restarts.  ``poet-edge server supernode register NAME
KEY`` runs ``flwr supernode register KEY poet-edge --name NAME`` against the
running SuperLink (the ``poet-edge`` connection that :mod:`server.federated.superlink`
writes) and records ``NAME -> node id`` in ``DATA_DIR/flower/supernodes.json``,
which is how a round's node ids become device names.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from server.config import ServerSettings
from server.devices import check_device_name
from server.errors import FlowerError, SuperNodeRegistrationError
from server.federated.superlink import CONNECTION, flower_binary, flower_environment


def names_path(settings: ServerSettings) -> Path:
    """The JSON file mapping device names to their SuperNode's node id and key."""
    return settings.flower_dir / "supernodes.json"


def read_names(settings: ServerSettings) -> dict[str, dict[str, Any]]:
    """``{device name: {"node_id": int, "public_key": str, "registered_at": float}}`` (empty when none)."""
    try:
        return json.loads(names_path(settings).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise FlowerError(f"cannot read {names_path(settings)}: {exc}") from exc


def device_for_node(settings: ServerSettings, node_id: int) -> str | None:
    """The device name registered for a SuperNode's node id, or ``None``."""
    return next((name for name, entry in read_names(settings).items() if entry["node_id"] == node_id), None)


def check_public_key(path: Path) -> str:
    """The key's OpenSSH text, after checking it is an ECDSA P-384 public key (what Flower accepts)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    try:
        text = path.read_text(encoding="ascii").strip()
        key = load_ssh_public_key(text.encode())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SuperNodeRegistrationError(f"{path}: not an OpenSSH public key ({exc}); the agent writes its key "
                                         "to STATE_DIR/flower/supernode.key.pub") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise SuperNodeRegistrationError(f"{path}: Flower takes ECDSA P-384 keys (ecdsa-sha2-nistp384), make one "
                                         "with ssh-keygen -t ecdsa -b 384")
    return text


def register(settings: ServerSettings, name: str, public_key: Path) -> int:
    """Register ``public_key`` for device ``name`` with the running SuperLink; returns the node id."""
    name = check_device_name(name)
    text = check_public_key(public_key)
    home = _connected_home(settings)
    command = [str(flower_binary("flwr")), "supernode", "register", str(public_key.resolve()), CONNECTION,
               "--name", name, "--format", "json"]
    answer = _run_json(command, home)
    if not answer.get("success"):
        message = str(answer.get("error-message", answer)).split("\n")[-1]
        raise SuperNodeRegistrationError(f"the SuperLink did not register {public_key} for {name}: {message}")
    node_id = int(answer["node-id"])
    _record(settings, name, {"node_id": node_id, "public_key": text, "registered_at": time.time()})
    return node_id


def list_nodes(settings: ServerSettings) -> list[dict[str, Any]]:
    """The SuperLink's nodes (``flwr supernode list``), each with ``device``: its registered name or ``None``."""
    home = _connected_home(settings)
    answer = _run_json([str(flower_binary("flwr")), "supernode", "list", CONNECTION, "--format", "json"], home)
    if not answer.get("success"):
        raise FlowerError(f"the SuperLink did not list its nodes: {answer.get('error-message', answer)}")
    by_id = {entry["node_id"]: name for name, entry in read_names(settings).items()}
    return [{**node, "device": by_id.get(int(node["node-id"]))} for node in answer.get("nodes", [])]


def _connected_home(settings: ServerSettings) -> Path:
    """Flower's home folder holding the connection to this server's SuperLink, which ``--flower`` writes."""
    home = settings.flower_dir / "home"
    if not (home / "config.toml").is_file():
        raise FlowerError(f"no SuperLink connection in {home}: start the server with --flower first")
    return home


def _run_json(command: list[str], home: Path) -> dict[str, Any]:
    try:
        done = subprocess.run(command, env=flower_environment(home), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlowerError(f"{' '.join(command[:3])} failed: {exc}") from exc
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise FlowerError(f"{' '.join(command[:3])} exited {done.returncode}: "
                          f"{(done.stderr or done.stdout).strip()[-500:]}") from None


def _record(settings: ServerSettings, name: str, entry: dict[str, Any]) -> None:
    """Add one name to the JSON file, replaced atomically."""
    names = read_names(settings)
    names[name] = entry
    path = names_path(settings)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(names, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(scratch, path)
