"""``DashboardState``: what the dashboard keeps per server process beside :class:`server.api.state.ServerState`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request
from jinja2 import Environment, FileSystemLoader, select_autoescape

from server.dashboard.timeline import TimelineCache
from server.ratelimit import RateLimiter

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
LOGIN_FAILURES_PER_MINUTE = 10  # per address and account
ACCOUNT_FAILURES_PER_MINUTE = 30  # per account, from every address
ADDRESS_FAILURES_PER_MINUTE = 30  # per address, whatever the names: 150 names from one address are no typos


def template_environment() -> Environment:
    """Jinja with autoescaping on for every template: whatever a device reports is shown as text."""
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True,
                                                                                        default_for_string=True),
                       trim_blocks=True, lstrip_blocks=True)


@dataclass
class DashboardState:
    """Templates, the login rate limiter (failed logins per address) and the timeline pictures."""

    templates: Environment = field(default_factory=template_environment)
    login_failures: RateLimiter = field(default_factory=lambda: RateLimiter(LOGIN_FAILURES_PER_MINUTE))
    account_failures: RateLimiter = field(default_factory=lambda: RateLimiter(ACCOUNT_FAILURES_PER_MINUTE))
    address_failures: RateLimiter = field(default_factory=lambda: RateLimiter(ADDRESS_FAILURES_PER_MINUTE))
    timelines: TimelineCache = field(default_factory=TimelineCache)


def dashboard_state(request: Request) -> DashboardState:
    """The dashboard state of the app serving ``request``."""
    return request.app.state.dashboard
