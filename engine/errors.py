"""Exceptions raised by the engine: a branch of POET Edge's one tree (:mod:`common.errors`).

The whole tree, every package's branch with each class's exit code, is drawn once in
``docs/architecture.md`` ("Errors and exit codes"), generated from the classes and checked by
``tests/test_errors.py``.

Every executor error raised during :meth:`engine.executor.Executor.step` leaves
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


class EngineError(PoetEdgeError):
    """Base class of every error raised by ``engine``."""


class ExtractionError(EngineError):
    """The model cannot be cut or traced as asked; the message names the module and what to do."""

    exit_code = ExitCode.UNSUPPORTED_MODEL


class ProfileError(EngineError):
    """The swap path cannot be measured as asked (the swap directory is missing, unwritable or unreadable)."""

    exit_code = ExitCode.STORAGE


class ExecutorError(EngineError):
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


class MemoryBoundError(EngineError):
    """A training step's memory went over what its schedule planned; ``part`` names what went over
    (``activations``, ``gradients``, ``optimizer state``, or ``other``: memory outside those three)."""

    exit_code = ExitCode.REJECTED

    def __init__(self, message: str, part: str = "", report: object = None) -> None:
        super().__init__(message)
        self.part = part
        self.report = report  # the step's measurements (engine.training.StepReport): the step was applied


class OptimizerError(ExecutorError):
    """An optimizer cannot run its updates in the backward pass as configured (kind, flags, parameters)."""


class UpdateInterrupted(ExecutorError):
    """A step failed after it began updating parameters: the model is between two steps.

    The training restores the last checkpoint (:mod:`engine.training`); nothing half-updated is saved.
    """

