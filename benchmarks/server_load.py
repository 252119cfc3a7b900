"""Fleet server load benchmark: simulated devices on loopback against real server processes.

    python -m benchmarks.server_load [--devices 10000 --period 60 --duration 120 --operators 2
                                      --backends sqlite,postgres --processes 2 --fetch-every 3] [--quick]

Each simulated device posts a heartbeat every ``--period`` seconds (60) and,
on every ``--fetch-every``-th heartbeat (every third: each device checks its
schedule every 3 minutes, more often than an agent does, which asks when a
training window begins), fetches its schedule with ``If-None-Match`` and
expects 304.  Devices start at phases spread uniformly over one period.
Meanwhile ``--operators`` signed-in operators each watch a page of the fleet
table (50 rows, sorted and filtered) as the dashboard's page does, asking
every 2 s (the page's refresh), mostly for the rows changed since.

For each backend -- SQLite, then PostgreSQL -- ``--processes`` server
processes (2) run over one database and one data directory (so one signing
key), each on its own port, with the devices and operators split evenly
between them as a reverse proxy's upstream would split them (one Python
process is bound to one core: docs/deploying.md).  The benchmark runs ``--devices``
devices for ``--duration`` seconds after one period of warm-up, then rising
device counts for ``--knee-duration`` seconds each (up to ``--knee-max``,
twice ``--devices`` by default) until a p99 crosses its target or a request
fails (the knee).  It prints requests per second, p50 / p99 latency measured
by the client per request, errors, server RSS growth (the server processes
and their children, from the end of warm-up to the end of the window) and
the CPU the servers and the load generator used, side by side, with the
targets: 10,000 devices, device API p99 < 50 ms, fleet page p99 < 200 ms,
zero errors, RSS growth < 100 MB.

The load generator (:mod:`benchmarks.load_client`) shares one keep-alive
connection pool per server among all devices (``--connections`` each) and
runs on one core; its CPU is printed, with a warning when it came near a
full core (its figures would then measure the client, not the server).
Setup -- enrolling the devices, solving the one schedule they all share, and
starting the servers -- happens before the measured window
(:mod:`benchmarks.server_rig`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from benchmarks.load_client import ConnectionPool, LoadPlan, Samples, SimulatedOperator, run_devices, run_operators
from benchmarks.server_rig import (ServerProcess, cpu_seconds, device_list, enrol_devices, operator_sessions,
                                   rss_bytes, solve_schedule, start_server, tree_cpu_seconds)

TARGET_DEVICES = 10_000
TARGET_P99_MS = 50.0  # the device API: heartbeats and schedule checks
TARGET_FLEET_P99_MS = 200.0  # an operator's page of the fleet table
TARGET_RSS_MB = 100.0
CLIENT_SATURATED = 0.85  # of one core: beyond this the load generator, not the server, sets the pace
KNEE_LADDER = (2, 3, 4, 6, 8, 12, 16, 24, 32)  # multiples of --devices tried in turn
DEVICE_API = ("heartbeat", "schedule")  # the request kinds whose p99 is the device API's
BACKENDS = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


@dataclass
class StepResult:
    """One measured window."""

    devices: int
    seconds: float
    requests: int
    p50_ms: float
    p99_ms: float  # the device API
    p99_ms_by_kind: dict[str, float]
    errors: dict[str, int]
    rss_start_mb: float
    rss_growth_mb: float
    server_cpu: float  # cores
    client_cpu: float  # cores
    database_cpu: float | None  # cores; None: in the server's process (SQLite)
    wake_lag_p99_ms: float
    fleet_pages: int = 0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def fleet_p99_ms(self) -> float:
        return self.p99_ms_by_kind.get("fleet page", float("nan"))

    @property
    def crossed(self) -> bool:
        """Past the knee: a p99 over its target, or any error."""
        return self.p99_ms > TARGET_P99_MS or self.fleet_p99_ms > TARGET_FLEET_P99_MS or self.error_count > 0

    @property
    def client_saturated(self) -> bool:
        return self.client_cpu > CLIENT_SATURATED


@dataclass
class BackendResult:
    """The main window and the knee search of one backend."""

    label: str
    servers: int
    main: StepResult
    ladder: list[StepResult] = field(default_factory=list)

    def knee(self) -> str:
        """Where p99 crosses the target, in words."""
        below, above = _bracket(self.ladder)
        if above is None:
            last = max(self.ladder, key=lambda r: r.devices)
            return f"> {last.devices:,} ({'client-bound' if last.client_saturated else 'largest tried'})"
        return f"< {above:,}" if below is None else f"{below:,}-{above:,}"


class Fleet:
    """The servers of one backend, the devices enrolled so far, and the schedule they share."""

    def __init__(self, backend: str, root: Path, database: str | None, processes: int,
                 database_pid: int | None = None) -> None:
        self.backend = backend
        self.database_pid = database_pid
        self.label, self.server_count = BACKENDS[backend], processes
        self.data_dir, self.database = root / "server", database
        self.log = root / "server.log"
        self.names: list[str] = []
        self.tokens: list[str] = []
        self.cookies: list[str] = []
        self.schedule_id: str | None = None

    def enrol_up_to(self, count: int) -> None:
        """Enrol devices until ``count`` are (not measured)."""
        names = [f"sim-{i:06d}" for i in range(len(self.names), count)]
        if names:
            started = time.perf_counter()
            self.tokens += enrol_devices(self.data_dir, self.database, names)
            self.names += names
            print(f"   enrolled {len(names):,} devices in {time.perf_counter() - started:.1f} s", flush=True)

    def sign_in(self, operators: int) -> None:
        """Sessions for ``operators`` dashboard operators (not measured)."""
        if len(self.cookies) < operators:
            self.cookies += operator_sessions(self.data_dir, self.database, operators - len(self.cookies))

    def start(self) -> list[ServerProcess]:
        """Start the servers one after another (the first makes the signing key); solve the schedule once."""
        servers: list[ServerProcess] = []
        try:
            for _ in range(self.server_count):
                servers.append(start_server(self.data_dir, self.database, self.log))
            if self.schedule_id is None:
                started = time.perf_counter()
                self.schedule_id = solve_schedule(servers[0].port, self.tokens[0])
                print(f"   schedule {self.schedule_id} solved in {time.perf_counter() - started:.1f} s", flush=True)
        except BaseException:
            for server in servers:
                server.stop()
            raise
        return servers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"== each device: a heartbeat every {args.period:g} s, its schedule checked with If-None-Match every "
          f"{args.fetch_every} heartbeat(s) ({args.period * args.fetch_every:g} s); warm-up {args.period:g} s; "
          f"{args.connections} keep-alive connections per server; {os.cpu_count()} cores on this machine")
    results = []
    with tempfile.TemporaryDirectory(prefix="poet-server-load-", dir="/var/tmp") as tmp:
        for backend in args.backends:
            result = run_backend(backend, Path(tmp) / backend, args)
            if result is not None:
                results.append(result)
    if results:
        print_table(results, args)
    return 0 if len(results) == len(args.backends) else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server_load", description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=TARGET_DEVICES, help="devices of the main window")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured, after warm-up")
    parser.add_argument("--knee-duration", type=float, default=30.0, help="seconds measured per knee step")
    parser.add_argument("--knee-max", type=int, help="most devices the knee search tries (default: 2 x --devices)")
    parser.add_argument("--knee-bisect", type=int, default=2,
                        help="steps that halve the interval where p99 crosses the target, after the ladder")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--processes", type=int, default=2,
                        help="server processes over each database, each on its own port (a reverse proxy's upstream)")
    parser.add_argument("--period", type=float, default=60.0, help="seconds between a device's heartbeats")
    parser.add_argument("--fetch-every", type=int, default=3, help="a schedule check every this many heartbeats")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections per server")
    parser.add_argument("--operators", type=int, default=2, help="operators watching the fleet table")
    parser.add_argument("--operator-period", type=float, default=2.0,
                        help="seconds between an operator's fleet page requests (the page's refresh)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 40 devices, 2 s period, 4 s windows, one knee step")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.duration, args.knee_duration, args.period = 40, 4.0, 3.0, 2.0
        args.knee_max, args.knee_bisect = 2 * args.devices, 0
    if args.knee_max is None:
        args.knee_max = 2 * args.devices
    if args.processes < 1:
        parser.error("--processes: at least 1")
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        parser.error(f"--backends: choose from {', '.join(BACKENDS)}")
    return args


def run_backend(backend: str, root: Path, args: argparse.Namespace) -> BackendResult | None:
    """The main window, then the knee search, on one backend; ``None`` when PostgreSQL is not installed."""
    root.mkdir(parents=True)
    if backend == "postgres":
        from benchmarks.postgres import TemporaryPostgres

        try:
            postgres = TemporaryPostgres()
        except RuntimeError as exc:
            print(f"== PostgreSQL skipped: {exc}", flush=True)
            return None
        with postgres:
            return _measure(Fleet(backend, root, postgres.url, args.processes, _postmaster_pid(postgres)), args)
    return _measure(Fleet(backend, root, None, args.processes), args)


def _postmaster_pid(postgres) -> int | None:
    """The PostgreSQL server's process id (first line of ``postmaster.pid``), for its CPU time."""
    try:
        return int((Path(postgres.data) / "postmaster.pid").read_text().split()[0])
    except (AttributeError, OSError, ValueError, IndexError):
        return None


