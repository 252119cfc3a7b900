"""Exceptions raised by the agent.

The tree::

    AgentError                        anything the agent refuses or fails to do
    ├── EnergyMeterError              an energy meter failed (branch in agent.energy.errors)
    └── ExecutorError                 a training step cannot run as scheduled
        ├── ScheduleRefusedError      the schedule does not belong to this model/graph or breaks its budget
        ├── InputMismatchError        the step's inputs differ from the ones the graph was extracted with
        ├── LedgerError               resident bytes went over the schedule's memory budget
        ├── SwapSpaceError            the swap directory lacks room for the schedule's pages
        └── PageError                 a page could not be written or read back
            └── PageCorruptError      a page file is missing, truncated or fails its checksum

Every executor error raised during :meth:`agent.executor.Executor.step` leaves
the model (parameters, gradients, buffers) and the RNG state as they were before
the step, so the caller can retry, re-plan or stop without losing anything.
OS errors are converted where they enter (``raise PageError(...) from exc``).
"""

from __future__ import annotations


class AgentError(Exception):
    """Base class of every error raised by ``agent``."""


class ExecutorError(AgentError):
    """A training step cannot run as scheduled."""


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

    def __init__(self, message: str, needed: int, available: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.available = available


class PageError(ExecutorError):
    """A page could not be written to or read from the swap directory."""


class PageCorruptError(PageError):
    """A page file is missing, truncated, or its contents fail the checksum."""
