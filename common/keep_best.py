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

Twenty samples cannot tell apart a device whose models differ by a few points, and one device in 18 whose
selection half favoured the global model by two samples while its test half favoured training alone by 20-25
points cost a seed's mean 4 points at label skew 1.  So a fleet chooses together: each device reports its
selection half's accuracies and losses, the server pools them (:func:`fleet_choice`: the baseline unless another
candidate is ahead on the devices' selection halves with 95% confidence, in accuracy or in a lower loss at no
less accuracy) and sends the fleet's choice back, and every device keeps that candidate (:func:`choose` with
``fleet``).  The device's own rule is what it keeps until the fleet's choice arrives, and where it never does
(the server gone, the device offline).

Pure and torch-free: the device's ClientApp (:mod:`agent.federated.clientapp`) chooses with it, the ServerApp
(:mod:`server.federated.serverapp`) pools with it, and ``poet-edge simulate``'s report applies the same rules
when it adds a local-only model trained in another run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    by: str = "device"  # who chose: "device" (its own selection half) or "fleet" (every device's, pooled)

    @property
    def kept_accuracy(self) -> float:
        """The kept model's accuracy on the test half."""
        return self.test[self.kept]

    def margin_over(self, other: str) -> float | None:
        """Kept minus ``other`` on the test half (``None`` where ``other`` is not a candidate)."""
        return self.test[self.kept] - self.test[other] if other in self.test else None


def choose(selection: Mapping[str, float], test: Mapping[str, float],
           selection_loss: Mapping[str, float] | None = None, samples: int | None = None,
           fleet: str | None = None) -> Choice:
    """The candidate kept on ``selection`` (name -> accuracy on the selection half's ``samples`` samples; a
    negative accuracy is unknown and never kept unless every one is), with ``test`` beside it (module docstring).

    The best candidate is the most accurate; equal accuracies, common on a few dozen samples where two models
    are both good, are told apart by ``selection_loss`` (the held-out loss on the same half: a model right with
    more confidence), and only then by :data:`CANDIDATES` order.  With ``samples``, the best replaces the
    device's baseline only when right on :data:`SWITCH_SAMPLES` more of them; without, the best is kept.  With
    ``fleet`` (the fleet's pooled choice, :func:`fleet_choice`), that candidate is kept where the device has it."""
    names = [c for c in CANDIDATES if c in selection and c in test]
    if not names:
        raise ValueError(f"no candidate to choose from: give accuracies of {', '.join(CANDIDATES)}")
    losses = selection_loss or {}
    figures = ({c: float(selection[c]) for c in names}, {c: float(test[c]) for c in names},
               {c: float(losses[c]) for c in names if c in losses})
    if fleet in names and selection[fleet] >= 0:
        return Choice(fleet, *figures, by="fleet")
    kept = max(names, key=lambda c: (selection[c], -losses.get(c, 0.0), -names.index(c)))
    baseline = "local" if "local" in names else "global" if "global" in names else kept
    if samples and kept != baseline and selection[baseline] >= 0:
        if (selection[kept] - selection[baseline]) * samples < SWITCH_SAMPLES - 1e-6:
            kept = baseline
    return Choice(kept, *figures)


def fleet_choice(devices: Iterable[tuple[Mapping[str, float], int]],
                 losses: Iterable[Mapping[str, float]] = ()) -> str | None:
    """The candidate every device of the fleet keeps, from each device's selection-half accuracies (``devices``:
    name -> accuracy, negative: unknown, with the half's sample count); ``None`` where no candidate is common to
    all devices (or there are none).

    Only candidates every device has count.  The fleet keeps its **baseline** (the local-only model, else the
    global one) unless another candidate is better on the devices' selection halves with 95% confidence: a
    one-sided Student's t test on the per-device differences, each device weighing the same, as each does in
    the fleet's mean accuracy (the figure an operator holds against training alone).  A candidate also passes
    where the same test finds its selection loss (``losses``, given in the same device order) lower than the
    baseline's and its mean accuracy is not below the baseline's: twenty samples' accuracy cannot see a lead
    of a few points that every device's loss shows.  Of the candidates that pass, the one with the largest
    mean difference in accuracy is kept (equal ones by the lower pooled loss, then :data:`CANDIDATES` order).
    A fleet of one device has no spread to test: it switches as :func:`choose` does, on
    :data:`SWITCH_SAMPLES` more samples."""
    devices = [(dict(accuracies), int(samples)) for accuracies, samples in devices]
    losses = [dict(loss) for loss in losses]
    common = [c for c in CANDIDATES if devices and all(c in acc and acc[c] >= 0 for acc, _ in devices)]
    if not common:
        return None
    baseline = "local" if "local" in common else "global" if "global" in common else common[0]
    ahead = {c: [acc[c] - acc[baseline] for acc, _ in devices] for c in common if c != baseline}
    better = [c for c, differences in ahead.items()
              if _confidently_positive(differences, devices[0][1]) or _surer(c, baseline, ahead[c], losses)]
    if not better:
        return baseline
    pooled_loss = {c: sum(loss.get(c, 0.0) for loss in losses) for c in better}
    return max(better, key=lambda c: (round(sum(ahead[c]), 9), -pooled_loss[c], -CANDIDATES.index(c)))


# One-sided 95% quantiles of Student's t for 1-10 degrees of freedom; past 10 the normal quantile with its first
# two Cornish-Fisher corrections (within 0.001 of the exact value).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)
_Z95 = 1.6449


def _surer(candidate: str, baseline: str, ahead: Sequence[float], losses: Sequence[Mapping[str, float]]) -> bool:
    """Whether ``candidate`` has a lower selection loss than ``baseline`` with 95% confidence on a fleet (two
    devices or more, every one reporting both) while not behind it on their accuracies (``ahead``: per device).

    The loss is the finer measure: on 20 samples accuracy moves in steps of 5 points, while the loss sees every
    sample's confidence, so a candidate right as often and surer (or righter and surer) shows it on fewer
    devices."""
    if len(ahead) < 2 or len(losses) != len(ahead) or round(sum(ahead), 9) < 0:  # level in floats is level
        return False
    if not all(candidate in loss and baseline in loss for loss in losses):
        return False
    return _confidently_positive([loss[baseline] - loss[candidate] for loss in losses], 0)


def _t95(degrees: int) -> float:
    if degrees <= len(_T95):
        return _T95[degrees - 1]
    z = _Z95
    return z + (z ** 3 + z) / (4 * degrees) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * degrees ** 2)


def _confidently_positive(differences: Sequence[float], samples: int) -> bool:
    """Whether the mean of ``differences`` (one per device) is above zero with 95% confidence; one device's
    difference is judged on its own ``samples`` (:data:`SWITCH_SAMPLES`)."""
    count = len(differences)
    centre = sum(differences) / count
    if count == 1:
        return centre * samples >= SWITCH_SAMPLES - 1e-6
    spread = (sum((d - centre) ** 2 for d in differences) / (count - 1)) ** 0.5
    if spread == 0:
        return centre > 0
    return centre / (spread / count ** 0.5) >= _t95(count - 1)


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
