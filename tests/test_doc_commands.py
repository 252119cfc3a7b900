"""Every command the README and the docs show, run as a user would type it.

Each document's shell lines run in order in one scratch folder that stands for the machine: the paths a
real device or server has (``/var/lib/poet-server``, ``/etc/poet-agent/agent.toml``, ``/mnt/sd/swap``) point
into it, ``poet-edge`` is this checkout's, and ``sudo -u poet-server /opt/...`` is dropped.  What the sandbox
cannot give (a fleet to federate with, a downloaded data set) must fail the way the docs promise: with the
exit code and message listed in :data:`FAILS_HERE`.  What no test may do on the machine it runs on (install
systemd units, edit ``/etc``) is listed in :data:`RUN_ELSEWHERE` with the test or job that runs it instead.
The Python API's examples run too, on the same files.  The fleet simulations that reproduce published figures
over hours run with one seed and fewer rounds (:data:`SHORTENED`), every option they show still given.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.test_docs import DOCUMENTS, REPO, shown_commands

BIN = Path(sys.executable).parent
REFERENCE_GRAPH = REPO.parent / "shared" / "bench" / "poet_graphs" / "resnet18_cifar_a72.json"

# what a real machine's paths stand for in the sandbox (longest first: each is replaced once)
SANDBOX_PATHS = [
    ("sudo -u poet-server /opt/poet-server/venv/bin/poet-edge", "poet-edge"),
    ("sudo poet-edge", "poet-edge"),
    ("/var/lib/poet-server", "{sandbox}/server-data"),
    ("/etc/poet-server/flower", "{sandbox}/flower"),
    ("/etc/poet-agent/agent.toml", "{device}/agent.toml"),
    ("/mnt/sd/swap", "{sandbox}/swap"),
    ("../shared/bench/poet_graphs/resnet18_cifar_a72.json", "{sandbox}/reference-graph.json"),
    ("GRAPH.json", "{sandbox}/reference-graph.json"),
    ("--port 8080", "--port {port}"),
]

# lines no test runs on the machine it runs on, and what runs them instead
RUN_ELSEWHERE = {
    "make demo": "tests/test_demo.py",  # poet-edge demo, after the install make does
    "make test": ".ci/run",
    "pip install": ".ci/run",  # installs the same extras from constraints.txt
    "sudo deploy/install.sh": "tests/deploy/test_install.py",  # into a scratch root, with --uninstall
    "sudoedit ": "deploy/agent.example.toml",  # an editor; tests/deploy checks the example config loads
    "journalctl ": "tests/deploy/test_unit.py",  # a device's journal; the units are checked there
    "sudo python3 -m venv /opt/poet-server": "tests/deploy/test_unit.py",
    "sudo /opt/poet-server/venv/bin/pip": "tests/deploy/test_unit.py",
    "echo 'u poet-server": "tests/deploy/test_unit.py",
    "sudo systemd-sysusers": "tests/deploy/test_unit.py",
    "sudo install -m 0644 deploy/poet-server.service": "tests/deploy/test_unit.py",
    "sudo systemctl": "tests/deploy/test_unit.py",
    "sed -e 's/--port 8080/--port 8081/'": "tests/deploy/test_unit.py",  # writes a unit into /etc
}

# lines that need what a sandbox has not: (exit code, what the message must tell the user)
FAILS_HERE = {
    # no fleet is up here; tests/test_flower_deployment.py federates a real one
    "poet-edge server federate": (2, "no SuperLink connection in"),
    # the docs' example names a data set downloaded elsewhere
    "poet-edge simulate --dataset femnist": (2, "is not a saved data set"),
    # the docs' example device; the sandbox enrols none
    "poet-edge server revoke pi-17": (2, "no device is named 'pi-17'"),
    # a SuperNode key is registered with a running SuperLink; tests/test_flower_deployment.py registers them
    "poet-edge server supernode": (2, "no SuperLink connection in"),
}

# lines that reproduce a published figure over hours on 2 cores: run with these options added (the last one
# given wins), so every option the line shows is exercised, over one seed and fewer rounds
SHORTENED = {
    "poet-edge simulate --personalization all": "--seeds 1 --rounds 2",
    "poet-edge simulate --devices 1000": "--seeds 1 --rounds 2",
}

# lines that serve until stopped: started, asked whether they answer, stopped with SIGTERM
SERVES = ("poet-edge server run",)

LINE_TIMEOUT = 1800  # seconds one line may run

# documents whose lines take minutes (solves to a time limit, whole fleet simulations)
SLOW = {"docs/planning.md", "docs/federation.md"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sandboxed(line: str, sandbox: Path, port: int) -> str:
    for real, here in SANDBOX_PATHS:
        line = line.replace(real, here.format(sandbox=sandbox, port=port, device=sandbox / "device"))
    return line


def _classify(line: str) -> str:
    if line.startswith(tuple(RUN_ELSEWHERE)):
        return "elsewhere"
    return "run"


def _runs_here(name: str) -> bool:
    return any(_classify(line) == "run" for line in shown_commands(REPO / name)) or bool(_python_blocks(REPO / name))


def _document_ids() -> list[str]:
    return [str(d.relative_to(REPO)) for d in DOCUMENTS if shown_commands(d) or _python_blocks(d)]


def _python_blocks(document: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", document.read_text(), re.S)


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A device's folder: its agent config, its data and a personalized model (a federated round's outcome,
    made by the real ClientApp), and the key its SuperNode made.  The documents only read it."""
    directory = tmp_path_factory.mktemp("device")
    _device_with_a_personalized_model(directory)
    from agent.federated.supernode import ensure_key

    ensure_key(directory / "supernode.key")
    return directory


