"""The ``[network]`` condition: the fleet's traffic only over allowed, and if asked unmetered, interfaces.

The outside world here is a fake ``/proc/net`` and ``/sys/class/net`` tree,
and, where NetworkManager is asked, a stand-in ``nmcli`` program.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from agent.config import load_config
from agent.fleet import FleetClient
from agent.application import build_daemon
from agent.errors import ConfigError, FleetUnavailableError
from agent.monitors import Eligibility, Verdict
from agent.monitors.network import NetworkMonitor
from demo.devices import FakeDevice, write_config

HEADER = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT"


def routes(root: Path, *default: tuple[str, int], other: str = "eth9") -> Path:
    """A routing table with default routes ``(interface, metric)`` and one route to a local network."""
    lines = [HEADER, f"{other}\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0"]
    lines += [f"{name}\t00000000\t0101A8C0\t0003\t0\t0\t{metric}\t00000000\t0\t0\t0" for name, metric in default]
    (root / "proc/net").mkdir(parents=True, exist_ok=True)
    (root / "proc/net/route").write_text("\n".join(lines) + "\n")
    return root


def link(root: Path, name: str, *, devtype: str = "", link_type: int = 1) -> None:
    folder = root / "sys/class/net" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "uevent").write_text(f"INTERFACE={name}\n" + (f"DEVTYPE={devtype}\n" if devtype else ""))
    (folder / "type").write_text(f"{link_type}\n")


def nmcli(tmp_path: Path, answers: dict[str, str]) -> str:
    """A stand-in ``nmcli`` answering ``-g GENERAL.METERED device show IF`` as NetworkManager does."""
    program = tmp_path / "nmcli"
    cases = "".join(f'  {name}) echo "{said}";;\n' for name, said in answers.items())
    program.write_text(f'#!/bin/sh\ncase "$5" in\n{cases}  *) echo "Error: Device not found" >&2; exit 10;;\nesac\n')
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return str(program)


METERED = ("wwan*", "ppp*", "rmnet*", "usb*")


def test_without_conditions_any_network_will_do(tmp_path: Path) -> None:
    verdict = NetworkMonitor(root=tmp_path, nmcli=None).check()
    assert verdict.eligible and verdict.reason == "any network"


def test_the_default_route_with_the_lowest_metric_decides(tmp_path: Path) -> None:
    root = routes(tmp_path, ("wwan0", 700), ("eth0", 100))
    link(root, "eth0")
    monitor = NetworkMonitor(require_unmetered=True, metered_interfaces=METERED, root=root, nmcli=None)
    assert monitor.default_interface() == "eth0"
    assert monitor.check() == Verdict("network", True, "on eth0, unmetered (not a cellular or tethered link)")
    routes(tmp_path, ("wwan0", 700))  # the wired link is gone: only the modem's route is left
    verdict = monitor.check()
    assert not verdict.eligible and verdict.reason.startswith("on wwan0, metered (its name matches wwan*")
    routes(tmp_path)
    assert monitor.check() == Verdict("network", False, "no network: no default route")


def test_a_cellular_modem_is_metered_by_its_link_whatever_its_name(tmp_path: Path) -> None:
    root = routes(tmp_path, ("cell0", 0))
    monitor = NetworkMonitor(require_unmetered=True, metered_interfaces=METERED, root=root, nmcli=None)
    link(root, "cell0", devtype="wwan")
    assert monitor.metered("cell0") == (True, "a cellular modem")
    link(root, "cell0", link_type=519)  # raw IP, as qmi_wwan makes it
    assert monitor.metered("cell0") == (True, "a PPP or raw-IP link")
    assert not monitor.check().eligible


def test_network_managers_word_overrides_the_guess_from_the_name(tmp_path: Path) -> None:
    root = routes(tmp_path, ("usb0", 0))
    link(root, "usb0")
    link(root, "wlan0")
    program = nmcli(tmp_path, {"usb0": "no", "wlan0": "yes (guessed)"})
    monitor = NetworkMonitor(require_unmetered=True, metered_interfaces=METERED, root=root, nmcli=program)
    assert monitor.check() == Verdict("network", True, "on usb0, unmetered (NetworkManager: no)")
    assert monitor.metered("wlan0") == (True, "NetworkManager: yes (guessed)")
    assert monitor.metered("eth7") == (False, "not a cellular or tethered link")  # not managed: the guess stands


def test_only_the_allowed_interfaces_are_used_and_ipv6_routes_count(tmp_path: Path) -> None:
    root = routes(tmp_path)
    (root / "proc/net/ipv6_route").write_text(
        f"{'0' * 32} 00 {'0' * 32} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth0\n"
        f"{'0' * 32} 00 {'0' * 32} 00 {'0' * 32} ffffffff 00000001 00000000 00200200 lo\n")
    monitor = NetworkMonitor(allowed_interfaces=("wlan*",), root=root, nmcli=None)
    verdict = monitor.check()
    assert not verdict.eligible and verdict.reason == "on eth0, which is not one of the allowed interfaces (wlan*)"
    assert NetworkMonitor(allowed_interfaces=("eth*", "wlan*"), root=root, nmcli=None).check().eligible


def config_with_network(tmp_path: Path, flower: dict | None = None, **network) -> Path:
    device = FakeDevice(tmp_path / "root")
    routes(device.root, ("eth0", 100))
    link(device.root, "eth0")
    return write_config(tmp_path, device, tmp_path / "data.csv", "tests.engine.models:mlp", "8x32",
                        **{f"network_{k}": v for k, v in network.items()},
                        **{f"flower_{k}": v for k, v in (flower or {}).items()})


def test_the_fleet_client_does_not_use_a_network_it_may_not(tmp_path: Path) -> None:
    config = load_config(config_with_network(tmp_path, allowed_interfaces=["wlan0"]))
    client = FleetClient("http://127.0.0.1:9", device_name="pi-1", token_path=tmp_path / "token", public_key=None,
                         enrolment_token="enrol-1", network=config.network_monitor())
    with pytest.raises(FleetUnavailableError, match=r"not using the network: on eth0, which is not one of the "
                                                     r"allowed interfaces \(wlan0\) \(\[network\] in the config\)"):
        client.call("POST", "/heartbeats", body=[])
    assert not (tmp_path / "token").exists()  # it did not even enrol


class Plugged:
    name = "power"

    def check(self, now: float) -> Verdict:
        return Verdict("power", True, "on mains")


def test_the_supernode_is_connected_only_while_the_network_is_allowed(tmp_path: Path, monkeypatch) -> None:
    path = config_with_network(tmp_path, {"enabled": True, "superlink": "fleet.example:9092"},
                               allowed_interfaces=["wlan0"])
    daemon = build_daemon(load_config(path), eligibility=Eligibility([Plugged()]), clock=lambda: 0.0)
    followed: list[bool] = []
    monkeypatch.setattr(daemon.supernode, "follow", lambda eligible, now: followed.append(eligible))
    daemon._tick(0.0)
    assert followed == [False] and daemon.status["eligible"] is True  # it may train, not join rounds
    assert daemon.status["network"] == "on eth0, which is not one of the allowed interfaces (wlan0)"
    link(tmp_path / "root", "wlan0")
    routes(tmp_path / "root", ("wlan0", 600))
    daemon._tick(10.0)
    assert followed == [False, True] and daemon.status["network"] == "on wlan0"


def test_network_settings_must_be_lists_of_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"network.allowed_interfaces must be a list of interface names"):
        load_config(config_with_network(tmp_path, allowed_interfaces="wlan0"))
    config = load_config(config_with_network(tmp_path, require_unmetered=True, metered_interfaces=["wwan*"]))
    assert config.network.require_unmetered and config.network.metered_interfaces == ("wwan*",)
