"""The server's Ed25519 signing key: made in the data directory on first start, kept across restarts.

Every schedule the server stores is signed with it; devices pin its public key
(``GET /api/v1/server-key``, also returned at enrolment) and refuse any
schedule that does not verify (:func:`schedules.signing.verify_document`).
The private key file is mode 0600 and never leaves the data directory.

Several server processes serving one fleet (PostgreSQL, :mod:`server.db`) must
sign with one key, since each device pins one: start them all with the same
``--data-dir`` (its ``keys/`` holds the pair; the first process to start makes
it, under a lock, and the others load it), or, on separate machines, copy
``keys/server-signing.key`` (mode 0600) into each machine's data directory
before its first start.  A process that made its own key would sign schedules
its devices refuse.
"""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from schedules.errors import FormatError
from schedules.schedule import Schedule
from schedules.signing import generate_keypair, key_id, load_private_key, sign
from server.errors import ServerKeyError

KEY_NAME = "server-signing"
LOCK_NAME = ".server-signing.lock"


@dataclass(frozen=True)
class ServerKey:
    """The loaded key pair: sign with :meth:`sign`; publish :attr:`public_pem` and :attr:`key_id`."""

    private_key: Ed25519PrivateKey
    path: Path

    @property
    def public_pem(self) -> str:
        """The public key as PEM text (what ``poet-edge verify --key`` and the agent read)."""
        raw = self.private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo)
        return raw.decode("ascii")

    @property
    def key_id(self) -> str:
        """The key's short name, as schedule signatures carry it."""
        return key_id(self.private_key.public_key())

    def sign(self, schedule: Schedule) -> Schedule:
        """``schedule`` signed with this key."""
        return sign(schedule, self.private_key)


def load_or_create(directory: Path) -> ServerKey:
    """The key pair in ``directory`` (``server-signing.key``/``.pub``), made there first if absent.

    Raises
    ------
    ServerKeyError
        The directory cannot be written, or the key file exists but cannot be read as an Ed25519 key.
    """
    private_path = directory / f"{KEY_NAME}.key"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Processes starting at once over one data directory: one makes the key, the others wait and load it
        # (without the lock, a loader could read a half-written key file).
        with (directory / LOCK_NAME).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not private_path.exists():
                generate_keypair(directory, KEY_NAME)
            return ServerKey(load_private_key(private_path), private_path)
    except FileExistsError as exc:  # the .pub without the .key: someone moved the private key away
        raise ServerKeyError(f"{exc}; the server's private key {private_path} is missing beside it: restore it, "
                             "or move the .pub away to make a new key (devices must then pin the new one)") from exc
    except OSError as exc:
        raise ServerKeyError(f"cannot create the server key in {directory}: {exc.strerror or exc}") from exc
    except FormatError as exc:
        raise ServerKeyError(f"the server key cannot be read: {exc}") from exc
