"""The fleet table as pages: search, filters and sort run in the database.

A page of 50 rows out of 10,000 devices is one query with ``LIMIT``, a
count of the matches and one grouped count of the whole fleet, whatever the
fleet's size.  A live refresh names the page's devices in order and sends
full rows only for the devices that changed since the client's last answer
(a heartbeat, an enrolment, a revocation, or going offline in between), so
the browser rewrites only those rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping
from urllib.parse import urlencode

from sqlalchemy import ColumnElement, and_, func, or_, select

from server.dashboard import views
from server.db.engine import Database
from server.db.models import Device
from server.fleet_history import STATUSES, fleet_counts

PER_PAGE = 50
MAX_PER_PAGE = 200
MAX_SEARCH = 64
# Rows changed this long before an answer are sent again with the next one: a heartbeat stamped with its
# receive time can commit just after a page was read, and must not be missed by the next refresh.
CHANGE_SLACK_SECONDS = 5.0
# The sortable columns: (query value, heading key in views.COLUMNS or "name", the column sorted on).
SORTS: dict[str, Callable[[], ColumnElement]] = {
    "name": lambda: Device.name,
    "last_seen": lambda: Device.last_seen,
    "state": lambda: Device.state,
    "steps": lambda: Device.steps_done,
    "energy": lambda: Device.energy_j,
}
SORTED_BY_COLUMN = {"name": "name", "online": "last_seen", "state": "state", "steps": "steps", "energy": "energy"}
SORT_COLUMN = {sort: column for column, sort in SORTED_BY_COLUMN.items()}
DESCENDING_FIRST = {"last_seen", "steps", "energy"}  # newest / most first when an operator picks them


@dataclass(frozen=True)
class FleetQuery:
    """What the operator asked the fleet table for; every field already checked (see :meth:`from_params`)."""

    search: str = ""
    status: str = ""  # "", or one of STATUSES
    state: str = ""  # "", or one of views.STATES: online devices whose last heartbeat reported it
    sort: str = "name"
    descending: bool = False
    page: int = 1
    per_page: int = PER_PAGE

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> FleetQuery:
        """The query from a request's parameters; an unknown value falls back to its default (the table
        is a view, never an error page)."""
        sort = params.get("sort", "name")
        sort = sort if sort in SORTS else "name"
        order = params.get("order", "")
        return cls(search=params.get("q", "").strip()[:MAX_SEARCH],
                   status=_one_of(params.get("status", ""), STATUSES),
                   state=_one_of(params.get("state", ""), views.STATES),
                   sort=sort,
                   descending=order == "desc" if order in ("asc", "desc") else sort in DESCENDING_FIRST,
                   page=_positive(params.get("page", ""), 1, 10**9),
                   per_page=_positive(params.get("per_page", ""), PER_PAGE, MAX_PER_PAGE))

    def params(self, **changes: Any) -> dict[str, str]:
        """The query parameters that say this query (with ``changes``), defaults left out."""
        query = replace(self, **changes)
        default = query.sort in DESCENDING_FIRST
        pairs = {"q": query.search, "status": query.status, "state": query.state,
                 "sort": query.sort if query.sort != "name" else "",
                 "order": ("desc" if query.descending else "asc") if query.descending != default else "",
                 "page": str(query.page) if query.page != 1 else "",
                 "per_page": str(query.per_page) if query.per_page != PER_PAGE else ""}
        return {key: value for key, value in pairs.items() if value}

    def url(self, **changes: Any) -> str:
        """The fleet page's address for this query (with ``changes``)."""
        params = self.params(**changes)
        return "/?" + urlencode(params) if params else "/"

    def sort_url(self, column: str) -> str:
        """The address that sorts by a table column (flipping the order when it is sorted by it already)."""
        sort = SORTED_BY_COLUMN[column]
        descending = not self.descending if sort == self.sort else sort in DESCENDING_FIRST
        return self.url(sort=sort, descending=descending, page=1)


