"""``poet-edge server``: the operator commands in-process, and ``server run`` as a real process on loopback."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import psutil
from fastapi.testclient import TestClient

from common.cli import main
from common.exit_codes import ExitCode
from server.api import create_app
from server.config import ServerSettings
from tests.server.conftest import heartbeat
from tests.server.processes import REPO, WITHOUT_DEVICE_LIBRARIES, get, running_server, wait_until_serving


def test_enrol_token_prints_a_token_a_device_can_use_once(tmp_path, capsys) -> None:
    data = tmp_path / "server"
    assert main(["server", "enrol-token", "--data-dir", str(data), "--expires", "10m"]) == ExitCode.OK
    out, err = capsys.readouterr()
    token = out.strip()
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", token) and "single-use" in err
    client = TestClient(create_app(ServerSettings(data_dir=data)))
    body = {"enrolment_token": token, "device_name": "pi-1"}
    assert client.post("/api/v1/enrol", json=body).status_code == 201
    assert client.post("/api/v1/enrol", json={**body, "device_name": "pi-2"}).status_code == 401


def test_revoke_refuses_the_device_and_unknown_names_are_usage_errors(tmp_path, capsys) -> None:
    data = tmp_path / "server"
    client = TestClient(create_app(ServerSettings(data_dir=data)))
    main(["server", "enrol-token", "--data-dir", str(data)])
    token = capsys.readouterr().out.strip()
    device_token = client.post("/api/v1/enrol", json={"enrolment_token": token, "device_name": "pi-1"}).json()
    headers = {"Authorization": f"Bearer {device_token['device_token']}"}
    assert main(["server", "revoke", "pi-1", "--data-dir", str(data)]) == ExitCode.OK
    assert "revoked pi-1" in capsys.readouterr().out
    assert client.post("/api/v1/heartbeats", json=heartbeat(), headers=headers).status_code == 401
    assert main(["server", "revoke", "pi-1", "--data-dir", str(data)]) == ExitCode.OK
    assert "already" in capsys.readouterr().out
    assert main(["server", "revoke", "pi-404", "--data-dir", str(data)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.strip() == "poet-edge server: error: no device is named 'pi-404'"


def test_bad_options_and_unusable_places_exit_with_one_line(tmp_path, capsys) -> None:
    assert main(["server", "enrol-token", "--expires", "forever", "--data-dir", str(tmp_path)]) == ExitCode.USAGE
    capsys.readouterr()
    (tmp_path / "file").write_text("")
    assert main(["server", "enrol-token", "--data-dir", str(tmp_path / "file" / "x")]) == ExitCode.BAD_FILE
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["server", "run", "--data-dir", str(tmp_path / "d"), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_server_run_serves_the_key_and_metrics_and_stops_on_sigterm(server_process) -> None:
    process, url, data, printed_key_id, log = server_process
    wait_until_serving(url)
    status, _, body = get(url + "/api/v1/server-key")
    key = json.loads(body)
    assert status == 200 and key["key_id"] == printed_key_id and "BEGIN PUBLIC KEY" in key["public_key"]
    assert (data / "keys" / "server-signing.pub").read_text() == key["public_key"]
    status, headers, body = get(url + "/metrics")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert "poet_server_devices 0.0" in text and "_created" not in text
    assert 'route="/api/v1/server-key"' in text
    workers = psutil.Process(process.pid).children(recursive=True)
    assert workers, "a planner process should be running beside the server"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert "Traceback" not in log.read_text()


def test_raw_path_tricks_over_the_wire_are_404(server_process) -> None:
    _, url, _, _, _ = server_process
    wait_until_serving(url)
    host, port = url.removeprefix("http://").split(":")
    for path in ("/api/v1/schedules/../../etc/passwd", "/api/v1/../../../etc/passwd", "//etc/passwd",
                 "/api/v1/schedules/%2e%2e%2f%2e%2e%2fetc%2fpasswd"):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.request("GET", path, headers={"Authorization": "Bearer x"})
        response = connection.getresponse()
        body = response.read()
        connection.close()
        assert response.status in (401, 404), (path, response.status)
        assert b"root:" not in body


def test_concurrent_heartbeats_over_the_wire_all_succeed(server_process, capsys) -> None:
    _, url, data, _, _ = server_process
    wait_until_serving(url)
    assert main(["server", "enrol-token", "--data-dir", str(data)]) == ExitCode.OK  # beside the running server
    token = capsys.readouterr().out.strip()
    request = urllib.request.Request(url + "/api/v1/enrol", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"enrolment_token": token, "device_name": "pi-1"}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        device_token = json.loads(response.read())["device_token"]
    codes: list[int] = []

    def send(n: int) -> None:
        for i in range(n):
            beat = urllib.request.Request(url + "/api/v1/heartbeats", method="POST",
                                          data=json.dumps(heartbeat(steps_done=i)).encode(),
                                          headers={"Content-Type": "application/json",
                                                   "Authorization": f"Bearer {device_token}"})
            with urllib.request.urlopen(beat, timeout=30) as response:
                codes.append(response.status)

    threads = [threading.Thread(target=send, args=(20,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert codes == [204] * 160
    _, _, body = get(url + "/metrics")
    assert "poet_server_heartbeats_received_total 160.0" in body.decode()


def test_a_server_killed_outright_takes_its_planner_processes_with_it(server_process) -> None:
    process, url, _, _, _ = server_process
    wait_until_serving(url)
    deadline = time.monotonic() + 30
    while not (workers := psutil.Process(process.pid).children(recursive=True)):
        assert time.monotonic() < deadline, "no planner process started"
        time.sleep(0.1)
    process.kill()  # SIGKILL: the server cannot stop them itself
    process.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert alive == [], f"orphaned: {[p.cmdline() for p in alive]}"


def _bad_token_codes(url: str, forwarded_for: Callable[[int], str], attempts: int) -> list[int]:
    codes = []
    for i in range(attempts):
        request = urllib.request.Request(url + "/api/v1/heartbeats", data=b"[]", method="POST",
                                         headers={"Authorization": "Bearer wrong", "Content-Type": "application/json",
                                                  "X-Forwarded-For": forwarded_for(i)})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                codes.append(answer.status)
        except urllib.error.HTTPError as error:
            codes.append(error.code)
    return codes


def test_a_client_cannot_pick_the_address_its_failures_count_under(tmp_path: Path) -> None:
    """Without --trusted-proxy, X-Forwarded-For is ignored: a guesser sending a new address with every try is
    limited all the same (30 failures a minute)."""
    with running_server(tmp_path) as server:
        wait_until_serving(server.url)
        codes = _bad_token_codes(server.url, lambda i: f"198.51.100.{i}", 31)
    assert codes == [401] * 30 + [429]


def test_behind_a_trusted_proxy_each_forwarded_client_is_counted_apart(tmp_path: Path) -> None:
    with running_server(tmp_path, "--trusted-proxy", "127.0.0.1") as server:
        wait_until_serving(server.url)
        one = _bad_token_codes(server.url, lambda i: "198.51.100.7", 31)
        other = _bad_token_codes(server.url, lambda i: "198.51.100.8", 1)
    assert one == [401] * 30 + [429] and other == [401]


def test_a_trusted_proxy_that_is_no_address_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_DEVICE_LIBRARIES, "server", "run", "--data-dir",
                           str(tmp_path / "s"), "--port", "0", "--trusted-proxy", "proxy.example"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "trusted proxy 'proxy.example' is not an IP address" in done.stderr


def test_an_operator_imports_a_pretrained_model_and_exports_it_back(tmp_path: Path, capsys) -> None:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    data = tmp_path / "server"
    rng = np.random.default_rng(0)
    pretrained = {"wte.weight": rng.standard_normal((16, 4), dtype=np.float32),
                  "ln.bias": rng.standard_normal(4, dtype=np.float32)}
    save_file(pretrained, str(tmp_path / "vendor.safetensors"))

    assert main(["server", "versions", "import", str(tmp_path / "vendor.safetensors"), "--model", "gpt2",
                 "--data-dir", str(data)]) == ExitCode.OK
    assert main(["server", "versions", "--data-dir", str(data)]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "v1\timported from" in out and "--from-version 1" in out
    assert "v1\trun import round 0\tfrom -" in out and "\tgpt2 " in out
    assert main(["server", "versions", "export", "latest", "--out", str(tmp_path / "v1.safetensors"),
                 "--data-dir", str(data)]) == ExitCode.OK
    back = load_file(str(tmp_path / "v1.safetensors"))
    assert set(back) == set(pretrained) and all(np.array_equal(back[k], v) for k, v in pretrained.items())
    # a pickle is refused, and so is a version that is not stored, each saying what to do
    (tmp_path / "vendor.pt").write_bytes(b"\x80\x04.")
    assert main(["server", "versions", "import", str(tmp_path / "vendor.pt"), "--model", "gpt2",
                 "--data-dir", str(data)]) == ExitCode.BAD_FILE
    assert main(["server", "versions", "export", "7", "--out", str(tmp_path / "v7.npz"),
                 "--data-dir", str(data)]) == ExitCode.BAD_FILE
    err = capsys.readouterr().err
    assert "convert it to safetensors" in err and "no global model version 7" in err
    assert not (tmp_path / "v7.npz").exists()
