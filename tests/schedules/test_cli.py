"""The ``poet-edge`` command, run in-process through ``main([...])`` and once as a real process."""

import json
import subprocess
import sys
import textwrap
import time

import pytest

from schedules import DeviceProfile, Schedule, TrainingGraph, plan, simulate
from schedules.budgets import memory_lower_bound, store_all_peak
from common.cli import build_parser, main
from common.exit_codes import ExitCode
from schedules.signing import load_public_key
from tests.schedules.graphs import linear_graph, unet_graph


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "graph.json"
    linear_graph(6).save(path)
    return path


@pytest.fixture
def keys(tmp_path):
    assert main(["keys", "--dir", str(tmp_path / "keys"), "--name", "ops"]) == ExitCode.OK
    return tmp_path / "keys" / "ops.key", tmp_path / "keys" / "ops.pub"


def tight_budget(path) -> int:
    """Halfway between the least any schedule needs and plain backprop's peak: POET must work for it."""
    graph = TrainingGraph.load(path)
    return (memory_lower_bound(graph) + store_all_peak(graph)) // 2


def run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    """A user error is one clear line on stderr, never a traceback."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- solve ---------------------------------------------------------------------------
def test_solve_writes_a_loadable_schedule_within_the_budget(graph_file, tmp_path, capsys):
    budget = tight_budget(graph_file)
    out = tmp_path / "schedule.json"
    code, stdout, _ = run(["solve", graph_file, "--memory", budget, "--runtime", "1.5", "-o", out], capsys)
    assert code == ExitCode.OK
    schedule = Schedule.load(out)
    graph = TrainingGraph.load(graph_file)
    report = simulate(graph, schedule)
    assert schedule.memory_budget == budget and report.peak_bytes <= budget
    assert schedule.solver.method == "poet"
    # The summary reports what the file holds.
    assert f"{out.stat().st_size:,} bytes" in stdout
    assert f"{schedule.predicted_peak_bytes:,} B / {budget:,} B" in stdout
    for key in ("status", "objective", "solve time", "runtime", "energy"):
        assert key in stdout


def test_solve_reads_sizes_with_units(graph_file, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--memory", "0.0025MB", "-o", out], capsys)[0] == ExitCode.OK
    assert Schedule.load(out).memory_budget == 2500


def test_solve_with_a_baseline(graph_file, tmp_path, capsys):
    out = tmp_path / "s.json"
    code, stdout, _ = run(["solve", graph_file, "--baseline", "store-all", "-o", out], capsys)
    assert code == ExitCode.OK
    assert Schedule.load(out).solver.method == "store-all"


def test_solve_with_revolve_fits_a_budget_store_all_cannot(graph_file, tmp_path, capsys):
    graph = TrainingGraph.load(graph_file)
    budget = tight_budget(graph_file)
    out = tmp_path / "s.json"
    code, stdout, _ = run(["solve", graph_file, "--baseline", "revolve", "--memory", budget, "-o", out], capsys)
    assert code == ExitCode.OK
    schedule = Schedule.load(out)
    assert schedule.solver.method == "revolve" and schedule.solver.solver == "heuristic"
    report = simulate(graph, schedule)
    assert report.peak_memory_bytes <= budget < store_all_peak(graph) and report.recomputed_nodes > 0
    for command in ("solve", "pareto"):  # both list it among the methods they take
        code, out, _ = run([command, "--help"], capsys)
        assert code == ExitCode.OK and "revolve" in out


def test_signed_schedule_verifies_and_replays(graph_file, tmp_path, keys, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--memory", tight_budget(graph_file), "--sign", keys[0], "-o", out], capsys)[0] == ExitCode.OK
    Schedule.load(out, public_key=load_public_key(keys[1]))
    code, stdout, _ = run(["verify", out, "--key", keys[1], "--graph", graph_file], capsys)
    assert code == ExitCode.OK
    assert "signature   ok" in stdout and "graph       ok" in stdout and "replay      ok" in stdout


def test_infeasible_budget_exits_1_and_prints_a_feasible_budget(graph_file, tmp_path, capsys):
    graph = TrainingGraph.load(graph_file)
    too_small = memory_lower_bound(graph) - 1
    out = tmp_path / "s.json"
    code, stdout, _ = run(["solve", graph_file, "--memory", too_small, "--runtime", "1.2", "-o", out], capsys)
    assert code == ExitCode.INFEASIBLE
    assert not out.exists()
    assert "infeasible" in stdout
    suggested = int(stdout.split("try: --memory ")[1].split()[0])
    assert suggested > too_small
    assert plan(graph, memory_budget=suggested, runtime_budget=1.2).feasible


def test_smallest_budget_is_searched_for_the_method_asked(graph_file, tmp_path, capsys):
    graph = TrainingGraph.load(graph_file)
    code, stdout, _ = run(["solve", graph_file, "--baseline", "store-all", "--memory", tight_budget(graph_file),
                           "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.INFEASIBLE
    assert "smallest feasible memory budget" in stdout
    assert f"try: --memory {store_all_peak(graph)}" in stdout  # store-all fits nothing below its own peak


def test_runtime_below_one_plain_step_is_infeasible_at_any_memory(graph_file, tmp_path, capsys):
    code, stdout, _ = run(["solve", graph_file, "--memory", "1MB", "--runtime", "0.5", "-o", tmp_path / "s.json"],
                          capsys)
    assert code == ExitCode.INFEASIBLE
    assert "no memory budget helps" in stdout


def test_device_by_name_and_by_file(graph_file, tmp_path, capsys):
    profile = tmp_path / "pi.json"
    DeviceProfile.builtin("rpi4").save(profile)
    for device in ("rpi4", str(profile)):
        out = tmp_path / "s.json"
        assert run(["solve", graph_file, "--device", device, "--count-paging-time", "--runtime", "3",
                    "--memory", tight_budget(graph_file), "-o", out], capsys)[0] == ExitCode.OK
        assert Schedule.load(out).device == "rpi4"


def test_solve_says_when_slow_flash_made_it_replan_with_read_ahead_room(tmp_path, capsys):
    from dataclasses import replace

    from tests.schedules.graphs import required_bytes
    from tests.schedules.test_milp import chain_graph

    graph = chain_graph(8, seed=4)  # the graph and flash of test_plan's I/O-timeline test
    graph.save(tmp_path / "g.json")
    slow = replace(DeviceProfile.builtin("rpi4"), pagein_bandwidth_bps=3e5, pageout_bandwidth_bps=3e5)
    slow.save(tmp_path / "slow.json")
    code, stdout, _ = run(["solve", tmp_path / "g.json", "--device", tmp_path / "slow.json", "--runtime", "1.5",
                           "--memory", str(required_bytes(graph)), "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.OK and "note: planned with room to read each page ahead" in stdout
    assert not Schedule.load(tmp_path / "s.json").count_paging_time


def test_read_ahead_room_can_be_asked_for_up_front(tmp_path, capsys):
    from dataclasses import replace

    from schedules.timeline import timeline_step_ms
    from tests.schedules.graphs import required_bytes
    from tests.schedules.test_milp import chain_graph

    graph = chain_graph(8, seed=0)  # test_plan's graph whose reads outlast a node on this flash
    graph.save(tmp_path / "g.json")
    slow = replace(DeviceProfile.builtin("rpi4"), pagein_bandwidth_bps=1e5, pageout_bandwidth_bps=1e5)
    slow.save(tmp_path / "slow.json")
    argv = ["solve", tmp_path / "g.json", "--device", tmp_path / "slow.json", "--runtime", "1.5",
            "--memory", str(required_bytes(graph)), "-o", tmp_path / "s.json"]
    code, stdout, _ = run([*argv, "--read-ahead", "read"], capsys)
    assert code == ExitCode.OK and "note: planned" not in stdout  # no retries: the room asked for meets the timeline
    schedule = Schedule.load(tmp_path / "s.json")
    assert timeline_step_ms(graph, schedule, slow) <= 1.5 * graph.total_compute_ms * (1 + 1e-9)
    code, stdout, _ = run([*argv, "--read-ahead", "node"], capsys)  # too little room: replanned with more
    assert code == ExitCode.OK and "for as long as its read takes" in stdout


def test_read_ahead_by_read_time_needs_a_device(graph_file, tmp_path, capsys):
    code, _, err = run(["solve", graph_file, "--read-ahead", "read", "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "--read-ahead read", "--device")


# -- user errors: exit codes and one clear line --------------------------------------------
def test_unknown_device_is_a_usage_error(graph_file, tmp_path, capsys):
    code, _, err = run(["solve", graph_file, "--device", "pdp11", "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "pdp11", "rpi4")


def test_graph_without_energies_needs_a_device(tmp_path, capsys):
    graph = linear_graph(3)
    unpriced = graph.with_nodes(n.__class__(**{**n.__dict__, "compute_j": None}) for n in graph.nodes)
    unpriced.save(tmp_path / "g.json")
    code, _, err = run(["solve", tmp_path / "g.json", "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "no energy costs", "--device")
    assert run(["solve", tmp_path / "g.json", "--device", "rpi4", "-o", tmp_path / "s.json"], capsys)[0] == ExitCode.OK


def test_unknown_baseline_is_a_usage_error(graph_file, tmp_path, capsys):
    code, _, err = run(["solve", graph_file, "--baseline", "magic", "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "magic", "store-all")


def test_bad_size_is_a_usage_error(graph_file, capsys):
    code, _, err = run(["solve", graph_file, "--memory", "3XB"], capsys)
    assert code == ExitCode.USAGE
    assert "is not a size" in err and "Traceback" not in err


@pytest.mark.parametrize("content, fragment", [
    ("not json at all", "not valid JSON"),
    (json.dumps({"format": "poet-edge/training-graph", "version": 99, "nodes": []}), "version 99"),
    (json.dumps({"T": 2, "edges": [[1, 0]], "backward": [1], "cost_cpu_ms": [1, 1], "cost_ram_bytes": [1, 1],
                 "compute_j": [1, 1], "pagein_j": [1, 1], "pageout_j": [1, 1]}), "goes backwards"),
])
def test_bad_graph_file_exits_3_with_one_line(tmp_path, content, fragment, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, _, err = run(["solve", bad, "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.BAD_FILE
    assert_one_line_error(err, "bad.json", fragment)


def test_missing_graph_file_exits_3(tmp_path, capsys):
    code, _, err = run(["solve", tmp_path / "nope.json"], capsys)
    assert code == ExitCode.BAD_FILE
    assert_one_line_error(err, "nope.json")


def test_unwritable_output_fails_before_solving(graph_file, tmp_path, capsys):
    code, _, err = run(["solve", graph_file, "-o", tmp_path / "no" / "such" / "dir" / "s.json"], capsys)
    assert code == ExitCode.BAD_FILE
    assert_one_line_error(err, "does not exist")


def test_tampered_schedule_is_rejected(graph_file, tmp_path, keys, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--sign", keys[0], "-o", out], capsys)[0] == ExitCode.OK
    data = json.loads(out.read_text())
    data["memory_budget"] = 10**9  # a tampered budget
    out.write_text(json.dumps(data))
    code, _, err = run(["verify", out, "--key", keys[1]], capsys)
    assert code == ExitCode.REJECTED
    assert_one_line_error(err, "modified after signing")


def test_schedule_signed_by_another_key_is_rejected(graph_file, tmp_path, keys, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--sign", keys[0], "-o", out], capsys)[0] == ExitCode.OK
    assert run(["keys", "--dir", tmp_path / "other"], capsys)[0] == ExitCode.OK
    code, _, err = run(["verify", out, "--key", tmp_path / "other" / "schedule-signing.pub"], capsys)
    assert code == ExitCode.REJECTED
    assert_one_line_error(err, "not by the trusted key")


def test_schedule_for_another_graph_is_rejected(graph_file, tmp_path, keys, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--sign", keys[0], "-o", out], capsys)[0] == ExitCode.OK
    other = tmp_path / "other.json"
    unet_graph(2).save(other)
    code, _, err = run(["verify", out, "--key", keys[1], "--graph", other], capsys)
    assert code == ExitCode.REJECTED
    assert_one_line_error(err, "planned for graph")
    assert run(["plot", out, "--graph", other, "-o", tmp_path / "t.png"], capsys)[0] == ExitCode.REJECTED


def test_keys_never_overwrite(tmp_path, keys, capsys):
    before = keys[0].read_bytes()
    code, _, err = run(["keys", "--dir", keys[0].parent, "--name", "ops"], capsys)
    assert code == ExitCode.BAD_FILE
    assert_one_line_error(err, "already exists")
    assert keys[0].read_bytes() == before


@pytest.mark.parametrize("command", ["solve", "plot", "pareto", "keys", "verify", "devices"])
def test_every_subcommand_has_help(command, capsys):
    code, out, _ = run([command, "--help"], capsys)
    assert code == ExitCode.OK and "usage: poet-edge " + command in out


def test_no_subcommand_prints_help_and_exits_2(capsys):
    code, _, err = run([], capsys)
    assert code == ExitCode.USAGE and "solve" in err


def test_devices_lists_the_builtin_profiles(capsys):
    code, out, _ = run(["devices"], capsys)
    assert code == ExitCode.OK
    assert {line.split()[0] for line in out.splitlines()} == set(DeviceProfile.builtin_names())


# -- plot and pareto -----------------------------------------------------------------------
def test_plot_writes_a_png(graph_file, tmp_path, keys, capsys):
    out = tmp_path / "s.json"
    assert run(["solve", graph_file, "--memory", tight_budget(graph_file), "--sign", keys[0], "-o", out], capsys)[0] == ExitCode.OK
    png = tmp_path / "t.png"
    assert run(["plot", out, "--graph", graph_file, "--key", keys[1], "-o", png], capsys)[0] == ExitCode.OK
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_pareto_prints_a_table_and_writes_a_png(graph_file, tmp_path, capsys):
    png = tmp_path / "p.png"
    code, out, _ = run(["pareto", graph_file, "--runtime", "1.5", "--points", "3",
                        "--methods", "poet,store-all,checkpoint-all", "-o", png], capsys)
    assert code == ExitCode.OK
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = [line for line in out.splitlines() if line.strip().endswith("J") or line.strip().endswith("-")]
    assert len(rows) == 3  # one per budget
    assert rows[-1].split()[-3:] != ["-", "-", "-"]  # at store-all's peak, store-all is feasible


def test_pareto_unknown_method_is_a_usage_error(graph_file, tmp_path, capsys):
    code, _, err = run(["pareto", graph_file, "--methods", "poet,nope", "-o", tmp_path / "p.png"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "nope")


# -- extensibility and process boundary ------------------------------------------------------
def test_other_packages_register_subcommands_through_entry_points(tmp_path, monkeypatch, capsys):
    (tmp_path / "extra_commands.py").write_text(textwrap.dedent("""
        from common.errors import CommandError

        def add_commands(subparsers):
            p = subparsers.add_parser("hello", help="say hello")
            p.add_argument("--fail", action="store_true")
            p.set_defaults(handler=run)

        def run(args):
            if args.fail:
                raise CommandError("no hello today", 7)
            print("hello")
            return 0
    """))
    # an installed distribution, as pip leaves it: its entry point names the module
    dist = tmp_path / "extra_commands-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-commands\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[poet_edge.commands]\nextra = extra_commands:add_commands\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run(["hello"], capsys) == (ExitCode.OK, "hello\n", "")
    code, _, err = run(["hello", "--fail"], capsys)
    assert code == 7 and err.strip() == "poet-edge hello: error: no hello today"
    assert "profile" in build_parser().format_help()  # the agent's commands, registered the same way


def test_console_command_in_a_subprocess(graph_file, tmp_path):
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, "-m", "common.cli", "solve", str(graph_file), "--memory",
                           str(tight_budget(graph_file)), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "status" in done.stdout and Schedule.load(out).memory_budget == tight_budget(graph_file)
    # Not a TTY: progress comes as plain lines on stderr, never terminal control codes.
    assert "\x1b[" not in done.stderr
    bad = subprocess.run([sys.executable, "-m", "common.cli", "solve", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == ExitCode.BAD_FILE and "Traceback" not in bad.stderr


def test_cli_starts_without_heavy_imports():
    code = ("import sys; from common.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'matplotlib', 'rich') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stderr


# -- what a new user tripped on ------------------------------------------------------------------
@pytest.fixture
def immutable_file(tmp_path):
    """An existing file the kernel refuses to change (``chattr +i``), as on a read-only mount."""
    path = tmp_path / "locked.json"
    path.write_text("{}")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    yield path
    subprocess.run(["chattr", "-i", str(path)], capture_output=True)


@pytest.mark.parametrize("command", ["solve", "pareto"])
def test_an_output_that_cannot_be_written_fails_before_the_work(command, graph_file, immutable_file, capsys):
    started = time.monotonic()
    code, _, err = run([command, graph_file, "--device", "rpi4", "-o", immutable_file], capsys)
    assert code == ExitCode.BAD_FILE
    assert_one_line_error(err, str(immutable_file), "not permitted")
    assert time.monotonic() - started < 5  # no solve, no sweep first
    assert immutable_file.read_text() == "{}"


def test_a_new_output_path_is_probed_and_left_absent_on_failure(graph_file, tmp_path, capsys):
    out = tmp_path / "fresh.json"
    code, _, err = run(["solve", graph_file, "--device", "rpi4", "--memory", "1", "--search-time", "0", "-o", out],
                       capsys)
    assert code == ExitCode.INFEASIBLE
    assert not out.exists()  # the writability probe leaves nothing behind


def test_a_negative_size_says_it_is_negative(graph_file, capsys):
    code, _, err = run(["solve", graph_file, "--memory", "-1MB"], capsys)
    assert code == ExitCode.USAGE
    assert "'-1MB' is negative" in err and "expected one argument" not in err


def test_top_level_help_lists_every_exit_code(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == ExitCode.OK
    epilog = " ".join(out[out.index("Exit codes"):].split())
    for exit_code in ExitCode:
        assert f"{int(exit_code)} " in epilog


def test_an_unknown_device_names_the_built_in_profiles_and_the_file_option(graph_file, capsys):
    code, _, err = run(["solve", graph_file, "--device", "rpi9"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "rpi9", "rpi4", "profile file")
    assert "DeviceProfile" not in err


def test_solve_says_why_the_search_stopped(poet_graphs, tmp_path, capsys):
    graph = poet_graphs / "resnet18_cifar_a72.json"
    code, out, _ = run(["solve", graph, "--memory", "1.5MB", "--runtime", "1.5", "--time-limit", "3", "--gap", "1e-6",
                        "-o", tmp_path / "s.json"], capsys)
    assert code == ExitCode.OK
    stopped = next(line for line in out.splitlines() if line.startswith("stopped"))
    assert "time limit" in stopped or "branch and bound" in stopped
    code, out, _ = run(["solve", graph, "--memory", "3MB", "--runtime", "7.6", "-o", tmp_path / "t.json"], capsys)
    assert next(line for line in out.splitlines() if line.startswith("stopped")).endswith(
        ("proven optimal", "the gap asked for (--gap) was proven"))


# -- whole-step memory ---------------------------------------------------------------------
def test_solve_with_an_optimizer_plans_the_whole_step_and_says_part_by_part(tmp_path, capsys):
    from schedules.step_memory import TrainingSpec
    from tests.schedules.graphs import with_parameters, with_workspace

    path = tmp_path / "graph.json"
    graph = with_parameters(with_workspace(linear_graph(8)), share=2000.0)  # weights far larger than activations
    graph.save(path)
    spec = TrainingSpec.for_optimizer("sgd", momentum=0.9)
    plain = store_all_peak(graph, spec)
    out = tmp_path / "s.json"
    state = graph.parameter_bytes  # momentum: one tensor per parameter
    code, stdout, _ = run(["solve", path, "--device", "rpi4", "--memory", state * 2 // 3, "--optimizer", "sgd",
                           "--momentum", "0.9", "-o", out], capsys)
    assert code == ExitCode.OK
    schedule = Schedule.load(out)
    assert schedule.step.training.optimizer == "sgd" and schedule.step.training.state_tensors == 1
    assert schedule.step.paged_state_bytes > 0 and "on flash" in stdout and "gradients" in stdout
    floor = memory_lower_bound(graph, spec)
    code, stdout, _ = run(["solve", path, "--device", "rpi4", "--memory", floor - 1, "--optimizer", "sgd",
                           "--momentum", "0.9", "-o", out], capsys)
    assert code == ExitCode.INFEASIBLE
    smallest = int(stdout.split("try: --memory ")[1].split()[0])
    assert floor <= smallest <= plain
    assert plan(graph, "rpi4", memory_budget=smallest, training=spec).feasible


def test_solve_with_an_optimizer_needs_the_graphs_parameter_layout(graph_file, capsys):
    code, _, err = run(["solve", graph_file, "--device", "rpi4", "--memory", "1MB", "--optimizer", "adamw"], capsys)
    assert code == ExitCode.USAGE
    assert_one_line_error(err, "no parameter layout", "poet-edge profile")