@pytest.fixture
def sandbox(tmp_path: Path, device: Path) -> Path:
    """The scratch machine: a reference graph, a swap folder, the device's folder, and the server's key
    folder holding the public key a device's SuperNode made."""
    graph = tmp_path / "reference-graph.json"
    if REFERENCE_GRAPH.exists():
        shutil.copy(REFERENCE_GRAPH, graph)
    else:  # a clean clone without ../shared: the walkthrough's stand-in graph
        from demo.walkthrough import synthetic_graph

        synthetic_graph().save(graph)
    (tmp_path / "swap").mkdir()
    (tmp_path / "flower").mkdir()
    (tmp_path / "device").symlink_to(device)
    for folder in (tmp_path, tmp_path / "flower"):  # the docs register it after `cd /etc/poet-server/flower`
        shutil.copy(device / "supernode.key.pub", folder / "supernode.key.pub")
    return tmp_path


def _device_with_a_personalized_model(directory: Path) -> None:
    pytest.importorskip("flwr")
    from tests.test_flower_apps import Device, weights_message

    from agent.digits import write_device_data
    from demo.devices import FakeDevice, write_config

    data = write_device_data(directory / "digits.npz", 1, 3)
    path = write_config(directory, FakeDevice(directory / "root"), data, "agent.digits:digits_workload", "16x1x8x8",
                        device_name="pi-kitchen", training_memory_budget="12MB")
    device = Device(0, node_config={"agent-config": str(path.resolve()), "device-name": "pi-kitchen"},
                    personalization="finetune")
    from flwr.app import ConfigRecord, RecordDict

    initial = device.ask("query.initial", RecordDict({"config": ConfigRecord()})).content["arrays"]
    device.ask("train.personalize", weights_message(initial, **{"finetune-steps": 2, "global-version": 1}))


