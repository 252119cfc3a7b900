"""How the dashboard writes figures: one short string each, an em dash where a figure is absent."""

from __future__ import annotations

import math
import time
from typing import Any

from common.units import short_bytes

DASH = "\u2014"


def present(value: Any) -> bool:
    """Whether a figure is there to show (``None``, NaN and empty strings are not)."""
    if value is None or value == "":
        return False
    return not (isinstance(value, float) and math.isnan(value))


def number(value: Any, digits: int = 3) -> str:
    """``0.482``, ``1.23e+04``; an em dash when absent."""
    return f"{value:.{digits}g}" if present(value) else DASH


def count(value: Any) -> str:
    """``12,345``."""
    return f"{int(value):,}" if present(value) else DASH


def size(value: Any) -> str:
    """``412 MB``."""
    return short_bytes(value) if present(value) else DASH


def percent(fraction: Any) -> str:
    """A fraction 0..1 as ``87.5 %``."""
    return f"{100 * fraction:.1f} %" if present(fraction) else DASH


def joules(value: Any) -> str:
    """``0.482 J``, ``123 J``, ``4.74 kJ``, ``474 kJ``, ``1.25 MJ``: three figures, never an exponent."""
    if not present(value):
        return DASH
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(value) >= scale:
            scaled = value / scale
            return f"{scaled:,.0f} {unit}" if abs(scaled) >= 1000 else f"{scaled:.3g} {unit}"
    return f"{value:.3g} J"


def seconds(value: Any) -> str:
    """``1.25 s``."""
    return f"{value:.3g} s" if present(value) else DASH


def clock(timestamp: Any) -> str:
    """A Unix time as ``2026-01-15 14:03:12`` (the server's local time)."""
    if not present(timestamp):
        return DASH
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    except (OverflowError, OSError, ValueError):  # stored before heartbeats were held to a device's range
        return f"{timestamp:.6g} (not a time)"


SKEW_SHOWN_SECONDS = 60.0  # a device clock this far off the server's is worth an operator's look


def skew(seconds: Any) -> str:
    """A device clock against the server's: ``in step``, or ``3 h ahead`` / ``12 min behind``."""
    if not present(seconds):
        return DASH
    if abs(seconds) < SKEW_SHOWN_SECONDS:
        return "in step with the server's"
    amount = abs(seconds)
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if amount >= scale:
            break
    return f"{amount / scale:.0f} {unit} {'ahead of' if seconds > 0 else 'behind'} the server's (times it sends " \
           "are shown as sent, ordered as received)"


def age(timestamp: Any, now: float) -> str:
    """How long ago: ``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 d ago``; ``never`` when absent."""
    if not present(timestamp):
        return "never"
    elapsed = max(0.0, now - timestamp)
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if elapsed >= scale:
            return f"{elapsed // scale:.0f} {unit} ago"
    return f"{elapsed:.0f} s ago"


def power(beat: dict[str, Any]) -> str:
    """Charging and battery: ``charging, 87 %``, ``on battery, 40 %``, ``mains``."""
    parts = []
    if beat.get("charging") is True:
        parts.append("charging")
    elif beat.get("charging") is False:
        parts.append(f"on {beat['power_source']}" if present(beat.get("power_source")) else "not charging")
    elif present(beat.get("power_source")):
        parts.append(str(beat["power_source"]))
    if present(beat.get("battery_percent")):
        parts.append(f"{beat['battery_percent']:.0f} %")
    return ", ".join(parts) or DASH


def temperature(value: Any) -> str:
    """``61.3 °C``."""
    return f"{value:.1f} \u00b0C" if present(value) else DASH


def memory(budget: Any, peak: Any) -> str:
    """Peak used against the budget: ``412 MB / 512 MB``; either part a dash when absent."""
    if not present(budget) and not present(peak):
        return DASH
    return f"{size(peak)} / {size(budget)}"
