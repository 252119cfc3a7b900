"""sd_notify: tell systemd the agent is ready, what it is doing, and that it is alive.

Written to ``$NOTIFY_SOCKET`` directly (a datagram per message; an ``@``
prefix names an abstract socket): the protocol is a few lines, and the
``sdnotify`` package drops non-Latin-1 text silently and has no watchdog
helper.  Without ``$NOTIFY_SOCKET`` (not under systemd) every call does
nothing.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends ``READY=1``, ``STATUS=...``, ``WATCHDOG=1`` and ``STOPPING=1`` to systemd."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if address.startswith("@"):
            self.address = "\0" + address[1:]
        elif address.startswith("/"):
            self.address = address
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        """Whether a notify socket was given."""
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram; False when there is no socket or it is gone."""
        if self.address is None:
            return False
        message = "\n".join(assignments).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(message)
        except OSError:
            return False  # systemd gone or restarting: the agent keeps working
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={_one_line(status)}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={_one_line(status)}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", f"STATUS={_one_line(status)}")


def _watchdog_interval(env: dict[str, str]) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``$WATCHDOG_USEC``, when it is meant for this process."""
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


def _one_line(text: str) -> str:
    return " ".join(text.split())
