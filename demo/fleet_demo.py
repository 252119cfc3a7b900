"""``poet-edge demo``: the whole fleet on this machine, from nothing configured to personalized models.

What it starts, every part the real program an operator or a device runs:

- the fleet server (``poet-edge server run``: SQLite, its own signing key, the dashboard, and the Flower
  SuperLink with TLS and SuperNode authentication), with an operator account for the dashboard;
- three device agents (``poet-edge agent run``) standing for a Raspberry Pi 4, a Raspberry Pi 5 and a Jetson
  with different memory budgets, each with its own state and swap directories, its own share of the digits,
  and a fake power supply and thermal zone (a sysfs tree, :class:`demo.devices.FakeDevice`: the one thing
  faked, the outside world the agents read).

The story it tells, in order (:meth:`FleetDemo.run`):

0. the vendor pretrains the model on digits no device holds (:mod:`agent.vendor`) and the operator imports it
   as a signed global model version (``poet-edge server versions import``); every device starts from it
   (``[workload] weights``), and so does the federation;
1. each device enrols with a single-use token; the server plans its schedule for its budget and signs it,
   and the device verifies it against the server's pinned key;
2. the devices are plugged in one by one and train local windows under their schedules; one is unplugged
   mid-window: it stops at the next step boundary with its steps checkpointed and, plugged in again, resumes
   from them, no step lost; memory against budget and against a plain PyTorch step's, and energy, are
   printed;
3. the operator turns federation on: the agents restart with their SuperNodes, and two Flower rounds run
   (``poet-edge server federate``); per device the global, local-only and personalized accuracy are
   printed, the global model of each round is stored as a signed version, and each device keeps its
   personalized model;
4. a schedule timeline and an energy-against-budget plot are drawn.

Everything goes under one folder (``--dir``).  ``--keep-running`` leaves the server and dashboard up until
Ctrl-C; otherwise the demo stops every process it started, and Ctrl-C at any moment does the same.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from agent.federated.virtual import FleetData
from demo.devices import REPO, FakeDevice, agent_command, poll_until, read_status, write_config
from demo.flower_fleet import make_tls
from common.keep_best import kept_name
from common.programs import free_port

# The digits model with eight residual blocks of 24 channels (agent.digits.residual_digits_workload), at a
# batch whose activations dominate the step, so that budgets well below a plain step's mean recomputing and
# paging.
MODEL, INPUT = "agent.digits:residual_digits_workload", "192x1x8x8"
# Each device's digits: 256 of them, seen from its own angle (-45, 0 and +45 degrees); the vendor pretrains on
# the others, upright.
DEMO_DATA = FleetData(samples=256, viewpoints=90.0)
VENDOR_STEPS = 300
MARKER = ".poet-edge-demo"  # in the demo's folder: the next run may replace it


@dataclass(frozen=True)
class DeviceSpec:
    """One demo device: its name, the device profile it stands for, and its whole-step memory budget."""

    name: str
    profile: str
    budget: str


# Whole-step budgets (what a step may use beyond the loaded model): a plain step of this workload takes about
# 56 MB (about 6 MB of it the runtime's own, which each device measures: what the model's first run leaves in
# the process, the executor's own objects and the pager's buffers) and none fits below about 16 MB.  The Pi 4
# trains under a third of a plain step's memory, the Pi 5 at about half, and the Jetson has room for all.  The
# Pi 5, unplugged mid-window, resumes from its checkpoint in a fresh worker, whose steps measure up to about
# 0.45 MB more than a worker that did not resume (reading the checkpoint is part of it; docs/benchmarks.md).
DEVICES = (DeviceSpec("pi4-kitchen", "rpi4", "17.5MB"), DeviceSpec("pi5-garage", "rpi5", "28MB"),
           DeviceSpec("jetson-lab", "jetson-orin-nano", "64MB"))
UNPLUGGED = "pi5-garage"  # the device unplugged mid-window


class DemoError(RuntimeError):
    """A step of the demo did not happen in time; the message says which and where its log is."""


@dataclass
class Device:
    """A running demo device: its folder, fake sysfs tree, agent config and agent process."""

    spec: DeviceSpec
    home: Path
    sysfs: FakeDevice
    token: str  # its single-use enrolment token (kept in its config: spent, it is never sent again)
    config: Path = Path()
    process: subprocess.Popen | None = None

    @property
    def status(self) -> dict[str, Any]:
        return read_status(self.home)

    @property
    def log(self) -> Path:
        return self.home / "agent.log"


@dataclass
class Outcome:
    """What the demo saw, for its summary and for the test that runs it."""

    schedules: dict[str, str] = field(default_factory=dict)  # device -> schedule id
    schedule_from: dict[str, str] = field(default_factory=dict)
    window: dict[str, dict[str, Any]] = field(default_factory=dict)  # device -> its status after its window
    unplug: dict[str, Any] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # the personalize rows' metrics, per device
    versions: int = 0  # stored: the vendor's, imported, and one per round
    vendor: dict[str, Any] = field(default_factory=dict)  # the pretrained model: file, version, accuracy
    personal_models: dict[str, str] = field(default_factory=dict)  # device -> provenance path
    pictures: list[Path] = field(default_factory=list)
    plain_bytes: dict[str, int | None] = field(default_factory=dict)  # device -> a plain step's whole memory


class FleetDemo:
    """The demo under ``root``; ``short`` trains fewer steps (for tests), ``out`` gets the story."""

    def __init__(self, root: Path, *, short: bool = False, keep_running: bool = False,
                 out: TextIO = sys.stdout) -> None:
        # absolute: the agents' configs name files that they resolve from their own folders
        self.root, self.short, self.keep_running, self.out = root.resolve(), short, keep_running, out
        self.server_dir, self.tls = self.root / "server", self.root / "tls"
        self.vendor_file = self.root / "vendor.safetensors"
        self.port, self.flower_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen | None = None
        self.devices: list[Device] = []
        self.outcome = Outcome()
        self._plain: dict[str, int | None] = {}  # device -> a plain step's bytes, once its graph is profiled
        self.started = time.monotonic()
        self.window_steps = 30 if short else 80

    # -- the story ---------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        """Tell the story, then stop every process it started (with ``keep_running``, at Ctrl-C only)."""
        try:
            self.tell()
            if self.keep_running:
                self.say(f"\nthe server and dashboard stay up at {self.url} (Ctrl-C stops everything)")
                while True:
                    time.sleep(3600)
        finally:
            self.close()
        return self.outcome

    def tell(self) -> Outcome:
        """The story, leaving everything running; :meth:`close` stops it."""
        self.start_server()
        self.import_vendor_model()
        self.enrol_devices()
        self.train_local_windows()
        self.federate()
        self.draw()
        self.summary()
        return self.outcome

    def start_server(self) -> None:
        self.chapter("The fleet server: device API, dashboard, schedule planner and Flower SuperLink")
        if (self.root / MARKER).is_file():  # an earlier demo's folder: replaced
            shutil.rmtree(self.root)
        elif self.root.exists() and any(self.root.iterdir()):
            raise DemoError(f"{self.root} is not empty and not an earlier demo's: the demo starts from nothing "
                            "(pass another --dir)")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / MARKER).write_text("made by poet-edge demo: replaced by its next run\n")
        make_tls(self.tls)
        self.server = self._spawn(["server", "run", "--data-dir", str(self.server_dir), "--port", str(self.port),
                                   "--solve-time-limit", "20", "--flower", "--flower-tls-dir", str(self.tls),
                                   "--flower-port", str(self.flower_port)], self.root / "server.log")
        self.wait(lambda: self._get("/api/v1/server-key"), 90, "the server answering", self.root / "server.log")
        key = json.loads(self._get("/api/v1/server-key"))
        (self.root / "server.pub").write_text(key["public_key"])
        password = secrets.token_urlsafe(12)
        self._cli(["server", "operator", "add", "operator", "--password-stdin", "--data-dir", str(self.server_dir)],
                  stdin=password + "\n")
        (self.root / "operator.txt").write_text(f"operator\n{password}\n")
        self.say(f"server at {self.url}, signing key {key.get('key_id', '?')}; Flower SuperLink on port "
                 f"{self.flower_port} (TLS, registered SuperNodes only)")
        self.say(f"dashboard: {self.url}/login  user: operator  password: {password}")

    def import_vendor_model(self) -> None:
        self.chapter("The vendor's model: pretrained on digits no device holds, imported as a signed version")
        from agent.digits import RESIDUAL_NAME, residual_digits_workload
        from agent.vendor import pretrain

        vendor = pretrain(len(DEVICES), DEMO_DATA, 0, VENDOR_STEPS, 0.05, self.vendor_file,
                          model=residual_digits_workload)
        self.say(vendor.describe())
        imported = self._cli(["server", "versions", "import", str(self.vendor_file), "--model", RESIDUAL_NAME,
                              "--data-dir", str(self.server_dir)])
        self.say("  " + imported.strip().splitlines()[0])
        self.outcome.vendor = {"file": str(self.vendor_file), "accuracy": vendor.accuracy, "images": vendor.images}
        self.say("every device starts from it ([workload] weights), and the federation from its version")

    def enrol_devices(self) -> None:
        self.chapter("Three devices enrol; the server plans and signs each one's schedule for its budget")
        for index, spec in enumerate(DEVICES):
            home = self.root / spec.name
            home.mkdir()
            sysfs = FakeDevice(home / "root")
            sysfs.unplug()  # on battery until the story plugs it in
            from agent.digits import write_device_data

            data = write_device_data(home / "digits.npz", index, len(DEVICES), data=DEMO_DATA)
            token = self._cli(["server", "enrol-token", "--data-dir", str(self.server_dir)]).strip()
            device = Device(spec, home, sysfs, token)
            device.config = self._write_config(device, data, flower=False)
            self.devices.append(device)
            device.process = self._spawn(["agent", "run", "--config", str(device.config)], device.log)
            self.say(f"{spec.name:<12} stands for a {spec.profile}: budget {spec.budget} for a whole training "
                     f"step, on battery (waiting to be plugged in)")
        for device in self.devices:
            self.wait(lambda d=device: "not charging" in d.status.get("reason", "") or
                      "battery" in d.status.get("reason", ""), 60, f"{device.spec.name} waiting", device.log)

    def train_local_windows(self) -> None:
        self.chapter("Plugged in one by one, the devices train local windows under their schedules")
        for device in self.devices:
            device.sysfs.plug()
            status = self.wait(lambda d=device: d.status if d.status.get("steps_done", 0) >= 1 else None, 240,
                               f"{device.spec.name}'s first step", device.log)
            self.outcome.schedules[device.spec.name] = str(status.get("schedule_id"))
            self.outcome.schedule_from[device.spec.name] = str(status.get("schedule_from"))
            self.say(f"{device.spec.name:<12} plugged in: schedule {str(status.get('schedule_id'))[:12]} from "
                     f"{status.get('schedule_from')}, verified against the server's key; training")
            if device.spec.name == UNPLUGGED:
                self.unplug_and_resume(device)
        self.say("each device's window, and what its steps took:")
        for device in self.devices:
            resumed_at = self.outcome.unplug.get("steps_at_stop", 0) if device.spec.name == UNPLUGGED else 0
            self._progress(device, resumed_at + self.window_steps)
            self.outcome.window[device.spec.name] = device.status
            self._report_window(device)

    def unplug_and_resume(self, device: Device) -> None:
        """Unplug ``device`` mid-window; plug it in again once it has stopped."""
        seen = int(device.status.get("steps_done", 0))
        device.sysfs.unplug()
        unplugged = time.monotonic()
        stopped = self.wait(lambda: device.status if device.status.get("state") != "training" else None, 60,
                            f"{device.spec.name} stopping", device.log)
        stop_seconds = time.monotonic() - unplugged
        at_stop = int(stopped.get("steps_done", 0))
        self.say(f"{device.spec.name:<12} unplugged at step {seen}: stopped {stop_seconds:.1f} s later at step "
                 f"{at_stop}, its steps checkpointed ({stopped.get('reason')})")
        time.sleep(1.0)
        device.sysfs.plug()
        resumed = self.wait(lambda: device.status if device.status.get("steps_done", 0) > at_stop else None, 120,
                            f"{device.spec.name} resuming", device.log)
        self.say(f"{device.spec.name:<12} plugged in again: resumed from step {at_stop} (now {resumed['steps_done']}"
                 "): no step lost")
        self.outcome.unplug = {"device": device.spec.name, "steps_seen": seen, "steps_at_stop": at_stop,
                               "stop_seconds": stop_seconds, "steps_after_resume": int(resumed["steps_done"])}

    def federate(self) -> None:
        self.chapter("The operator turns federation on: two Flower rounds, then each device personalizes")
        from agent.config import load_config
        from agent.federated.supernode import ensure_key

        for device in self.devices:
            self._stop(device.process)
            device.config = self._write_config(device, device.home / "digits.npz", flower=True)
            public = ensure_key(load_config(device.config).supernode_key_path)
            self._cli(["server", "supernode", "register", device.spec.name, str(public), "--data-dir",
                       str(self.server_dir)])
            device.process = self._spawn(["agent", "run", "--config", str(device.config)], device.log)
        self.wait(self._all_online, 180, "three SuperNodes online", self.root / "server.log")
        self.say("three SuperNodes online (registered keys, TLS); federating...")
        steps = ("5", "10") if self.short else ("10", "30")
        output = self._cli(["server", "federate", "--data-dir", str(self.server_dir), "--rounds", "2",
                            "--min-nodes", "3", "--local-steps", steps[0], "--finetune-steps", steps[1],
                            "--local-baseline", "--round-timeout", "300"], timeout=900)
        for line in output.splitlines():
            if line.startswith(("round", "federated run")):
                self.say("  " + line)
        self._read_rounds(int(output.split("federated run ")[-1].split()[0]))
        versions = self._cli(["server", "versions", "--data-dir", str(self.server_dir)])
        self.outcome.versions = sum(1 for line in versions.splitlines() if line.startswith("v"))
        self.say(f"global model versions stored and signed: {self.outcome.versions}")
        for device in self.devices:
            provenance = device.home / "state" / "personal" / "model.json"
            if provenance.is_file():
                self.outcome.personal_models[device.spec.name] = str(provenance)
        self.say(f"personalized models kept on {len(self.outcome.personal_models)} devices "
                 "(STATE_DIR/personal; `poet-edge agent export` writes TorchScript or ONNX)")

    def draw(self) -> None:
        self.chapter("Pictures")
        device = self.devices[0]
        prepared = next((device.home / "state" / "prepared").iterdir())
        schedule = next(prepared.glob("schedule-*.json"))
        timeline = self.root / "timeline.png"
        self._cli(["plot", str(schedule), "--graph", str(prepared / "graph.json"), "--key",
                   str(self.root / "server.pub"), "-o", str(timeline)])
        energy = self.root / "energy-vs-budget.png"
        self._cli(["pareto", str(prepared / "graph.json"), "--device", device.spec.profile, "--points",
                   "4" if self.short else "6", "--time-limit", "3", "--gap", "0.01", "--search-time", "10",
                   "-o", str(energy)], timeout=600)
        self.outcome.pictures = [timeline, energy]
        self.say(f"{device.spec.name}'s schedule timeline: {timeline}")
        self.say(f"energy against memory budget, POET and the baselines, for its graph: {energy}")

    def summary(self) -> None:
        self.chapter("Summary")
        rows = {r["device"]: r for r in self.outcome.rounds}
        self.say(f"{'device':<12} {'budget':>9} {'peak':>9} {'plain':>9} {'/plain':>7} {'peak/':>6} {'energy':>8} "
                 f"{'steps':>6} {'global':>7} {'alone':>7} {'personal':>8} {'kept':>16} {'gain':>6}")
        for device in self.devices:
            window, row = self.outcome.window.get(device.spec.name, {}), rows.get(device.spec.name, {})
            plain, budget, peak = self._plain_bytes(device), window.get('memory_budget_bytes'), window.get('peak_bytes')
            self.outcome.plain_bytes[device.spec.name] = plain
            self.say(f"{device.spec.name:<12} {_mb(budget):>9} "
                     f"{_mb(peak):>9} {_mb(plain):>9} {_share(budget, plain):>7} {_share(peak, plain):>6} "
                     f"{window.get('energy_j') or 0:>7.1f}J "
                     f"{window.get('steps_done', 0):>6} {_pct(row.get('global-accuracy')):>7} "
                     f"{_pct(row.get('local-accuracy')):>7} {_pct(row.get('personal-accuracy')):>8} "
                     f"{_kept(row):>16} {_gain(row):>6}")
        self.say("(/plain and peak/: the budget and the step's measured peak as shares of a plain step's memory; "
                 "accuracies on the half of each device's held-out digits that chose nothing; gain: the kept "
                 "model over the better of the global model and the device training alone, in points)")
        self.say(f"\nfinished in {time.monotonic() - self.started:.0f} s; everything is in {self.root}/ "
                 f"(server.log, each device's agent.log and state/); dashboard {self.url} while it runs")

    # -- helpers -----------------------------------------------------------------------------------------

    def _write_config(self, device: Device, data: Path, *, flower: bool) -> Path:
        options: dict[str, Any] = dict(
            device_name=device.spec.name, training_memory_budget=device.spec.budget,
            training_steps_per_window=self.window_steps, training_checkpoint_every=5,
            training_window_gap_seconds=3600, server_url=self.url, server_enrolment_token=device.token,
            server_public_key=str(self.root / "server.pub"), server_heartbeat_seconds=1,
            workload_weights=str(self.vendor_file))
        if flower:
            options.update(flower_enabled=True, flower_superlink=f"127.0.0.1:{self.flower_port}",
                           flower_root_certificates=str(self.tls / "ca.crt"), flower_runtime_port=free_port())
        return write_config(device.home, device.sysfs, data, MODEL, INPUT, **options)

    def _progress(self, device: Device, steps: int) -> None:
        """Wait until the device has trained ``steps`` steps and its window ended, drawing a bar (on a terminal)."""
        name, drawn = device.spec.name, self.out.isatty()
        while True:
            status = device.status
            done = int(status.get("steps_done", 0))
            finished = status.get("state") == "waiting" and done >= steps
            if drawn or finished:
                bar = "#" * int(30 * min(done, steps) / steps)
                self.out.write(f"\r  {name:<12} [{bar:<30}] {done}/{steps} steps")
                self.out.flush()
            if finished:
                self.out.write("\n")
                return
            if status.get("state") in ("backing off", "stopped") or \
                    (device.process is not None and device.process.poll() is not None):
                self.out.write("\n")
                raise DemoError(f"{name} {status.get('state')}: {status.get('reason')} (log: {device.log})")
            time.sleep(0.5)

    def _report_window(self, device: Device) -> None:
        s = device.status
        self.say(f"  {device.spec.name:<12} window done: {s.get('steps_done')} steps, peak {_mb(s.get('peak_bytes'))} "
                 f"against budget {_mb(s.get('memory_budget_bytes'))} (a plain step: {_mb(self._plain_bytes(device))}), "
                 f"{s.get('energy_j') or 0:.1f} J, held-out accuracy {_pct(s.get('holdout_accuracy'))}")

    def _plain_bytes(self, device: Device) -> int | None:
        """:meth:`_plain_step_bytes`, worked out once per device (a graph loaded and a plain step replayed)."""
        if self._plain.get(device.spec.name) is None:
            self._plain[device.spec.name] = self._plain_step_bytes(device)
        return self._plain[device.spec.name]

    def _plain_step_bytes(self, device: Device) -> int | None:
        """A plain PyTorch step's whole memory (every activation kept, gradients and optimizer state in RAM, the
        runtime's own) for the device's workload, as the planner counts it from the graph the device profiled."""
        from agent.config import load_config
        from agent.prepare import training_spec
        from schedules.budgets import store_all_peak
        from schedules.graph import TrainingGraph

        graphs = list((device.home / "state" / "prepared").glob("*/graph.json"))
        if not graphs:
            return None
        return store_all_peak(TrainingGraph.load(graphs[0]), training_spec(load_config(device.config)))

    def _all_online(self) -> bool:
        from server.config import FlowerSettings, ServerSettings
        from server.federated.supernodes import list_nodes

        settings = ServerSettings(data_dir=self.server_dir,
                                  flower=FlowerSettings(port=self.flower_port, tls_dir=self.tls))
        try:
            online = {n["device"] for n in list_nodes(settings) if n["status"] == "online"}
        except Exception:  # the SuperLink is still starting
            return False
        return online >= {d.spec.name for d in self.devices} and all(
            str(d.status.get("supernode", "")).startswith("running") for d in self.devices)

    def _read_rounds(self, run_id: int) -> None:
        """What each device kept in the federation's (last) Flower run (its keep row, else its personalize row)."""
        from server.federated.rounds import open_store, personalized, round_rows

        database = open_store(f"sqlite:///{self.server_dir / 'server.db'}")
        try:
            rows = personalized(round_rows(database, run_id, limit=10_000))
        finally:
            database.dispose()
        self.outcome.rounds = [{"device": r.device_name, **r.metrics} for r in rows]

    def _spawn(self, args: list[str], log: Path) -> subprocess.Popen:
        """A ``poet-edge`` program in a session of its own (Ctrl-C reaches the demo, which stops it in order)."""
        with open(log, "ab") as output:
            return subprocess.Popen(agent_command(*args), cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})

    def _cli(self, args: list[str], stdin: str | None = None, timeout: float = 300) -> str:
        """A ``poet-edge`` command run to its end; its standard output.  DemoError with its output if it fails."""
        done = subprocess.run(agent_command(*args), cwd=REPO, input=stdin, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})
        if done.returncode != 0:
            raise DemoError(f"poet-edge {' '.join(args[:3])} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def _get(self, path: str) -> str | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.read().decode()
        except OSError:
            return None

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str, log: Path) -> Any:
        """Poll until ``predicate()`` is truthy; its value.  DemoError after ``timeout`` s, or as soon as a
        process of the demo has exited, with the end of its log."""
        def settled() -> Any:
            for process in (self.server, *(d.process for d in self.devices)):
                if process is not None and process.poll() is not None:
                    culprit = next((d.log for d in self.devices if d.process is process), self.root / "server.log")
                    tail = "".join(culprit.read_text(errors="replace").splitlines(keepends=True)[-5:])
                    raise DemoError(f"{' '.join(process.args[3:6])} exited ({process.returncode}) while waiting "
                                    f"for {what}; the end of {culprit}:\n{tail}")
            return predicate()

        value = poll_until(settled, timeout)
        if not value:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}; see {log}")
        return value

    def _stop(self, process: subprocess.Popen | None, timeout: float = 60) -> None:
        """SIGTERM, then SIGKILL to its whole session after ``timeout`` s."""
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        """Stop the agents, then the server (its SuperLink with it)."""
        for device in self.devices:
            self._stop(device.process)
        self._stop(self.server)

    def chapter(self, title: str) -> None:
        self.say(f"\n== {title} ({time.monotonic() - self.started:.0f} s)")

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


def _mb(value: Any) -> str:
    return f"{value / 1e6:.2f} MB" if isinstance(value, (int, float)) and value > 0 else "-"


def _share(budget: Any, plain: Any) -> str:
    """The budget as a share of a plain step's memory."""
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (budget, plain))
    return f"{budget / plain:.2f}" if ok else "-"


def _kept(row: dict[str, Any]) -> str:
    """The model a device kept and its accuracy on the held-out half the choice never saw."""
    name = kept_name(row.get("kept"))
    return f"{name} {_pct(row.get('kept-accuracy'))}" if name else "-"


def _gain(row: dict[str, Any]) -> str:
    """The kept model's accuracy over the better of the global and the local-only model's, in points."""
    values = [row.get(k) for k in ("kept-accuracy", "global-accuracy", "local-accuracy")]
    if not all(isinstance(v, (int, float)) and v >= 0 for v in values):
        return "-"
    return f"{100 * (values[0] - max(values[1:])):+.1f}"


def _pct(value: Any) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) and value >= 0 else "-"


