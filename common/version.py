"""The installed release of POET Edge, as the agent's heartbeats and the server's /metrics report it."""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def software_version() -> str:
    """The installed poet-edge release ("unknown" when running from a tree that is not installed)."""
    try:
        return metadata.version("poet-edge")
    except metadata.PackageNotFoundError:
        return "unknown"