@dataclass(frozen=True)
class FleetPage:
    """One page of the fleet table, with the counts that say where it sits in the fleet."""

    query: FleetQuery
    now: float
    total: int  # devices matching the query
    names: list[str]  # the page's devices, in order
    rows: list[dict[str, Any]]  # full rows: every row of the page, or those changed since the client's cursor
    online: list[list[str]]  # every row's status and "online" cell ("online, 12 s ago"), which age as time passes
    counts: dict[str, int] = field(default_factory=dict)  # the whole fleet: devices, online, offline, revoked, states

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.query.per_page))

    @property
    def first(self) -> int:
        """The 1-based position of the page's first row (0 when the page is empty)."""
        return (self.query.page - 1) * self.query.per_page + 1 if self.names else 0

    def json(self, since: float | None) -> dict[str, Any]:
        """The answer to a live refresh; ``cursor`` is what the client sends back as ``since``."""
        return {"now": self.now, "cursor": self.now - CHANGE_SLACK_SECONDS, "complete": since is None,
                "total": self.total, "page": self.query.page, "pages": self.pages, "per_page": self.query.per_page,
                "first": self.first, "counts": self.counts, "names": self.names, "rows": self.rows,
                "online": self.online, "query": self.query.params(), "links": self.links()}

    def links(self) -> dict[str, Any]:
        """Where the pager and the column headings lead from this page."""
        q = self.query
        return {"prev": q.url(page=q.page - 1) if q.page > 1 else None,
                "next": q.url(page=q.page + 1) if q.page < self.pages else None,
                "sort": {column: q.sort_url(column) for column in SORTED_BY_COLUMN},
                "sorted": SORT_COLUMN[q.sort], "order": "desc" if q.descending else "asc"}


def fleet_page(db: Database, query: FleetQuery, now: float, online_seconds: float,
               since: float | None = None) -> FleetPage:
    """The page ``query`` asks for; with ``since``, full rows only for devices changed after it."""
    cutoff = now - online_seconds
    where = _conditions(query, cutoff)
    sorted_on = SORTS[query.sort]()
    order = [sorted_on.is_(None), sorted_on.desc() if query.descending else sorted_on.asc(), Device.name.asc()]
    with db.read() as session:
        total = session.scalar(select(func.count()).select_from(Device).where(*where)) or 0
        pages = max(1, math.ceil(total / query.per_page))
        if query.page > pages:
            query = replace(query, page=pages)
        # the page's ids first (sorted from the index), then their whole rows: sorting whole rows would carry
        # every device's last heartbeat through the sort
        ids = session.scalars(select(Device.id).where(*where).order_by(*order)
                              .offset((query.page - 1) * query.per_page).limit(query.per_page)).all()
        found = {d.id: d for d in session.scalars(select(Device).where(Device.id.in_(ids)))}
        devices = [found[i] for i in ids if i in found]
        counts = fleet_counts(session, cutoff)
    counts["devices"] = sum(counts[status] for status in STATUSES)
    rows = {d.name: views.fleet_row(d, now, online_seconds) for d in devices}
    changed = [rows[d.name] for d in devices if since is None or _changed(d, since, now, online_seconds)]
    return FleetPage(query, now, total, list(rows), changed,
                     [[row["status"], row["cells"]["online"]] for row in rows.values()], counts)


def _conditions(query: FleetQuery, cutoff: float) -> list[ColumnElement]:
    where: list[ColumnElement] = []
    if query.search:
        where.append(Device.name.icontains(query.search, autoescape=True))
    if query.status == "revoked":
        where.append(Device.revoked_at.is_not(None))
    elif query.status == "offline":
        where += [Device.revoked_at.is_(None), or_(Device.last_seen.is_(None), Device.last_seen < cutoff)]
    elif query.status == "online" or query.state:
        where.append(_online(cutoff))
    if query.state:
        where.append(Device.state == query.state)
    return where


def _online(cutoff: float) -> ColumnElement:
    return and_(Device.revoked_at.is_(None), Device.last_seen >= cutoff)


def _changed(device: Device, since: float, now: float, online_seconds: float) -> bool:
    """Whether the device's row may read differently than at ``since``: it was enrolled, heard from or revoked
    after it, or went offline in between (its last heartbeat aged past the online window)."""
    touched = max(device.enrolled_at, device.last_seen or 0.0, device.revoked_at or 0.0)
    went_offline = device.last_seen is not None and since < device.last_seen + online_seconds <= now
    return touched > since or went_offline


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else ""


def _positive(text: str, default: int, most: int) -> int:
    if not (text.isdigit() and len(text) <= 9) or int(text) < 1:
        return default
    return min(int(text), most)
