"""The audit page's filters, read from its query string: by actor, action and time, a page at a time.

Times are the server's local time, as the page shows them (``2026-11-28`` or ``2026-11-28 14:05``); ``until``
a day means to its end.  A value that does not read is left out, and the page says so: a filter mistyped never
shows the whole log as if it were the filtered one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from urllib.parse import urlencode

from server.audit import ACTIONS, AuditQuery

TIME_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d")
FIELDS = ("actor", "action", "since", "until")


def read_query(params: Mapping[str, str]) -> tuple[AuditQuery, list[str]]:
    """The query the page's parameters ask for, and a note for each one left out."""
    notes: list[str] = []
    actor = params.get("actor", "").strip()[:100]
    action = params.get("action", "").strip()
    if action and action not in ACTIONS:
        notes.append(f"no action is called {action[:40]!r}: showing every action")
        action = ""
    since = _time(params.get("since", ""), "since", notes, end_of_day=False)
    until = _time(params.get("until", ""), "until", notes, end_of_day=True)
    before = None
    if params.get("before", "").isdigit() and len(params["before"]) <= 18:
        before = int(params["before"])
    return AuditQuery(actor, action, since, until, before), notes


def older_link(params: Mapping[str, str], older: int) -> str:
    """The next older page's URL, with the same filters."""
    kept = {k: params[k] for k in FIELDS if params.get(k)}
    return "/audit?" + urlencode({**kept, "before": older})


def _time(text: str, name: str, notes: list[str], end_of_day: bool) -> float | None:
    text = text.strip()
    if not text:
        return None
    for form in TIME_FORMATS:
        try:
            parsed = time.mktime(time.strptime(text[:16], form))
        except (ValueError, OverflowError):
            continue
        return parsed + (86400 if end_of_day and form == "%Y-%m-%d" else 0)
    notes.append(f"{name} {text[:40]!r} is not a time like 2026-11-28 or 2026-11-28 14:05: left out")
    return None
