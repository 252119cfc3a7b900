"""Errors of the bottom package.  They derive from the standard library's own (it imports nothing of ours);
each package that reads them converts them into its own tree where they enter (``raise X from exc``)."""

from __future__ import annotations


class RunConfigError(ValueError):
    """A run config key is unknown, of the wrong type, or out of range; the message names every problem."""
