"""The ledger of a step: resident activation bytes after every instruction, against the prediction.

The executor records the bytes its store really holds after each instruction
(storages owned by resident values, see :mod:`engine.store`) next to what the
simulator predicts from the graph's node bytes.  The two agree exactly when
the graph describes the model; the ledger going over the schedule's budget
stops the step (:class:`~engine.errors.LedgerError`).  Prefetch buffers being
filled in the background are counted apart (``inflight``) so that the ledger
stays comparable with the simulator while ``peak_with_inflight_bytes`` shows
everything the executor held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from engine.energy.account import StepEnergy
from engine.errors import LedgerError


@dataclass(frozen=True)
class StepStats:
    """What one executed step measured.

    ``ledger[k]`` and ``predicted[k]`` are the measured and simulated resident
    activation bytes after instruction ``k``.  ``peak_rss_bytes`` and
    ``rss_before_bytes`` are the process's peak and starting resident set
    (``None`` when not measured); ``io_seconds`` is time spent by the I/O
    thread (``io_out_seconds`` writing, ``io_in_seconds`` reading),
    ``io_wait_seconds`` time the step waited for it; ``reads_into_kept``
    counts the page-ins that filled memory already mapped: kept from an
    earlier page-in or from a value just freed (:mod:`schedules.timeline`), and
    ``bytes_read_into_kept`` / ``io_in_kept_seconds`` are their part of
    ``bytes_paged_in`` / ``io_in_seconds`` (the rest filled fresh memory, which
    the kernel zeroes as it maps it in).  Per-node times
    are summed over recomputations; ``node_io_seconds`` is paging time per node.
    ``energy`` is the step's energy, total and per node class, when the
    executor was given a meter (``None`` otherwise); ``dataclasses.asdict``
    turns it into the same plain dict as :meth:`StepEnergy.to_dict`.
    """

    ledger: tuple[int, ...]
    predicted: tuple[int, ...]
    budget: int | None
    peak_with_inflight_bytes: int
    step_seconds: float
    node_seconds: tuple[float, ...]
    node_io_seconds: tuple[float, ...] = ()
    bytes_paged_out: int = 0
    bytes_paged_in: int = 0
    io_seconds: float = 0.0
    io_out_seconds: float = 0.0
    io_in_seconds: float = 0.0
    io_wait_seconds: float = 0.0
    reads_into_kept: int = 0
    bytes_read_into_kept: int = 0
    io_in_kept_seconds: float = 0.0
    rss_before_bytes: int | None = None
    peak_rss_bytes: int | None = None
    energy: StepEnergy | None = None

    @property
    def ledger_peak_bytes(self) -> int:
        """Most activation bytes resident after any instruction."""
        return max(self.ledger, default=0)

    @property
    def bytes_paged(self) -> int:
        """Bytes written plus bytes read back."""
        return self.bytes_paged_out + self.bytes_paged_in

    @property
    def pageout_bandwidth_bps(self) -> float | None:
        """Bytes per second the I/O thread achieved writing pages (``None`` without page-outs)."""
        return self.bytes_paged_out / self.io_out_seconds if self.io_out_seconds > 0 else None

    @property
    def pagein_bandwidth_bps(self) -> float | None:
        """Bytes per second the I/O thread achieved reading pages (``None`` without page-ins)."""
        return self.bytes_paged_in / self.io_in_seconds if self.io_in_seconds > 0 else None

    @property
    def max_ledger_deviation(self) -> int:
        """Largest ``|measured - predicted|`` over the step's instructions (0 when the graph is exact)."""
        return max((abs(a - b) for a, b in zip(self.ledger, self.predicted)), default=0)

    @property
    def peak_rss_growth_bytes(self) -> int | None:
        """Peak resident set above the step's start: what the step itself cost in RAM."""
        if self.peak_rss_bytes is None or self.rss_before_bytes is None:
            return None
        return self.peak_rss_bytes - self.rss_before_bytes


@dataclass
class Ledger:
    """Collects resident bytes per instruction and enforces the budget."""

    predicted: Sequence[int]
    budget: int | None
    limits: Sequence[int] | None = None  # per instruction: what a whole-step budget leaves the activations
    entries: list[int] = field(default_factory=list)
    peak_with_inflight: int = 0

    def record(self, position: int, resident: int, inflight: int = 0) -> None:
        """Note the bytes after instruction ``position``; refuse to go on past the budget."""
        self.entries.append(resident)
        self.peak_with_inflight = max(self.peak_with_inflight, resident + inflight)
        limit = self.limits[position] if self.limits is not None else self.budget
        if limit is not None and resident > limit:
            beside = "" if self.limits is None else f" (what the budget of {self.budget} leaves the activations there)"
            raise LedgerError(
                f"after instruction {position} the step holds {resident} activation bytes, over {limit}{beside} "
                f"(the simulator predicted {self.predicted[position]}): the graph does not "
                "describe this model; re-extract it and re-plan")