def _run_line(line: str, cwd: Path, environment: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``line`` in its own process group: past the time limit the whole group is asked to stop (SIGTERM:
    a simulation then stops its SuperLink and Ray), then killed, not the shell alone."""
    process = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=environment, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate("correct horse battery staple\n", timeout=LINE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
        pytest.fail(f"`{line}` ran past {LINE_TIMEOUT} s")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _serve(line: str, cwd: Path, environment: dict[str, str], port: int) -> None:
    process = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert process.poll() is None, f"`{line}` ended with {process.returncode}:\n{process.stdout.read()}"
                time.sleep(0.3)
        else:
            pytest.fail(f"`{line}` did not answer on port {port} within 90 s")
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, f"`{line}` did not stop cleanly on SIGTERM ({process.returncode}):\n{output}"


def run_document(document: Path, sandbox: Path) -> list[str]:
    """Run ``document``'s shell lines in order in ``sandbox``; returns the lines it ran."""
    port = _free_port()
    environment = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
                   "MPLBACKEND": "Agg"}
    cwd, ran = sandbox, []
    for shown in shown_commands(document):
        if _classify(shown) == "elsewhere":
            continue
        line = _sandboxed(shown, sandbox, port)
        assert not re.search(r"/(etc|var|opt|mnt)/", line), f"{document.relative_to(REPO)}: `{shown}` would touch this machine"
        if line.startswith("cd "):
            cwd = Path(line[3:].strip())
            continue
        ran.append(shown)
        if line.startswith(SERVES):
            _serve(line, cwd, environment, port)
            continue
        shorter = next((extra for k, extra in SHORTENED.items() if line.startswith(k)), None)
        result = _run_line(f"{line} {shorter}" if shorter else line, cwd, environment)
        expected = next((v for k, v in FAILS_HERE.items() if line.startswith(k)), None)
        if expected is None:
            assert result.returncode == 0, \
                f"{document.relative_to(REPO)}: `{shown}` exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        else:
            code, message = expected
            assert (result.returncode, message in result.stderr) == (code, True), \
                f"{document.relative_to(REPO)}: `{shown}` should fail with {code} saying {message!r}; got {result.returncode}:\n" \
                f"{result.stderr[-2000:]}"
            assert "Traceback" not in result.stderr
    return ran


def run_python_blocks(document: Path, sandbox: Path) -> int:
    """Run ``document``'s Python examples in ``sandbox``, each with what it names but does not make."""
    blocks = _python_blocks(document)
    cwd = os.getcwd()
    os.chdir(sandbox)
    try:
        for block in blocks:
            code = _sandboxed(block, sandbox, 0)
            exec(compile(_prelude(code) + code, f"{document.relative_to(REPO)} example", "exec"), {})
    finally:
        os.chdir(cwd)
    return len(blocks)


def _prelude(code: str) -> str:
    """What an example takes as given: the graph file it loads; for the executor's, a model and its schedule."""
    lines = ["import shutil", "shutil.copy('reference-graph.json', 'graph.json')"]
    if "Executor(" in code:
        lines += ["import torch", "from schedules import DeviceProfile, plan",
                  "from engine.extract import extract",
                  "torch.manual_seed(0)",
                  "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),"
                  " torch.nn.ReLU(), torch.nn.Linear(64, 10))",
                  "inputs, targets = torch.randn(16, 32), torch.randint(0, 10, (16,))",
                  "loss_fn = torch.nn.CrossEntropyLoss()",
                  "_graph, _ = extract(model, (inputs, targets), loss_fn)",
                  "schedule = plan(_graph, device=DeviceProfile.builtin('rpi4'), time_limit=30).schedule"]
    return "\n".join(lines) + "\n"


def test_every_shown_line_is_run_here_or_named_with_what_runs_it() -> None:
    for document in DOCUMENTS:
        for line in shown_commands(document):
            if _classify(line) == "elsewhere":
                runner = next(v for k, v in RUN_ELSEWHERE.items() if line.startswith(k))
                assert (REPO / runner).exists(), f"{document.relative_to(REPO)}: `{line}` is said to run in {runner}: not there"
    shown = [line for d in DOCUMENTS for line in shown_commands(d)]
    stale = [k for k in RUN_ELSEWHERE if not any(line.startswith(k) for line in shown)]
    stale += [k for k in [*FAILS_HERE, *SHORTENED]
              if not any(_sandboxed(line, Path("/x"), 1).startswith(k) for line in shown)]
    assert not stale, f"no document shows these lines any more: {stale}"


@pytest.mark.parametrize("name", [n for n in _document_ids() if n not in SLOW and _runs_here(n)])
def test_the_documents_commands_run(name: str, sandbox: Path) -> None:
    ran = run_document(REPO / name, sandbox)
    examples = run_python_blocks(REPO / name, sandbox)
    assert ran or examples


@pytest.mark.slow
@pytest.mark.timeout(4 * 3600)  # the federation page's commands are the fleet simulations its figures come from
@pytest.mark.parametrize("name", [n for n in _document_ids() if n in SLOW])
def test_the_slow_documents_commands_run(name: str, sandbox: Path) -> None:
    ran = run_document(REPO / name, sandbox)
    examples = run_python_blocks(REPO / name, sandbox)
    assert ran or examples
