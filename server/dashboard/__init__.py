"""The operator dashboard: server-rendered pages in the same process as the device API.

::

    GET  /login, POST /login, POST /logout      sign in with a password (:mod:`.login`)
    GET  /                                       the fleet table, refreshed live by /static/dashboard.js
    GET  /dashboard/fleet.json                   its rows (session-authenticated)
    GET  /devices/{name}                         a device's figures and charts; POST .../revoke
    GET  /schedules                              stored schedules; .../{id}/timeline.svg their timelines
    GET  /tokens, POST /tokens                   enrolment tokens, made here and shown once
    GET  /static/...                             the stylesheet and the script (nothing from elsewhere)

Modules: :mod:`.routes` (:func:`~server.dashboard.routes.install_dashboard`
adds all of it to an app), :mod:`.operators` (accounts, argon2),
:mod:`.sessions`, :mod:`.auth` (cookie and the routes' dependencies),
:mod:`.csrf`, :mod:`.headers` (Content-Security-Policy and friends),
:mod:`.views` and :mod:`.display` (what a page shows), :mod:`.charts` and
:mod:`.device_charts` (SVG), :mod:`.timeline`, :mod:`.login` and :mod:`.pages`
(the routes), :mod:`.errors`.  Operators are made on the command line:
``poet-edge server operator add NAME``.

Importing this package loads nothing else (``install_dashboard`` is loaded
when first used), so the operator commands stay cheap and :mod:`server.api`
can import :mod:`.routes` without a cycle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install_dashboard"]


def __getattr__(name: str) -> Any:
    if name == "install_dashboard":
        from server.dashboard.routes import install_dashboard

        return install_dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