def _measure(fleet: Fleet, args: argparse.Namespace) -> BackendResult:
    print(f"== {fleet.label}, {fleet.server_count} server process(es)", flush=True)
    main = measure_step(fleet, args.devices, args.duration, args)
    result = BackendResult(fleet.label, fleet.server_count, main, [main])
    for devices in _knee_counts(main, args):
        step = measure_step(fleet, devices, args.knee_duration, args)
        result.ladder.append(step)
        if step.client_saturated or step.crossed != main.crossed:
            break
    for _ in range(args.knee_bisect):
        below, above = _bracket(result.ladder)
        if below is None or above is None or above - below <= max(10, below // 10):
            break
        result.ladder.append(measure_step(fleet, _round((below + above) // 2), args.knee_duration, args))
    return result


def _bracket(steps: list[StepResult]) -> tuple[int | None, int | None]:
    """The largest count under the target below the smallest count past it, and that count."""
    above = min((s.devices for s in steps if s.crossed), default=None)
    below = max((s.devices for s in steps if not s.crossed and (above is None or s.devices < above)), default=None)
    return below, above


def _round(devices: int) -> int:
    """Two significant digits: 3,500 rather than 3,472."""
    scale = 10 ** max(len(str(devices)) - 2, 0)
    return max(round(devices / scale) * scale, 1)


def _knee_counts(main: StepResult, args: argparse.Namespace) -> list[int]:
    """Device counts to try after the main window: up the ladder while under the target, down while over."""
    if main.crossed:
        return [c for c in (args.devices // 2, args.devices // 4, args.devices // 8) if c >= 10]
    return [args.devices * m for m in KNEE_LADDER if args.devices * m <= args.knee_max]


def measure_step(fleet: Fleet, devices: int, duration: float, args: argparse.Namespace) -> StepResult:
    """Enrol up to ``devices``, start the servers, warm up one period, measure ``duration`` seconds, stop."""
    fleet.enrol_up_to(devices)
    fleet.sign_in(args.operators)
    servers = fleet.start()
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            result = runner.run(_load(fleet, servers, devices, duration, args))
    finally:
        for server in servers:
            server.stop()
    errors = f", errors {result.errors}" if result.errors else ""
    print(f"   {devices:>6,} devices, {duration:g} s: {result.rate:7.1f} req/s, p50 {result.p50_ms:6.1f} ms, p99 "
          f"{result.p99_ms:7.1f} ms, fleet page p99 {result.fleet_p99_ms:6.1f} ms, RSS +{result.rss_growth_mb:.1f} MB, server CPU {result.server_cpu:.2f} cores, "
          f"client CPU {result.client_cpu:.2f} core{errors}", flush=True)
    if result.client_saturated:
        print(f"   WARNING: the load generator used {result.client_cpu:.0%} of its core: these figures measure the "
              "client as much as the server", flush=True)
    return result


async def _load(fleet: Fleet, servers: list[ServerProcess], devices: int, duration: float,
                args: argparse.Namespace) -> StepResult:
    loop = asyncio.get_running_loop()
    pools = [ConnectionPool("127.0.0.1", server.port, args.connections) for server in servers]
    start = loop.time() + 0.2
    plan = LoadPlan(args.period, args.fetch_every, fleet.schedule_id, start, start + args.period,
                    start + args.period + duration)
    samples = Samples()
    operators = [SimulatedOperator(cookie, i % len(servers)) for i, cookie in enumerate(fleet.cookies)]
    running = asyncio.gather(
        run_devices(device_list(fleet.tokens[:devices], fleet.names[:devices], len(servers)), pools, plan, samples),
        run_operators(operators[:args.operators], pools, plan, args.operator_period, samples))
    client = psutil.Process()
    await asyncio.sleep(plan.measure_from - loop.time())
    rss0, cpu0, client0, wall0 = rss_bytes(servers), cpu_seconds(servers), sum(client.cpu_times()[:2]), loop.time()
    db0 = tree_cpu_seconds(fleet.database_pid)
    await asyncio.sleep(plan.measure_to - loop.time())
    rss1, cpu1, client1, wall1 = rss_bytes(servers), cpu_seconds(servers), sum(client.cpu_times()[:2]), loop.time()
    db1 = tree_cpu_seconds(fleet.database_pid)
    await running
    for pool in pools:
        pool.close()
    wall = wall1 - wall0
    return _summary(samples, devices, duration, rss0, rss1, (cpu1 - cpu0) / wall, (client1 - client0) / wall,
                    None if db0 is None or db1 is None else (db1 - db0) / wall)


def _summary(samples: Samples, devices: int, duration: float, rss0: int, rss1: int, server_cpu: float,
             client_cpu: float, database_cpu: float | None) -> StepResult:
    every = np.array([v for kind in DEVICE_API for v in samples.latencies[kind]]) * 1e3
    requests = sum(len(values) for values in samples.latencies.values())
    by_kind = {kind: float(np.percentile(values, 99)) * 1e3 for kind, values in samples.latencies.items() if values}
    lag = float(np.percentile(samples.wake_lag, 99)) * 1e3 if samples.wake_lag else 0.0
    return StepResult(devices=devices, seconds=duration, requests=requests,
                      p50_ms=float(np.percentile(every, 50)) if len(every) else float("nan"),
                      p99_ms=float(np.percentile(every, 99)) if len(every) else float("nan"),
                      p99_ms_by_kind=by_kind, errors=dict(samples.errors), rss_start_mb=rss0 / 1e6,
                      rss_growth_mb=(rss1 - rss0) / 1e6, server_cpu=server_cpu, client_cpu=client_cpu,
                      database_cpu=database_cpu,
                      wake_lag_p99_ms=lag, fleet_pages=len(samples.latencies["fleet page"]))


def _loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def print_table(results: list[BackendResult], args: argparse.Namespace) -> None:
    """The main windows side by side with the targets, then each backend's knee search."""
    width = 26
    print()
    print(f"{'figure':<34}" + "".join(f"{f'{r.label}, {r.servers} proc':>{width}}" for r in results) + "   target")
    rows = [
        ("devices", lambda m: f"{m.devices:,}", f"{TARGET_DEVICES:,}", lambda m: m.devices >= TARGET_DEVICES),
        ("window (s, after warm-up)", lambda m: f"{m.seconds:g}", "", None),
        ("requests per second", lambda m: f"{m.rate:.1f}", "", None),
        ("device API p50 latency (ms)", lambda m: f"{m.p50_ms:.1f}", "", None),
        ("device API p99 latency (ms)", lambda m: f"{m.p99_ms:.1f}", f"< {TARGET_P99_MS:g}",
         lambda m: m.p99_ms < TARGET_P99_MS),
        ("  p99 heartbeat / schedule (ms)", lambda m: " / ".join(f"{m.p99_ms_by_kind.get(k, float('nan')):.1f}"
                                                                 for k in DEVICE_API), "", None),
        ("fleet page p99 latency (ms)", lambda m: f"{m.fleet_p99_ms:.1f}", f"< {TARGET_FLEET_P99_MS:g}",
         lambda m: m.fleet_p99_ms < TARGET_FLEET_P99_MS),
        ("fleet pages measured", lambda m: f"{m.fleet_pages:,}", "", None),
        ("errors", lambda m: f"{m.error_count}", "0", lambda m: m.error_count == 0),
        ("server RSS growth (MB)", lambda m: f"{m.rss_growth_mb:+.1f}", f"< {TARGET_RSS_MB:g}",
         lambda m: m.rss_growth_mb < TARGET_RSS_MB),
        ("server RSS at warm-up end (MB)", lambda m: f"{m.rss_start_mb:.0f}", "", None),
        ("server CPU (cores)", lambda m: f"{m.server_cpu:.2f}", "", None),
        ("database server CPU (cores)", lambda m: "-" if m.database_cpu is None else f"{m.database_cpu:.2f}", "",
         None),
        ("client CPU (cores)", lambda m: f"{m.client_cpu:.2f}", f"< {CLIENT_SATURATED:g}",
         lambda m: m.client_cpu < CLIENT_SATURATED),
        ("client wake-up lag p99 (ms)", lambda m: f"{m.wake_lag_p99_ms:.1f}", "", None),
    ]
    for name, value, target, ok in rows:
        cells = "".join(f"{_cell(value(r.main), None if ok is None else ok(r.main)):>{width}}" for r in results)
        print(f"{name:<34}{cells}   {target}")
    knee = "knee: a p99 over target (devices)"
    print(f"{knee:<34}" + "".join(f"{r.knee():>{width}}" for r in results)
          + f"   ({args.knee_duration:g} s steps)")
    for r in results:
        print(f"\n{r.label}, {r.servers} server process(es): knee search")
        print(f"{'devices':>8} {'window s':>8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'fleet p99':>9} "
              f"{'errors':>7} {'RSS MB':>7} {'server':>7} {'client':>7}")
        for s in sorted(r.ladder, key=lambda s: s.devices):
            print(f"{s.devices:>8,} {s.seconds:>8g} {s.rate:>8.1f} {s.p50_ms:>8.1f} {s.p99_ms:>8.1f} "
                  f"{s.fleet_p99_ms:>9.1f} {s.error_count:>7} {s.rss_growth_mb:>+7.1f} {s.server_cpu:>7.2f} {s.client_cpu:>7.2f}"
                  + ("  client saturated" if s.client_saturated else ""))
    for r in results:
        if r.main.errors:
            print(f"\n{r.label} errors: " + ", ".join(f"{k} x{v}" for k, v in r.main.errors.items()))


def _cell(text: str, ok: bool | None) -> str:
    return text if ok is None else f"{text} {'met' if ok else 'MISSED'}"


if __name__ == "__main__":
    raise SystemExit(main())
