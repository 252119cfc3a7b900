"""Canonical JSON: one byte string per value, so hashes and signatures are stable."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, TypeVar

from common.errors import FormatError

T = TypeVar("T")


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` as compact, key-sorted UTF-8 JSON (no NaN/Infinity)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """Read a JSON object from ``path``; any failure becomes a :class:`FormatError` naming ``what``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc
    return parse_json_object(text, f"{what} file {path}")


def load_validated(path: str | Path, what: str, from_dict: Callable[[dict[str, Any]], T]) -> T:
    """Read ``path`` as JSON and build it with ``from_dict``; format errors name the file."""
    data = read_json_object(path, what)
    try:
        return from_dict(data)
    except FormatError as exc:
        raise type(exc)(f"{path}: {exc}") from exc


def parse_json_object(text: str | bytes, what: str) -> dict[str, Any]:
    """Parse ``text`` as a JSON object, rejecting NaN/Infinity and non-objects."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise FormatError(f"{what} must hold a JSON object, found {type(value).__name__}")
    return value


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")


def finite_number(value: Any, field: str, *, minimum: float | None = 0.0) -> float:
    """Return ``value`` as a finite float, or raise :class:`FormatError` naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FormatError(f"{field} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise FormatError(f"{field} must be >= {minimum}, got {value!r}")
    return float(value)
