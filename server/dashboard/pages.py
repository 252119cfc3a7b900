"""The dashboard's pages: fleet (with its JSON for live refresh), a device, schedules, rounds, enrolment tokens."""

from __future__ import annotations

import re
import time
from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from server import audit, devices, solve_requests
from server.api.state import client_address, server_state
from server.dashboard import audit_view, csrf, views
from server.dashboard.auth import AdminOperator, ApiOperator, PageOperator, local_path
from server.dashboard.device_charts import device_charts
from server.dashboard.fleet_charts import fleet_charts
from server.dashboard.fleet_query import SORTED_BY_COLUMN, STATUSES, FleetPage, FleetQuery, fleet_page
from server.dashboard.render import render
from server.dashboard.state import dashboard_state
from server.fleet_history import samples_since
from server.errors import SolveCancelRefusedError, UnknownDeviceError, UnknownSolveRequestError, UnknownTokenError

router = APIRouter(include_in_schema=False)
REFRESH_MS = 2000
SCHEDULE_ID = re.compile(r"[0-9a-f]{16}")
CHART_HOURS = {"6": "6 hours", "24": "24 hours", "168": "7 days"}
TOKEN_LIFETIMES = {"1h": 3600.0, "24h": 86400.0, "7d": 7 * 86400.0}
FormText = Annotated[str, Form(max_length=1024)]
TIMELINE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"  # matplotlib's SVG, as an image


def _fleet(request: Request, since: float | None = None) -> FleetPage:
    server = server_state(request)
    query = FleetQuery.from_params(request.query_params)
    return fleet_page(server.db, query, time.time(), server.settings.online_seconds, since)


@router.get("/")
def fleet_page_view(request: Request, operator: PageOperator) -> Response:
    """The fleet table, one page of it (``q``, ``status``, ``state``, ``sort``, ``order``, ``page``); its
    script refreshes it from :func:`fleet_json`."""
    return render(request, "fleet.html", operator, page="fleet", fleet=_fleet(request), columns=views.COLUMNS,
                  sortable=SORTED_BY_COLUMN, statuses=STATUSES, states=views.STATES, refresh_ms=REFRESH_MS)


@router.get("/dashboard/fleet.json")
def fleet_json(request: Request, operator: ApiOperator,
               since: Annotated[float | None, Query(ge=0, le=1e11)] = None) -> dict[str, Any]:
    """The page of the fleet table the parameters ask for, as the page's script draws it.  With ``since``
    (the ``cursor`` of the previous answer) full rows come only for devices changed after it; ``names``
    always lists the whole page in order."""
    fleet = _fleet(request, since)
    return {**fleet.json(since), "updated": time.strftime("%H:%M:%S", time.localtime(fleet.now)),
            "online_seconds": server_state(request).settings.online_seconds}


@router.get("/fleet/charts")
def fleet_charts_page(request: Request, operator: PageOperator,
                      hours: Annotated[str, Query(max_length=8)] = "24") -> Response:
    """The fleet over the last ``hours`` (6, 24 or 168): devices by state, steps and energy per hour."""
    shown = int(hours) if hours in CHART_HOURS else 24
    samples = samples_since(server_state(request).db, time.time() - shown * 3600)
    return render(request, "fleet_charts.html", operator, page="fleet", hours=shown, choices=CHART_HOURS,
                  charts=fleet_charts(samples), samples=len(samples))


@router.get("/devices/{name}")
def device_page(request: Request, name: str, operator: PageOperator) -> Response:
    """One device: its figures, charts over its recent heartbeats, its schedule's timeline, a revoke button."""
    server = server_state(request)
    view = views.device_view(server.db, name, time.time(), server.settings.online_seconds)
    if view is None:
        return render(request, "message.html", operator, status=404, title="No such device",
                      message=f"No device is named {name!r}.")
    return render(request, "device.html", operator, page="fleet", view=view, charts=device_charts(view.history))


@router.post("/devices/{name}/revoke")
def revoke_device(request: Request, name: str, operator: AdminOperator, csrf_token: FormText = "",
                  next: FormText = "") -> Response:
    """Revoke the device: its token is refused from now on."""
    csrf.check_form(request, operator.csrf_token, csrf_token)
    db = server_state(request).db
    try:
        if devices.revoke(db, name, time.time()):
            audit.record(db, "device.revoke", actor=f"operator:{operator.username}", target=name,
                         address=client_address(request))
    except UnknownDeviceError as exc:
        return render(request, "message.html", operator, status=404, title="No such device", message=str(exc))
    return RedirectResponse(local_path(next, f"/devices/{name}"), status_code=303)


@router.get("/schedules")
def schedules_page(request: Request, operator: PageOperator) -> Response:
    """Every stored schedule, and the schedule requests that have none (yet)."""
    db = server_state(request).db
    return render(request, "schedules.html", operator, page="schedules", rows=views.schedule_rows(db),
                  requests=views.open_solve_requests(db))


