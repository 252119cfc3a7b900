"""DeviceProfile: built-ins, the file format, and pricing graphs with a profile."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from schedules.device import DEVICE_FORMAT, DeviceProfile, paging_time_ms, price_graph
from schedules.errors import FormatError, PlannerError, UnknownNameError, UnsupportedVersionError
from schedules.graph import Node, TrainingGraph

PAPER_PLATFORMS = ("mkr1000", "nrf52840", "rpi4", "jetson-tx2")
CURRENT_BOARDS = ("rpi5", "jetson-orin-nano")


def round_profile(**changes: object) -> DeviceProfile:
    """A profile with round figures, so energies can be checked by hand."""
    base = DeviceProfile(
        name="round", compute_power_w=2.0, idle_power_w=1.0, memory_power_w=0.5,
        pagein_bandwidth_bps=1e6, pageout_bandwidth_bps=5e5, pagein_latency_s=1e-3, pageout_latency_s=2e-3,
        paging_overlaps_compute=False, ram_bytes=1 << 20, flops_per_s=1e9, source="test",
    )
    return replace(base, **changes)


def tiny_graph(**energies: float | None) -> TrainingGraph:
    """forward (1000 B, 10 ms) -> loss (200 B, 4 ms) -> backward (1000 B, 20 ms)."""
    nodes = (
        Node("f0", "forward", "a", 10.0, 1000, **energies),
        Node("l1", "loss", "loss", 4.0, 200),
        Node("b2", "backward", "a", 20.0, 1000),
    )
    return TrainingGraph(nodes=nodes, edges=((0, 1), (1, 2), (0, 2)))


def profile_file(tmp_path: Path, **changes: object) -> Path:
    """The rpi4 profile's JSON with ``changes`` applied (``None`` removes a key)."""
    data = DeviceProfile.builtin("rpi4").to_dict()
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "device.json"
    path.write_text(json.dumps(data))
    return path


def unpriced_in_ms(path: Path) -> TrainingGraph:
    """A reference graph without energies, its times in milliseconds.

    The reference's ``cost_cpu_ms`` holds seconds (FLOPs / FLOPS, see the device
    module docstring); read the raw column so this holds whatever the loader does.
    """
    seconds = json.loads(path.read_text())["cost_cpu_ms"]
    graph = TrainingGraph.load(path)
    return graph.with_nodes(
        replace(n, compute_ms=s * 1000.0, compute_j=None, pagein_j=None, pageout_j=None)
        for n, s in zip(graph.nodes, seconds)
    )


