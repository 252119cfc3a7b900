"""Ed25519 keys and signatures of schedules and other signed documents (global model versions).

The operator's server holds the private key and signs each schedule it
publishes; devices hold the public key and refuse anything that does not
verify.  The signature covers the canonical JSON of every schedule field but
itself, so changing one instruction, budget or prediction breaks it.
:func:`sign_payload` and :func:`verify_payload` do the same for any JSON
object (a model version's row: its weights' hash and provenance).  Loading verifies a schedule file's
document here first (:func:`verify_document`), then :mod:`schedules.schedule` builds the schedule from it:
this module never imports that one.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from common.canonical import canonical_json
from schedules.errors import FormatError, SignatureError

if TYPE_CHECKING:  # a schedule is built after its document verifies: schedules.schedule imports this module
    from schedules.schedule import Schedule

ALGORITHM = "ed25519"


def generate_keypair(directory: str | Path, name: str = "schedule-signing") -> tuple[Path, Path]:
    """Write ``NAME.key`` (private, mode 0600) and ``NAME.pub`` in ``directory``; refuse to overwrite."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists; move it away or choose another --name")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """Read a PEM Ed25519 private key written by :func:`generate_keypair`."""
    key = _load(path, serialization.load_pem_private_key, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise FormatError(f"{path} is not an Ed25519 private key; make one with `poet-edge keys`")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read a PEM Ed25519 public key written by :func:`generate_keypair`."""
    key = _load(path, serialization.load_pem_public_key)
    if not isinstance(key, Ed25519PublicKey):
        raise FormatError(f"{path} is not an Ed25519 public key; use the .pub file made by `poet-edge keys`")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short, stable name of a public key: the first 16 hex digits of its SHA-256."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(schedule: Schedule, private_key: Ed25519PrivateKey) -> Schedule:
    """Return ``schedule`` carrying an Ed25519 signature over its payload."""
    return schedule.with_signature(sign_payload(schedule.payload(), private_key))


def sign_payload(payload: dict[str, Any], private_key: Ed25519PrivateKey) -> dict[str, str]:
    """The signature (``algorithm``, ``key_id``, ``value``) of ``payload``'s canonical JSON."""
    value = private_key.sign(canonical_json(payload))
    return {"algorithm": ALGORITHM, "key_id": key_id(private_key.public_key()),
            "value": base64.b64encode(value).decode("ascii")}


def verify_payload(payload: dict[str, Any], signature: Any, public_key: Ed25519PublicKey, what: str) -> None:
    """Raise :class:`SignatureError` (naming ``what``) unless ``signature`` signs ``payload`` with ``public_key``."""
    if not (isinstance(signature, dict) and set(signature) == {"algorithm", "key_id", "value"}
            and all(isinstance(v, str) for v in signature.values())):
        raise SignatureError(f"{what} is not signed, or its signature is malformed: it was not stored by this "
                             "server, or was changed after")
    _verify(payload, signature, public_key, what)


def verify(schedule: Schedule, public_key: Ed25519PublicKey) -> None:
    """Raise :class:`SignatureError` unless ``schedule`` is signed by ``public_key`` and unchanged."""
    _verify(schedule.payload(), schedule.signature, public_key)


def verify_document(document: dict[str, Any], public_key: Ed25519PublicKey) -> None:
    """Verify a schedule file's JSON object as read, before anything in it is parsed or believed.

    A byte changed anywhere, inside the instructions included, fails here as
    a signature error rather than later as a malformed field.
    """
    payload = {key: value for key, value in document.items() if key != "signature"}
    signature = document.get("signature")
    if signature is not None and not (isinstance(signature, dict) and set(signature) == {"algorithm", "key_id", "value"}
                                      and all(isinstance(v, str) for v in signature.values())):
        raise SignatureError("schedule signature is malformed (expected algorithm, key_id and value): the file was "
                             "modified after signing")
    _verify(payload, signature, public_key)


def _verify(payload: dict[str, Any], sig: dict[str, str] | None, public_key: Ed25519PublicKey,
            what: str = "schedule") -> None:
    if sig is None:
        raise SignatureError("schedule is not signed; sign it with `poet-edge solve --sign KEY` or get it from the server")
    if sig["algorithm"] != ALGORITHM:
        raise SignatureError(f"unsupported signature algorithm {sig['algorithm']!r} (expected {ALGORITHM})")
    if sig["key_id"] != key_id(public_key):
        raise SignatureError(
            f"{what} was signed by key {sig['key_id']}, not by the trusted key {key_id(public_key)}: "
            "it comes from another server, or the device has the wrong public key"
        )
    try:
        public_key.verify(base64.b64decode(sig["value"], validate=True), canonical_json(payload))
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError(f"{what} signature does not verify: it was modified after signing") from exc


def _load(path: str | Path, loader, **kwargs):
    try:
        return loader(Path(path).read_bytes(), **kwargs)
    except OSError as exc:
        raise FormatError(f"cannot read key file {path}: {exc.strerror or exc}") from exc
    except (ValueError, TypeError) as exc:
        raise FormatError(f"{path} is not a PEM key file: {exc}") from exc
