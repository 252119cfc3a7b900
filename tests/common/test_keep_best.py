"""The model a device keeps: the best on the half of its held-out data that chooses, reported on the other half;
and the fleet's summary of what devices kept."""

from __future__ import annotations

import pytest

from common.keep_best import CANDIDATES, choose, fleet_choice, interleaved_halves, kept_name


def test_the_best_on_the_selection_half_is_kept_and_reported_on_the_test_half() -> None:
    choice = choose({"global": 0.60, "personal": 0.75, "local": 0.70}, {"global": 0.65, "personal": 0.70,
                                                                        "local": 0.80})
    assert choice.kept == "personal"
    assert choice.kept_accuracy == 0.70  # the test half's figure, though local reads better there
    assert choice.margin_over("global") == pytest.approx(0.05) and choice.margin_over("local") == pytest.approx(-0.10)


def test_equal_accuracies_are_told_apart_by_loss_then_by_order() -> None:
    # both right on every selection sample: the one right with more confidence is kept
    assert choose({"personal": 1.0, "local": 1.0}, {"personal": 0.9, "local": 0.95},
                  {"personal": 0.30, "local": 0.10}).kept == "local"
    assert choose({"personal": 0.9, "local": 0.8}, {"personal": 0.9, "local": 0.8},
                  {"personal": 0.9, "local": 0.1}).kept == "personal"  # accuracy first


def test_ties_keep_the_earlier_candidate_and_absent_ones_are_not_candidates() -> None:
    assert choose({"personal": 0.5, "global": 0.5}, {"personal": 0.9, "global": 0.1}).kept == "global"
    assert choose({"local": 0.5, "personal": 0.5}, {"local": 0.5, "personal": 0.5}).kept == "personal"
    choice = choose({"global": 0.4, "personal": 0.3}, {"global": 0.4, "personal": 0.3})
    assert set(choice.test) == {"global", "personal"} and choice.margin_over("local") is None
    with pytest.raises(ValueError, match="no candidate"):
        choose({}, {})


def test_the_halves_interleave_and_never_share_a_sample() -> None:
    selection, test = interleaved_halves(7)
    assert list(selection) == [0, 2, 4, 6] and list(test) == [1, 3, 5]
    assert list(interleaved_halves(1)[0]) == list(interleaved_halves(1)[1]) == [0]  # too few to split


def test_a_round_rows_kept_code_names_its_candidate() -> None:
    assert [kept_name(i) for i in range(len(CANDIDATES))] == list(CANDIDATES)
    assert kept_name(-1) is None and kept_name(1.5) is None and kept_name(None) is None


def test_the_baseline_is_kept_unless_another_is_right_on_two_more_selection_samples() -> None:
    # 20 samples: personal right on one more than the device alone is noise; on two it is kept
    one_more = choose({"global": 0.60, "personal": 0.75, "local": 0.70}, {"global": 0.6, "personal": 0.7,
                                                                          "local": 0.8}, samples=20)
    assert one_more.kept == "local" and one_more.kept_accuracy == 0.8
    two_more = choose({"global": 0.60, "personal": 0.80, "local": 0.70}, {"global": 0.6, "personal": 0.7,
                                                                          "local": 0.8}, samples=20)
    assert two_more.kept == "personal"
    # without a local-only model the global one is the baseline
    assert choose({"global": 0.70, "personal": 0.75}, {"global": 0.7, "personal": 0.7}, samples=20).kept == "global"
    assert choose({"global": 0.70, "personal": 0.80}, {"global": 0.7, "personal": 0.7}, samples=20).kept == "personal"
    assert choose({"global": 0.5, "personal": 1.0}, {"global": 0.5, "personal": 1.0}, samples=2).kept == "global"


def test_the_fleet_keeps_its_baseline_unless_another_is_ahead_on_the_devices_selection_halves_with_confidence() -> None:
    def fleet(*ahead: float, samples: int = 20) -> str | None:  # personal's lead over local on each device
        return fleet_choice([({"global": 0.1, "personal": 0.5 + d, "local": 0.5}, samples) for d in ahead])

    assert fleet(0.10, 0.15, 0.05, 0.10) == "personal"  # t = 4.9 on 3 degrees of freedom, past 2.353
    assert fleet(0.10, 0.15, 0.05, -0.05) == "local"  # t = 1.5: not confident
    # ahead on the samples pooled (+5 of 60), but one device far behind: the fleet's mean is not
    assert fleet(0.20, 0.20, -0.15) == "local"
    assert fleet(0.05, 0.05, 0.05) == "personal" and fleet(0.0, 0.0) == "local"  # no spread: the sign decides
    # one device favours the global model by two of its samples; the others do not: every device keeps local
    devices = [({"global": 0.70, "personal": 0.70, "local": 0.60}, 20),
               ({"global": 0.50, "personal": 0.55, "local": 0.70}, 20),
               ({"global": 0.40, "personal": 0.50, "local": 0.60}, 20)]
    assert fleet_choice(devices) == "local"
    outlier = choose(*[devices[0][0]] * 2, samples=20, fleet="local")
    assert outlier.kept == "local" and outlier.by == "fleet"
    assert choose(*[devices[0][0]] * 2, samples=20).kept == "global"  # what it would keep on its own
    # a fleet of one has no spread: it switches on two more samples, as a device alone does
    assert fleet(0.10) == "personal" and fleet(0.05) == "local"


