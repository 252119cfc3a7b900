"""Exceptions raised by the agent: a branch of POET Edge's one tree (:mod:`schedules.errors`).

The whole tree, every package's branch with each class's exit code, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

Every executor error raised during :meth:`agent.executor.Executor.step` leaves
the model (parameters, gradients, buffers) and the RNG state as they were before
the step, so the caller can retry, re-plan or stop without losing anything --
except :class:`UpdateInterrupted`: with updates in the backward pass, a step
that fails after its first update leaves the model between two steps, and the
training restores its last checkpoint.
OS errors are converted where they enter (``raise PageError(...) from exc``).
"""

from __future__ import annotations

from common.errors import PoetEdgeError
from common.exit_codes import ExitCode


class AgentError(PoetEdgeError):
    """Base class of every error raised by ``agent``."""


class ZooError(AgentError):
    """A model name, module path or input shape that cannot be built; the message says what to pass."""


class ExtractionError(AgentError):
    """The model cannot be cut or traced as asked; the message names the module and what to do."""

    exit_code = ExitCode.UNSUPPORTED_MODEL


class ProfileError(AgentError):
    """The swap path cannot be measured as asked (the swap directory is missing, unwritable or unreadable)."""

    exit_code = ExitCode.STORAGE


class DataError(AgentError):
    """The local data set cannot be used as a whole; the message names the file and what to fix.

    A missing path, an unknown format, no usable samples, fewer samples than one batch.  A single bad
    sample is skipped and counted instead (:mod:`agent.data`).
    """

    exit_code = ExitCode.BAD_FILE


class ExecutorError(AgentError):
    """A training step cannot run as scheduled."""

    exit_code = ExitCode.REJECTED


class StepCancelled(ExecutorError):
    """A training step was cancelled between instructions; the model is as it was before the step."""

    exit_code = ExitCode.INTERRUPTED


class ScheduleRefusedError(ExecutorError):
    """The schedule was planned for another graph, or replaying it breaks its own rules or budget."""


class InputMismatchError(ExecutorError):
    """The step's inputs or targets differ in shape or dtype from the extraction's example."""


class LedgerError(ExecutorError):
    """Resident activation bytes went over the schedule's memory budget."""


class SwapSpaceError(ExecutorError):
    """The swap directory does not have room for the pages a schedule writes.

    Attributes
    ----------
    needed, available:
        Bytes the schedule's pages need and bytes the filesystem has free.
    """

    exit_code = ExitCode.STORAGE

    def __init__(self, message: str, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class PageError(ExecutorError):
    """A page could not be written to or read from the swap directory."""

    exit_code = ExitCode.STORAGE


class PageCorruptError(PageError):
    """A page file is missing, truncated, or its contents fail the checksum."""


class ConfigError(AgentError):
    """The agent's config file is missing, not TOML, or has values the agent cannot use; lists every problem."""

    exit_code = ExitCode.BAD_FILE


class PersonalModelError(AgentError):
    """No personalized model is kept in the state directory, or its weights do not match their provenance."""

    exit_code = ExitCode.BAD_FILE


class CheckpointError(AgentError):
    """A checkpoint cannot be written (disk full, read-only) or none of the kept ones can be read."""

    exit_code = ExitCode.STORAGE


class MemoryBoundError(AgentError):
    """A training step's memory went over what its schedule planned; ``part`` names what went over
    (``activations``, ``gradients``, ``optimizer state``, or ``other``: memory outside those three)."""

    exit_code = ExitCode.REJECTED

    def __init__(self, message: str, part: str = "", report: object = None) -> None:
        super().__init__(message)
        self.part = part
        self.report = report  # the step's measurements (agent.training.StepReport): the step was applied


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


class OptimizerError(ExecutorError):
    """An optimizer cannot run its updates in the backward pass as configured (kind, flags, parameters)."""


class UpdateInterrupted(ExecutorError):
    """A step failed after it began updating parameters: the model is between two steps.

    The training restores the last checkpoint (:mod:`agent.training`); nothing half-updated is saved.
    """