@router.get("/rounds")
def rounds_page(request: Request, operator: PageOperator, run: Annotated[str, Query(max_length=20)] = "") -> Response:
    """Federated rounds: a row per device per round of one run (the newest unless ``run`` names another)."""
    view = views.rounds_view(server_state(request).db, int(run) if run.isdigit() else None)
    return render(request, "rounds.html", operator, page="rounds", view=view, columns=views.ROUND_COLUMNS)


@router.post("/schedule-requests/{request_id}/cancel")
def cancel_solve(request: Request, request_id: str, operator: AdminOperator, csrf_token: FormText = "") -> Response:
    """Cancel a queued or solving schedule request (a running solve's planner process is stopped)."""
    csrf.check_form(request, operator.csrf_token, csrf_token)
    state = server_state(request)
    try:
        solve_requests.cancel(state.db, request_id, time.time(), reason=f"operator {operator.username}")
    except UnknownSolveRequestError as exc:
        return render(request, "message.html", operator, status=404, title="No such request", message=str(exc))
    except SolveCancelRefusedError as exc:
        return render(request, "message.html", operator, status=409, title="Not cancelled", message=str(exc))
    state.solves.wake()
    audit.record(state.db, "solve.cancel", actor=f"operator:{operator.username}", target=f"request {request_id}",
                 address=client_address(request))
    return RedirectResponse("/schedules", status_code=303)


@router.get("/schedules/{schedule_id}/timeline.svg")
def schedule_timeline(request: Request, schedule_id: str, operator: PageOperator) -> Response:
    """The schedule's stage x node timeline picture (SVG), drawn once per schedule."""
    found = views.graph_for(server_state(request).db, schedule_id) if SCHEDULE_ID.fullmatch(schedule_id) else None
    picture = dashboard_state(request).timelines.get(schedule_id, *found) if found else None
    if picture is None:
        return Response("no timeline for this schedule", status_code=404, media_type="text/plain")
    return Response(picture, media_type="image/svg+xml",
                    headers={"Content-Security-Policy": TIMELINE_POLICY, "Cache-Control": "private, max-age=86400"})


@router.get("/tokens")
def tokens_page(request: Request, operator: PageOperator) -> Response:
    """Enrolment tokens (never the tokens themselves) and the devices, each with a revoke button."""
    return _tokens(request, operator)


@router.post("/tokens")
def create_token(request: Request, operator: AdminOperator, csrf_token: FormText = "",
                 lifetime: FormText = "24h") -> Response:
    """Make an enrolment token and show it, this once."""
    csrf.check_form(request, operator.csrf_token, csrf_token)
    seconds = TOKEN_LIFETIMES.get(lifetime, TOKEN_LIFETIMES["24h"])
    now = time.time()
    db = server_state(request).db
    token, token_id = devices.create_enrolment_token(db, seconds, now)
    audit.record(db, "token.create", actor=f"operator:{operator.username}", target=f"token {token_id}",
                 detail=f"valid for {lifetime}", address=client_address(request))
    return _tokens(request, operator, new_token=token, new_token_expires=now + seconds, status=201)


@router.post("/tokens/{token_id}/revoke")
def revoke_token(request: Request, token_id: int, operator: AdminOperator, csrf_token: FormText = "") -> Response:
    """Revoke an unused enrolment token: no device can enrol with it."""
    csrf.check_form(request, operator.csrf_token, csrf_token)
    db = server_state(request).db
    try:
        if devices.revoke_enrolment_token(db, token_id, time.time()):
            audit.record(db, "token.revoke", actor=f"operator:{operator.username}", target=f"token {token_id}",
                         address=client_address(request))
    except UnknownTokenError as exc:
        return render(request, "message.html", operator, status=404, title="No such token", message=str(exc))
    return RedirectResponse("/tokens", status_code=303)


@router.get("/audit")
def audit_page(request: Request, operator: PageOperator) -> Response:
    """The audit log, newest first, a page at a time, filtered by actor, action and time
    (:mod:`server.dashboard.audit_view`)."""
    query, notes = audit_view.read_query(request.query_params)
    found = audit.search(server_state(request).db, query)
    older = audit_view.older_link(request.query_params, found.older) if found.older is not None else None
    return render(request, "audit.html", operator, page="audit", entries=found.entries, query=query, notes=notes,
                  actions=audit.ACTIONS, older=older, params=request.query_params)


def _tokens(request: Request, operator: Any, status: int = 200, **shown: Any) -> Response:
    server = server_state(request)
    now = time.time()
    return render(request, "tokens.html", operator, page="tokens", status=status, lifetimes=TOKEN_LIFETIMES,
                  tokens=views.token_rows(server.db, now),
                  devices=views.newest_devices(server.db, now, server.settings.online_seconds), **shown)
