"""May the agent use the network now: the fleet's traffic only over allowed, and if asked unmetered, interfaces.

The condition gates the agent's network use, not training: heartbeats wait on
disk, a schedule comes from the cache or a local solve, and the Flower
SuperNode is not connected (so the device sits out federated rounds) while
the device's traffic would leave through an interface it may not use, the
way JobScheduler's and Google's federated compute's network constraints do.

The interface is the one the kernel's default route goes through (the lowest
metric in ``/proc/net/route``, then ``/proc/net/ipv6_route``).  Whether it is
metered comes from NetworkManager where it runs (``nmcli``'s
``GENERAL.METERED``: what the user or the carrier set, or its own guess), and
otherwise from the interface: a name matching ``metered_interfaces`` (cellular
modems, PPP, USB tethering by default) or a kernel device type that is a
cellular modem (``DEVTYPE=wwan``, a PPP or raw-IP link).
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from agent.monitors.base import Verdict

ARPHRD_PPP, ARPHRD_RAWIP = 512, 519  # link types of PPP and raw-IP (QMI/MBIM cellular) interfaces
RTF_UP = 0x1
NMCLI_TIMEOUT_SECONDS = 3.0


class NetworkMonitor:
    """Allowed while the default route's interface matches ``allowed_interfaces`` (any, when empty) and, with
    ``require_unmetered``, is not metered.

    Parameters
    ----------
    root:
        Where ``proc/net`` and ``sys/class/net`` are read (``/`` on a device; a fake tree in tests).
    nmcli:
        NetworkManager's command line program, or ``None`` where it does not run (found on ``PATH`` by default).
    """

    name = "network"

    def __init__(self, *, require_unmetered: bool = False, allowed_interfaces: Sequence[str] = (),
                 metered_interfaces: Sequence[str] = (), root: str | Path = "/",
                 nmcli: str | None = "") -> None:
        self.require_unmetered = require_unmetered
        self.allowed_interfaces = tuple(allowed_interfaces)
        self.metered_interfaces = tuple(metered_interfaces)
        self.root = Path(root)
        self.nmcli = shutil.which("nmcli") if nmcli == "" else nmcli

    @property
    def restricted(self) -> bool:
        """Whether there is any condition to check (else every network is allowed)."""
        return self.require_unmetered or bool(self.allowed_interfaces)

    def check(self, now: float = 0.0) -> Verdict:
        """The verdict now; ``now`` is unused (a route has no memory)."""
        if not self.restricted:
            return Verdict(self.name, True, "any network")
        interface = self.default_interface()
        if interface is None:
            return Verdict(self.name, False, "no network: no default route")
        if self.allowed_interfaces and not any(fnmatch.fnmatchcase(interface, p) for p in self.allowed_interfaces):
            return Verdict(self.name, False, f"on {interface}, which is not one of the allowed interfaces "
                                             f"({', '.join(self.allowed_interfaces)})")
        if not self.require_unmetered:
            return Verdict(self.name, True, f"on {interface}")
        metered, why = self.metered(interface)
        if metered:
            return Verdict(self.name, False, f"on {interface}, metered ({why}); only unmetered networks allowed")
        return Verdict(self.name, True, f"on {interface}, unmetered ({why})")

    def default_interface(self) -> str | None:
        """The interface of the default route with the lowest metric (IPv4 first, then IPv6), or ``None``."""
        routes: list[tuple[int, str]] = []
        for line in _lines(self.root / "proc/net/route")[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[1] == "00000000" and fields[7] == "00000000" \
                    and int(fields[3], 16) & RTF_UP:
                routes.append((int(fields[6]), fields[0]))
        if not routes:
            for line in _lines(self.root / "proc/net/ipv6_route"):
                fields = line.split()
                if len(fields) == 10 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo" \
                        and int(fields[8], 16) & RTF_UP:
                    routes.append((int(fields[5], 16), fields[9]))
        return min(routes)[1] if routes else None

    def metered(self, interface: str) -> tuple[bool, str]:
        """Whether ``interface`` is metered, and what said so."""
        said = self._network_manager(interface)
        if said is not None:
            return said.startswith("yes"), f"NetworkManager: {said}"
        if any(fnmatch.fnmatchcase(interface, p) for p in self.metered_interfaces):
            return True, f"its name matches {', '.join(self.metered_interfaces)}"
        device = self.root / "sys/class/net" / interface
        if "DEVTYPE=wwan" in _lines(device / "uevent"):
            return True, "a cellular modem"
        link = _lines(device / "type")
        if link and link[0].strip() in (str(ARPHRD_PPP), str(ARPHRD_RAWIP)):
            return True, "a PPP or raw-IP link"
        return False, "not a cellular or tethered link"

    def _network_manager(self, interface: str) -> str | None:
        """NetworkManager's metered setting for the interface (``yes``, ``no``, ``yes (guessed)`` ...), or ``None``
        when it does not run or does not manage the interface."""
        if not self.nmcli:
            return None
        try:
            answer = subprocess.run([self.nmcli, "-g", "GENERAL.METERED", "device", "show", interface],
                                    capture_output=True, text=True, timeout=NMCLI_TIMEOUT_SECONDS)
        except (OSError, subprocess.SubprocessError):
            return None
        said = answer.stdout.strip()
        return said if answer.returncode == 0 and said and not said.startswith("unknown") else None


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
