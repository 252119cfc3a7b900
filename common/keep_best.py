"""Which model a device keeps after personalization: the best of its candidates on data it did not train on.

A device ends a federated run holding up to three models: the final **global** model, its **personal** model
(the global one fine-tuned, or the strategy's own), and, where the run trains it, its **local**-only model (the
device alone, with the steps it spent in the run).  It chooses on the **selection** half of its held-out data
and reports every candidate's accuracy on the other, **test**, half: choosing and reporting on the same samples
would flatter the kept model by the choice itself, so the figures an operator reads are of data the choice
never saw.

The rule: the device keeps its **baseline** (the local-only model where the run trains it, else the global
one) unless another candidate is right on at least :data:`SWITCH_SAMPLES` more samples of the selection half;
then it keeps the best (highest accuracy, then lowest loss on the same half, then :data:`CANDIDATES` order).
On the 20 samples a simulated device chooses on, one sample either way is noise: keeping the best by one
sample ended 0.3-3.6 points under the baseline on average in 6 of the 10 regimes of the sweeps that chose the
margin, two samples in none; on fresh seeds two samples was ahead of one in every regime, and still under the
baseline at label skew 1 (docs/benchmarks.md, "A steadier choice").

Pure and torch-free: the device's ClientApp (:mod:`agent.federated.clientapp`) chooses with it, and
``poet-edge simulate``'s report applies the same rule when it adds a local-only model trained in another run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

CANDIDATES = ("global", "personal", "local")
SWITCH_SAMPLES = 2  # selection samples by which a candidate must beat the device's baseline to replace it


@dataclass(frozen=True)
class Choice:
    """The kept candidate and every candidate's accuracy on both halves of the held-out data."""

    kept: str
    selection: dict[str, float]  # accuracy on the half that chose
    test: dict[str, float]  # accuracy on the half that reports
    selection_loss: dict[str, float] = field(default_factory=dict)  # loss on the half that chose, where given

    @property
    def kept_accuracy(self) -> float:
        """The kept model's accuracy on the test half."""
        return self.test[self.kept]

    def margin_over(self, other: str) -> float | None:
        """Kept minus ``other`` on the test half (``None`` where ``other`` is not a candidate)."""
        return self.test[self.kept] - self.test[other] if other in self.test else None


def choose(selection: Mapping[str, float], test: Mapping[str, float],
           selection_loss: Mapping[str, float] | None = None, samples: int | None = None) -> Choice:
    """The candidate kept on ``selection`` (name -> accuracy on the selection half's ``samples`` samples; a
    negative accuracy is unknown and never kept unless every one is), with ``test`` beside it (module docstring).

    The best candidate is the most accurate; equal accuracies, common on a few dozen samples where two models
    are both good, are told apart by ``selection_loss`` (the held-out loss on the same half: a model right with
    more confidence), and only then by :data:`CANDIDATES` order.  With ``samples``, the best replaces the
    device's baseline only when right on :data:`SWITCH_SAMPLES` more of them; without, the best is kept."""
    names = [c for c in CANDIDATES if c in selection and c in test]
    if not names:
        raise ValueError(f"no candidate to choose from: give accuracies of {', '.join(CANDIDATES)}")
    losses = selection_loss or {}
    kept = max(names, key=lambda c: (selection[c], -losses.get(c, 0.0), -names.index(c)))
    baseline = "local" if "local" in names else "global" if "global" in names else kept
    if samples and kept != baseline and selection[baseline] >= 0:
        if (selection[kept] - selection[baseline]) * samples < SWITCH_SAMPLES - 1e-6:
            kept = baseline
    return Choice(kept, {c: float(selection[c]) for c in names}, {c: float(test[c]) for c in names},
                  {c: float(losses[c]) for c in names if c in losses})


def interleaved_halves(count: int) -> tuple[Sequence[int], Sequence[int]]:
    """Row indices of the selection and the test half of ``count`` held-out samples (even and odd rows, so
    both halves keep the file's mix); with fewer than two samples both halves are all of them."""
    if count < 2:
        every = range(count)
        return every, every
    return range(0, count, 2), range(1, count, 2)


def kept_name(code: float | int | None) -> str | None:
    """The candidate a round row's numeric ``kept`` metric names (``None`` where it names none)."""
    if isinstance(code, (int, float)) and 0 <= code < len(CANDIDATES) and int(code) == code:
        return CANDIDATES[int(code)]
    return None