def test_the_fleet_also_switches_where_every_devices_loss_is_confidently_lower_at_no_less_accuracy() -> None:
    # a simulated fleet whose cameras all lie on their side (seed 0): the personalized model is right more
    # often on 3 of 6 devices and surer on all 6; accuracy alone (t = 1.4) keeps training alone
    accuracy = [(0.65, 0.85), (0.80, 0.80), (0.85, 0.80), (1.0, 1.0), (0.75, 0.80), (0.45, 0.85)]
    loss = [(1.458, 0.514), (0.880, 0.284), (0.494, 0.328), (0.072, 0.006), (1.104, 0.662), (2.136, 0.456)]
    devices = [({"global": 0.0, "personal": p, "local": a}, 20) for a, p in accuracy]
    losses = [{"global": 9.0, "personal": p, "local": a} for a, p in loss]
    assert fleet_choice(devices) == "local"
    assert fleet_choice(devices, losses) == "personal"
    # surer but behind on accuracy: never kept on its loss
    behind = [({"global": 0.0, "personal": a - 0.05, "local": a}, 20) for a, _ in accuracy]
    assert fleet_choice(behind, losses) == "local"
    # level on accuracy, as floats sum it (0.85 - 0.8 and 0.7 - 0.75 do not cancel exactly): surer passes
    level = [({"global": 0.0, "personal": p, "local": a}, 20) for a, p in [(0.8, 0.85), (0.75, 0.7)] * 3]
    assert sum(p["personal"] - p["local"] for p, _ in level) < 0
    assert fleet_choice(level, losses) == "personal"
    # surer on some devices only: not confident
    mixed = [{"global": 9.0, "personal": p if i % 2 else a + 0.5, "local": a} for i, (a, p) in enumerate(loss)]
    assert fleet_choice(devices, mixed) == "local"
    # a loss every device does not report, or a fleet of one, decides nothing
    assert fleet_choice(devices, losses[:5]) == "local"
    assert fleet_choice(devices[5:], losses[5:]) == "personal"  # one device: two samples ahead (+8 of 20)
    assert fleet_choice(devices[1:2], losses[1:2]) == "local"  # level, surer: a device alone needs samples


def test_the_fleet_pools_only_candidates_every_device_has_and_keeps_the_furthest_ahead() -> None:
    # the second device has no local-only model (or an unknown one): the global model is the baseline
    assert fleet_choice([({"global": 0.5, "personal": 0.6, "local": 1.0}, 20),
                         ({"global": 0.5, "personal": 0.6}, 20)]) == "personal"
    assert fleet_choice([({"global": 0.5, "local": 1.0}, 20), ({"global": 0.5, "local": -1.0}, 20)]) == "global"
    both = [({"global": 0.9, "personal": 0.8, "local": 0.5}, 20)] * 3  # both ahead: the one furthest ahead
    assert fleet_choice(both) == "global"
    tied = [({"global": 0.8, "personal": 0.8, "local": 0.5}, 20)] * 3
    assert fleet_choice(tied, [{"global": 0.9, "personal": 0.3, "local": 0.8}] * 3) == "personal"  # lower loss
    assert fleet_choice(tied) == "global"  # then CANDIDATES order
    assert fleet_choice([]) is None and fleet_choice([({"global": -1.0}, 20)]) is None
    # a fleet's choice this device does not have leaves it to its own rule
    own = choose({"global": 0.5, "personal": 0.9}, {"global": 0.5, "personal": 0.8}, samples=20, fleet="local")
    assert own.kept == "personal" and own.by == "device"


def test_the_t_quantiles_are_students() -> None:
    from scipy.stats import t

    from common.keep_best import _t95

    assert max(abs(_t95(df) - t.ppf(0.95, df)) for df in range(1, 500)) < 1e-3