def relative_error(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


# -- built-ins -----------------------------------------------------------------
def test_builtin_names_cover_the_paper_platforms_and_current_boards() -> None:
    names = DeviceProfile.builtin_names()
    assert set(PAPER_PLATFORMS + CURRENT_BOARDS) <= set(names)
    assert list(names) == sorted(names)


@pytest.mark.parametrize("name", DeviceProfile.builtin_names())
def test_every_builtin_is_a_data_file_that_says_where_each_figure_came_from(name: str) -> None:
    profile = DeviceProfile.load(resources.files("schedules") / "devices" / f"{name}.json")
    assert profile == DeviceProfile.builtin(name)
    figures = {"compute_power_w", "idle_power_w", "memory_power_w", "pagein_bandwidth_bps", "pageout_bandwidth_bps",
               "pagein_latency_s", "pageout_latency_s", "paging_overlaps_compute", "ram_bytes", "flops_per_s"}
    assert figures <= set(profile.sources)


def test_sources_name_only_real_fields() -> None:
    data = DeviceProfile.builtin("rpi4").to_dict()
    data["sources"] = {"compute_pwoer_w": "a typo"}
    with pytest.raises(FormatError, match="compute_pwoer_w"):
        DeviceProfile.from_dict(data)


@pytest.mark.parametrize("name", DeviceProfile.builtin_names())
def test_every_builtin_round_trips_through_json(name: str, tmp_path: Path) -> None:
    profile = DeviceProfile.builtin(name)
    assert profile.name == name and profile.source.startswith("builtin:")
    assert DeviceProfile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile
    profile.save(tmp_path / f"{name}.json")
    assert DeviceProfile.load(tmp_path / f"{name}.json") == profile


def test_saved_profile_carries_format_and_version(tmp_path: Path) -> None:
    DeviceProfile.builtin("rpi5").save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["format"] == DEVICE_FORMAT and data["version"] == 1


def test_builtin_lookup_ignores_case_and_spaces() -> None:
    assert DeviceProfile.builtin(" RPi4 ") is DeviceProfile.builtin("rpi4")


def test_unknown_builtin_lists_the_valid_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        DeviceProfile.builtin("rpi3")
    for name in DeviceProfile.builtin_names():
        assert name in str(err.value)


def test_paper_platform_figures_are_the_reference_constants() -> None:
    rpi4, m4 = DeviceProfile.builtin("rpi4"), DeviceProfile.builtin("nrf52840")
    assert (rpi4.compute_power_w, rpi4.memory_power_w) == (3.0, 0.15)
    assert (rpi4.pagein_bandwidth_bps, rpi4.pageout_bandwidth_bps) == (45.5e6, 24.5e6)
    assert m4.compute_power_w == pytest.approx(3.328e-3 * 3.3)
    assert DeviceProfile.builtin("jetson-tx2").compute_power_w == pytest.approx(0.766)


# -- malformed files -----------------------------------------------------------
@pytest.mark.parametrize("changes, fragment", [
    ({"pagein_bandwidth_bps": -1.0}, "pagein_bandwidth_bps"),
    ({"pageout_bandwidth_bps": 0}, "pageout_bandwidth_bps"),
    ({"pagein_latency_s": -1e-3}, "pagein_latency_s"),
    ({"compute_power_w": "3 W"}, "compute_power_w"),
    ({"ram_bytes": 1.5}, "ram_bytes"),
    ({"ram_bytes": 0}, "ram_bytes"),
    ({"paging_overlaps_compute": "yes"}, "paging_overlaps_compute"),
    ({"flops_per_s": -2.0}, "flops_per_s"),
    ({"paging_hidden_fraction": 1.2}, "paging_hidden_fraction"),
    ({"paging_hidden_fraction": "most"}, "paging_hidden_fraction"),
    ({"name": ""}, "name"),
    ({"update_costs": {"sgd:1:0": [1e-5]}}, "update_costs"),
    ({"update_costs": {"sgd:1:0": [1e-5, -1e-9]}}, "update_costs"),
    ({"update_costs": [1e-5, 1e-9]}, "update_costs"),
    ({"memory_power_w": None}, "missing field(s) memory_power_w"),
    ({"pagein_bandwith_bps": 1e6}, "unknown field(s) pagein_bandwith_bps"),
    ({"format": "poet-edge/training-graph"}, "not a device profile"),
])
def test_malformed_profile_files_are_rejected(tmp_path: Path, changes: dict, fragment: str) -> None:
    with pytest.raises(FormatError, match="device.json") as err:
        DeviceProfile.load(profile_file(tmp_path, **changes))
    assert fragment in str(err.value)


def test_the_exposed_share_of_paging_follows_the_measured_hidden_fraction(tmp_path: Path) -> None:
    overlapping = replace(round_profile(), paging_overlaps_compute=True)
    assert overlapping.paging_hidden_fraction is None and overlapping.exposed_paging_fraction == 0.0
    measured = replace(overlapping, paging_hidden_fraction=0.8)
    assert measured.exposed_paging_fraction == pytest.approx(0.2)
    assert replace(measured, paging_overlaps_compute=False).exposed_paging_fraction == 1.0
    measured.save(tmp_path / "d.json")
    assert DeviceProfile.load(tmp_path / "d.json") == measured
    old = json.loads((tmp_path / "d.json").read_text())
    del old["paging_hidden_fraction"]  # profiles written before the field existed still load
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert DeviceProfile.load(tmp_path / "old.json").paging_hidden_fraction is None


def test_measured_update_costs_round_trip_and_price_an_update(tmp_path: Path) -> None:
    plain = round_profile()
    assert "update_costs" not in plain.to_dict()  # only where measured: built-in files stay as they are
    assert plain.update_seconds("sgd:1:0", 10, 1000) is None
    measured = replace(plain, update_costs={"sgd:1:0": (2e-5, 1e-10)})
    measured.save(tmp_path / "d.json")
    assert DeviceProfile.load(tmp_path / "d.json") == measured
    assert measured.update_seconds("sgd:1:0", 10, 10**6) == pytest.approx(10 * 2e-5 + 1e-4)
    assert measured.update_seconds("adamw:2:2", 10, 10**6) is None


def test_unknown_version_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedVersionError, match="version 2"):
        DeviceProfile.load(profile_file(tmp_path, version=2))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": "poet-edge/device-profile", "x": NaN}'])
def test_files_that_are_not_json_objects_are_rejected(tmp_path: Path, text: str) -> None:
    (tmp_path / "device.json").write_text(text)
    with pytest.raises(FormatError):
        DeviceProfile.load(tmp_path / "device.json")


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read"):
        DeviceProfile.load(tmp_path / "absent.json")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = profile_file(tmp_path, pagein_bandwidth_bps=-1.0, idle_power_w=-2.0, ram_bytes=-5)
    with pytest.raises(FormatError) as err:
        DeviceProfile.load(path)
    for field in ("pagein_bandwidth_bps", "idle_power_w", "ram_bytes"):
        assert field in str(err.value)


