"""The root of POET Edge's one error tree, and the bottom package's own errors.

:class:`PoetEdgeError` is the root every package's branch hangs from, each class with the exit code a command
ends with (:class:`common.exit_codes.ExitCode`); :class:`CommandError` fails a subcommand with the code it
names.  The whole tree is drawn once in ``docs/architecture.md`` ("Errors and exit codes"), generated from
the classes and checked by ``tests/test_errors.py``.  :class:`RunConfigError` derives from the standard
library's ``ValueError``: each package converts it into its own branch where it enters (``raise X from exc``).
"""

from __future__ import annotations

from typing import ClassVar

from common.exit_codes import ExitCode


class PoetEdgeError(Exception):
    """Root of every error POET Edge raises; ``exit_code`` is the status a command exits with."""

    exit_code: ClassVar[ExitCode] = ExitCode.USAGE


class CommandError(PoetEdgeError):
    """Fail a ``poet-edge`` subcommand with ``message`` on standard error and ``exit_code``."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # per instance: the command says which


class FormatError(PoetEdgeError):
    """A file or JSON document is malformed: a graph, device profile, schedule, or anything read as JSON."""

    exit_code = ExitCode.BAD_FILE


class RunConfigError(ValueError):
    """A run config key is unknown, of the wrong type, or out of range; the message names every problem."""
