"""Exceptions raised by the agent: a branch of POET Edge's one tree (:mod:`schedules.errors`).

The whole tree, every package's branch with each class's exit code, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

The engine's errors (a step, a page, an extraction) are :mod:`engine.errors`'.
OS errors are converted where they enter (``raise ConfigError(...) from exc``).
"""

from __future__ import annotations

from common.errors import PoetEdgeError
from common.exit_codes import ExitCode


class AgentError(PoetEdgeError):
    """Base class of every error raised by ``agent``."""


class ZooError(AgentError):
    """A model name, module path or input shape that cannot be built; the message says what to pass."""


class DataError(AgentError):
    """The local data set cannot be used as a whole; the message names the file and what to fix.

    A missing path, an unknown format, no usable samples, fewer samples than one batch.  A single bad
    sample is skipped and counted instead (:mod:`agent.data`).
    """

    exit_code = ExitCode.BAD_FILE


class WeightsError(AgentError):
    """Pretrained weights (``[workload] weights``) that cannot be read, or are not for the configured model;
    the message names the file and the tensors that differ."""

    exit_code = ExitCode.BAD_FILE


class ConfigError(AgentError):
    """The agent's config file is missing, not TOML, or has values the agent cannot use; lists every problem."""

    exit_code = ExitCode.BAD_FILE


class PersonalModelError(AgentError):
    """No personalized model is kept in the state directory, or its weights do not match their provenance."""

    exit_code = ExitCode.BAD_FILE


class CheckpointError(AgentError):
    """A checkpoint cannot be written (disk full, read-only) or none of the kept ones can be read."""

    exit_code = ExitCode.STORAGE


class FederationError(AgentError):
    """A federated round cannot run on this device: unknown setting, no schedule fits its budget, bad weights."""


class SuperNodeKeyError(AgentError):
    """The SuperNode's authentication key (``[flower] auth_key``) cannot be read, or made in the state directory."""

    exit_code = ExitCode.STORAGE


class FleetError(AgentError):
    """The fleet server refused a request; ``status`` is its HTTP status when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class FleetUnavailableError(FleetError):
    """The fleet server cannot be used now (connection, timeout, 5xx, 429); ``retry_after`` in seconds if said.

    The agent then trains on its cached schedule or solves locally, and its heartbeats wait on disk.
    """

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class FleetAuthError(FleetError):
    """This device has no token the fleet server accepts: enrolment refused, name taken, or revoked."""

    exit_code = ExitCode.REJECTED