def test_integral_float_ram_is_accepted(tmp_path: Path) -> None:
    assert DeviceProfile.load(profile_file(tmp_path, ram_bytes=4e9)).ram_bytes == 4_000_000_000


def test_constructor_validates_too() -> None:
    with pytest.raises(FormatError, match="pageout_bandwidth_bps"):
        round_profile(pageout_bandwidth_bps=-5.0)
    with pytest.raises(FormatError, match="ram_bytes"):
        DeviceProfile.builtin("rpi4").with_ram(0)


# -- helpers -------------------------------------------------------------------
def test_with_ram_returns_a_copy() -> None:
    rpi4 = DeviceProfile.builtin("rpi4")
    bigger = rpi4.with_ram(8 << 30)
    assert bigger.ram_bytes == 8 << 30 and rpi4.ram_bytes == 4 << 30
    assert replace(bigger, ram_bytes=rpi4.ram_bytes) == rpi4


def test_flops_turn_into_milliseconds() -> None:
    assert round_profile().compute_ms_for_flops(2e9) == pytest.approx(2000.0)
    with pytest.raises(PlannerError, match="flops_per_s"):
        DeviceProfile.builtin("jetson-tx2").compute_ms_for_flops(1e6)


# -- pricing -------------------------------------------------------------------
def test_price_graph_matches_hand_computation() -> None:
    priced = price_graph(tiny_graph(), round_profile())
    f0, l1, b2 = priced.nodes
    # compute: 10 ms * 2 W; page-in: (1 ms + 1000 B / 1 MB/s) * 0.5 W; page-out: (2 ms + 1000 B / 0.5 MB/s) * 0.5 W
    assert (f0.compute_j, f0.pagein_j, f0.pageout_j) == pytest.approx((0.020, 0.001, 0.002))
    assert (l1.compute_j, l1.pagein_j, l1.pageout_j) == pytest.approx((0.008, 0.0006, 0.0012))
    assert b2.compute_j == pytest.approx(0.040)
    assert priced.has_energy and priced.edges == tiny_graph().edges


def test_paging_time_is_latency_plus_transfer() -> None:
    pagein, pageout = paging_time_ms(tiny_graph(), round_profile())
    assert pagein == pytest.approx([2.0, 1.2, 2.0])
    assert pageout == pytest.approx([4.0, 2.4, 4.0])


def test_energies_present_are_kept_unless_overwrite() -> None:
    graph = tiny_graph(compute_j=7.0, pagein_j=None, pageout_j=9.0)
    kept = price_graph(graph, round_profile()).nodes[0]
    assert (kept.compute_j, kept.pagein_j, kept.pageout_j) == pytest.approx((7.0, 0.001, 9.0))
    replaced = price_graph(graph, round_profile(), overwrite=True).nodes[0]
    assert (replaced.compute_j, replaced.pageout_j) == pytest.approx((0.020, 0.002))


def test_reference_graph_energies_are_used_as_they_are(poet_graphs: Path) -> None:
    graph = TrainingGraph.load(poet_graphs / "resnet18_cifar_a72.json")
    assert graph.has_energy
    assert price_graph(graph, DeviceProfile.builtin("rpi4")) == graph


def test_rpi4_reproduces_the_a72_graphs_paging_and_scales_compute(poet_graphs: Path) -> None:
    """How the reference's own energies relate to the rpi4 profile (see the device module docstring)."""
    reference = TrainingGraph.load(poet_graphs / "resnet18_cifar_a72.json")
    priced = price_graph(unpriced_in_ms(poet_graphs / "resnet18_cifar_a72.json"), DeviceProfile.builtin("rpi4"))
    for ours, theirs in zip(priced.nodes, reference.nodes):
        assert relative_error(ours.pagein_j, theirs.pagein_j) < 1e-9
        assert relative_error(ours.pageout_j, theirs.pageout_j) < 1e-9
        if theirs.compute_j > 0:
            # 2 GFLOPS / 120.34 MFLOPS: the reference charges 49.86 W per compute-second, rpi4 3 W.
            assert theirs.compute_j / ours.compute_j == pytest.approx(2e9 / ((16283 * 100 * 1000) / 13.53))


def test_nrf52840_reproduces_the_m4_graph_exactly(poet_graphs: Path) -> None:
    reference = TrainingGraph.load(poet_graphs / "vgg16_cifar_m4.json")
    priced = price_graph(unpriced_in_ms(poet_graphs / "vgg16_cifar_m4.json"), DeviceProfile.builtin("nrf52840"))
    for ours, theirs in zip(priced.nodes, reference.nodes):
        assert ours.compute_j == pytest.approx(theirs.compute_j, rel=1e-9, abs=1e-15)
        assert relative_error(ours.pagein_j, theirs.pagein_j) < 1e-9
        assert relative_error(ours.pageout_j, theirs.pageout_j) < 1e-9
