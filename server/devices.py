"""Devices: enrolment tokens, enrolment, authentication, revocation, and their heartbeats.

An operator makes a single-use enrolment token (``poet-edge server
enrol-token``); a device exchanges it once, with the name it wants, for its
own device token, which it then sends as ``Authorization: Bearer``.  Tokens
are stored as hashes (:mod:`server.tokens`).  A revoked device's token is
refused; its name may be enrolled again with a new enrolment token (a
re-imaged board keeps its name and history, under a new token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from server.db.engine import Database
from server.db.models import DEVICE_NAME_LENGTH, Device, EnrolmentToken, Heartbeat
from server.errors import (AuthenticationError, DeviceNameTakenError, EnrolmentRefusedError, UnknownDeviceError,
                           UnknownTokenError)
from server.tokens import MAX_TOKEN_LENGTH, hashes_match, new_token, token_hash

# Not starting with a dot: "." and ".." would be path steps in the dashboard's /devices/NAME links.
DEVICE_NAME_PATTERN = rf"^[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{DEVICE_NAME_LENGTH - 1}}}$"
ENROLMENT_REFUSED = "enrolment token refused: it is wrong, already used or expired; ask the operator for a new one"


@dataclass(frozen=True)
class DeviceIdentity:
    """Who an authenticated request comes from."""

    id: int
    name: str


@dataclass(frozen=True)
class Enrolment:
    """What a device gets for its enrolment token: its name and its own token (shown once, never stored)."""

    device_name: str
    device_token: str


def check_device_name(name: str) -> str:
    """``name`` if it is 1-64 characters of ``A-Z a-z 0-9 . _ -``; raises :class:`UnknownDeviceError` otherwise."""
    if not re.fullmatch(DEVICE_NAME_PATTERN, name):
        raise UnknownDeviceError(f"{name!r} is not a device name (1-{DEVICE_NAME_LENGTH} characters of A-Z a-z "
                                 "0-9 . _ -, not starting with a dot)")
    return name


def create_enrolment_token(db: Database, lifetime_seconds: float, now: float) -> tuple[str, int]:
    """A new single-use enrolment token valid for ``lifetime_seconds``, and its id (what listings and revocation
    name it by); only its hash is stored."""
    token = new_token()
    row = EnrolmentToken(token_hash=token_hash(token), created_at=now, expires_at=now + lifetime_seconds)
    with db.write() as session:
        session.add(row)
        session.flush()
        token_id = row.id
    return token, token_id


def token_status(token: EnrolmentToken, now: float) -> str:
    """``valid``, ``used``, ``revoked`` or ``expired``."""
    if token.used_at is not None:
        return "used"
    if token.revoked_at is not None:
        return "revoked"
    return "expired" if token.expires_at <= now else "valid"


def list_enrolment_tokens(db: Database, limit: int = 200) -> list[EnrolmentToken]:
    """The newest ``limit`` enrolment tokens (their hashes, never the tokens), newest first."""
    with db.read() as session:
        return list(session.scalars(select(EnrolmentToken).order_by(EnrolmentToken.id.desc()).limit(limit)))


def revoke_enrolment_token(db: Database, token_id: int, now: float) -> bool:
    """Revoke an unused enrolment token: no device can enrol with it from now on.  ``False`` when it was
    revoked already; :class:`UnknownTokenError` when no such token exists or it was used (revoke the device
    that used it instead)."""
    with db.write() as session:
        row = session.get(EnrolmentToken, token_id)
        if row is None:
            raise UnknownTokenError(f"no enrolment token has id {token_id} (poet-edge server tokens list)")
        if row.used_at is not None:
            raise UnknownTokenError(f"enrolment token {token_id} was used by {row.used_by!r} already: revoke the "
                                    f"device instead (poet-edge server revoke {row.used_by})")
        if row.revoked_at is not None:
            return False
        row.revoked_at = now
        return True


def enrol(db: Database, enrolment_token: str, device_name: str, now: float) -> Enrolment:
    """Exchange a valid enrolment token for a device token; the token is spent.

    Raises
    ------
    EnrolmentRefusedError
        The token is wrong, already used or expired (one message for all).
    DeviceNameTakenError
        A device that is not revoked has the name (the token is not spent).
    """
    device_token = new_token()
    try:
        with db.write() as session:
            token_row = _usable_token(session, enrolment_token, now)
            device = session.scalar(select(Device).where(Device.name == device_name))
            if device is not None and device.revoked_at is None:
                raise DeviceNameTakenError(f"a device named {device_name!r} is enrolled already; choose another name, "
                                           "or ask the operator to revoke the old one first")
            spent = session.execute(update(EnrolmentToken).where(EnrolmentToken.id == token_row.id,
                                                                 EnrolmentToken.used_at.is_(None))
                                    .values(used_at=now, used_by=device_name))
            if spent.rowcount != 1:  # spent by a concurrent enrolment between our read and this write
                raise EnrolmentRefusedError(ENROLMENT_REFUSED)
            if device is None:
                session.add(Device(name=device_name, token_hash=token_hash(device_token), enrolled_at=now))
            else:
                device.token_hash, device.enrolled_at, device.revoked_at = token_hash(device_token), now, None
    except IntegrityError as exc:  # the name was taken by a concurrent enrolment
        raise DeviceNameTakenError(f"a device named {device_name!r} is enrolled already; choose another name") from exc
    return Enrolment(device_name, device_token)


def _usable_token(session: Any, enrolment_token: str, now: float) -> EnrolmentToken:
    if len(enrolment_token) > MAX_TOKEN_LENGTH:
        raise EnrolmentRefusedError(ENROLMENT_REFUSED)
    row = session.scalar(select(EnrolmentToken).where(EnrolmentToken.token_hash == token_hash(enrolment_token)))
    if (row is None or not hashes_match(row.token_hash, enrolment_token) or row.used_at is not None
            or row.revoked_at is not None or row.expires_at <= now):
        raise EnrolmentRefusedError(ENROLMENT_REFUSED)
    return row


def authenticate(db: Database, device_token: str) -> DeviceIdentity:
    """The device whose token this is.

    Raises
    ------
    AuthenticationError
        No device has this token, or the device was revoked.
    """
    if not device_token or len(device_token) > MAX_TOKEN_LENGTH:
        raise AuthenticationError("unknown device token; enrol the device with an enrolment token")
    with db.lookups.connect() as connection:  # no session, no transaction: every request pays for this lookup
        row = connection.execute(_BY_TOKEN_HASH, {"hash": token_hash(device_token)}).first()
    if row is None or not hashes_match(row.token_hash, device_token):
        raise AuthenticationError("unknown device token; enrol the device with an enrolment token")
    if row.revoked_at is not None:
        raise AuthenticationError("this device was revoked; enrol it again with a new enrolment token")
    return DeviceIdentity(row.id, row.name)


def revoke(db: Database, name: str, now: float) -> bool:
    """Revoke the device called ``name``; ``False`` if it was revoked already.

    Raises
    ------
    UnknownDeviceError
        No device has that name.
    """
    with db.write() as session:
        device = session.scalar(select(Device).where(Device.name == check_device_name(name)))
        if device is None:
            raise UnknownDeviceError(f"no device is named {name!r}")
        if device.revoked_at is not None:
            return False
        device.revoked_at = now
        return True


def record_heartbeats(db: Database, device_id: int, beats: Sequence[dict[str, Any]], received_at: float,
                      keep: int) -> None:
    """Store heartbeats (each with ``sent_at``), update the device's latest figures, keep its newest ``keep``.

    Time is the server's: the newest heartbeat of the request received last is the device's state now, and
    ``sent_at`` orders beats only within one request (the agent's own queue, one clock).  A device clock that
    runs ahead or behind (no real-time clock, no network time yet) is recorded as the device's skew and shown,
    never trusted: a heartbeat dated next year cannot freeze the state.  Core statements in one transaction,
    not ORM objects: this runs for every heartbeat of the fleet, and the unit of work costs more than the SQL.
    """
    if not beats:
        return
    newest = max(beats, key=lambda beat: beat["sent_at"])
    with db.write() as session:
        connection = session.connection()
        connection.execute(_HEARTBEAT, [{"device_id": device_id, "received_at": received_at,
                                                "sent_at": beat["sent_at"], "payload": beat} for beat in beats])
        connection.execute(_DEVICE, {"device": device_id, "last_seen": received_at,
                                     "clock_skew_seconds": newest["sent_at"] - received_at, **_latest(newest)})
        _prune(connection, device_id, keep)


def _latest(beat: dict[str, Any]) -> dict[str, Any]:
    """The device's columns that follow its newest heartbeat."""
    return {"last_heartbeat": beat, "last_sent_at": beat["sent_at"], "state": beat.get("state"),
            "steps_done": beat.get("steps_done"), "energy_j": beat.get("energy_j"),
            "software_version": beat.get("software_version")}


def _prune(connection: Any, device_id: int, keep: int) -> None:
    connection.execute(_HEARTBEATS_BEFORE_NTH_NEWEST, {"device": device_id, "skip": keep - 1})


# The statements every heartbeat runs, built once (building them costs more than SQLite running them); the SET
# columns of the updates come from the parameters' keys.
_BY_TOKEN_HASH = (select(Device.id, Device.name, Device.token_hash, Device.revoked_at)
                  .where(Device.token_hash == bindparam("hash")))
_HEARTBEAT = insert(Heartbeat)
_DEVICE = update(Device).where(Device.id == bindparam("device"))
# One statement, so one round trip to a database server: fewer than ``keep`` beats make the subquery NULL, and
# ``id < NULL`` deletes nothing.
_NTH_NEWEST_HEARTBEAT = (select(Heartbeat.id).where(Heartbeat.device_id == bindparam("device"))
                         .order_by(Heartbeat.id.desc()).offset(bindparam("skip")).limit(1).scalar_subquery())
_HEARTBEATS_BEFORE_NTH_NEWEST = delete(Heartbeat).where(Heartbeat.device_id == bindparam("device"),
                                                        Heartbeat.id < _NTH_NEWEST_HEARTBEAT)
