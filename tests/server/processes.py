"""``poet-edge server run`` as a real process on loopback, started as a server's install runs it (no torch).

Shared by the CLI tests and the dashboard's browser test (the ``server_process`` fixture in conftest).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]

# The server as a server's install runs it: the device's libraries cannot be imported.
WITHOUT_DEVICE_LIBRARIES = """
import sys
for name in ("torch", "torchvision", "transformers", "crc32c"):
    sys.modules[name] = None
from common.cli import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass
class ServerProcess:
    """A running server: its process, base URL, data directory, printed key id and log file."""

    process: subprocess.Popen
    url: str
    data: Path
    key_id: str
    log: Path

    def __iter__(self) -> Iterator[Any]:  # unpacks as (process, url, data, key_id, log)
        return iter((self.process, self.url, self.data, self.key_id, self.log))


@contextmanager
def running_server(folder: Path, *options: str) -> Iterator[ServerProcess]:
    """Start ``poet-edge server run --port 0`` with its data in ``folder/server``; kill it at the end."""
    data, log = folder / "server", folder / "server.log"
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", WITHOUT_DEVICE_LIBRARIES, "server", "run", "--data-dir",
                                    str(data), "--port", "0", *options],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO)
    try:
        line = process.stdout.readline()
        match = re.search(r"listening on (http://127\.0\.0\.1:(\d+)); server key ([0-9a-f]{16})", line)
        assert match, f"{line!r}; log: {log.read_text()}"
        yield ServerProcess(process, match.group(1), data, match.group(3), log)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def get(url: str) -> tuple[int, Message, bytes]:
    """GET ``url``: status, headers, body."""
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.status, response.headers, response.read()


def wait_until_serving(url: str, timeout: float = 60.0) -> None:
    """Poll the server's key until the server answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url + "/api/v1/server-key")
            return
        except OSError:
            assert time.monotonic() < deadline, "the server did not answer"
            time.sleep(0.2)
