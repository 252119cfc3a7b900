"""The fleet server's seams in the agent: schedules from the server, heartbeats to it (device API v1, HTTP).

::

    FleetClient            the device API as this device: enrols once, then calls with its bearer token
    ServerScheduleSource   a ScheduleSource: uploads graph, profile and budgets, waits for the solve, downloads
                           the signed schedule (ETag), verifies it against the PINNED key and the graph
    FallbackSource         tries sources in order, moving on only while one is unreachable
    HeartbeatQueue         heartbeats on disk (JSON lines, bounded, oldest dropped), readable after a kill -9
    HeartbeatReporter      a Reporter: queues every status; a background thread delivers the queue

Devices sit behind NAT: they push, the server never calls them.  The server
being away never stops training: the cached schedule or a local solve takes
its place (and the preparing reason says so), and heartbeats wait on disk.
The agent trusts only the server key the operator copied to the device
(``server.public_key``), never one it got over the network.

Errors (:mod:`agent.errors`), converted where httpx raises them
(``raise FleetUnavailableError(...) from exc``): :class:`FleetError` a refusal,
:class:`FleetUnavailableError` unreachable, timed out, 5xx or 429 (the cache or
a local solve stands in, heartbeats stay queued), :class:`FleetAuthError` no
accepted token (enrolment token refused, name taken, revoked).

This module never imports torch: the daemon runs the reporter in its own
(small) process.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
import ssl
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import httpx
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from agent.config import AgentConfig
from agent.schedule_sources import NoReporter, Reporter, Request, ScheduleSource
from agent.errors import FleetAuthError, FleetError, FleetUnavailableError
from agent.monitors.network import NetworkMonitor
from schedules.errors import FormatError, InfeasibleBudgetError, PlannerError, SolverError
from common.files import write_atomically
from common.version import software_version
from schedules.schedule import Schedule
from schedules.signing import key_id, load_public_key

log = logging.getLogger("poet-agent")

API = "/api/v1"
SOLVE_WAIT_MARGIN_SECONDS = 30.0  # beyond the solve's time limit: the server's queue, signing, round trips
POLL_FIRST_SECONDS, POLL_MAX_SECONDS = 0.5, 5.0
HEARTBEAT_BATCH = 500  # the most heartbeats the server takes in one POST
RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS = 5.0, 300.0
_IDENTIFIER = re.compile(r"[A-Za-z0-9_-]{1,128}")  # request and schedule ids: safe in a URL and a file name


# -- the client ------------------------------------------------------------------------------------------------
class FleetClient:
    """The fleet server's device API v1, as one device.

    The device token is read from ``token_path`` (mode 0600); without one the
    ``enrolment_token`` is exchanged for it at the first call (once: another
    process of this agent enrolling at the same moment waits on a file lock
    and reads the token it stored).  Every httpx error and every refusal
    becomes a :class:`FleetError` here.
    """

    def __init__(self, url: str, *, device_name: str, token_path: Path, public_key: Any,
                 enrolment_token: str = "", timeout: float = 10.0, ca_file: Path | None = None,
                 network: NetworkMonitor | None = None) -> None:
        self.url = url.rstrip("/")
        self.device_name = device_name
        self.token_path = Path(token_path)
        self.public_key = public_key  # pinned: verifies schedules; only compared with what the server says it has
        self.enrolment_token = enrolment_token
        self.timeout = timeout
        self.ca_file = ca_file
        self.network = network  # the [network] condition every request waits for (None: any network)
        self._http: httpx.Client | None = None
        self._token: str | None = None

    @classmethod
    def from_config(cls, config: AgentConfig) -> FleetClient:
        """The client ``[server]`` describes (``load_config`` has checked it)."""
        s = config.server
        return cls(s.url, device_name=config.device.name, token_path=config.device_token_path,
                   public_key=load_public_key(s.public_key), enrolment_token=s.enrolment_token,
                   timeout=s.timeout_seconds, ca_file=s.ca_file, network=config.network_monitor())

    def call(self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
             ok: tuple[int, ...] = ()) -> httpx.Response:
        """An authenticated request to ``API + path``; returns a 2xx answer or one whose status is in ``ok``."""
        response = self._send(method, path, body, {**(headers or {}), "Authorization": f"Bearer {self.token()}"})
        if response.status_code == 401:
            raise FleetAuthError(
                f"revoked by the fleet server: {self.url} refused the token of device {self.device_name!r} "
                f"(HTTP 401). Ask the operator; to enrol again, delete {self.token_path} and set a new "
                "server.enrolment_token (`poet-edge server enrol-token`)", 401)
        return self._checked(response, method, path, ok)

    def token(self) -> str:
        """This device's token: stored, or got now by enrolling."""
        if self._token is None:
            self._token = self._stored_token() or self._enrol()
        return self._token

    def close(self) -> None:
        """Close the connections (a later call opens new ones)."""
        if self._http is not None:
            self._http.close()
            self._http = None

    # -- enrolment -------------------------------------------------------------------
    def _enrol(self) -> str:
        self.token_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(self.token_path.with_name("enrol.lock")):
            stored = self._stored_token()  # another process of this agent may have enrolled meanwhile
            if stored:
                return stored
            if not self.enrolment_token:
                raise FleetAuthError(f"no device token in {self.token_path} and no server.enrolment_token to enrol "
                                     "with: ask the operator for one (`poet-edge server enrol-token`)")
            response = self._send("POST", "/enrol", {"enrolment_token": self.enrolment_token,
                                                     "device_name": self.device_name}, {})
            self._refuse_enrolment(response)
            answer = _object(self._checked(response, "POST", "/enrol"), self.url)
            token = answer.get("device_token")
            if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token):
                raise FleetError(f"the fleet server {self.url} enrolled {self.device_name!r} but sent no usable "
                                 "device token")
            write_atomically(self.token_path, token.encode() + b"\n")
            self._compare_keys(answer.get("server_public_key"))
            log.info("enrolled with the fleet server %s as %r", self.url, self.device_name)
            return token

    def _refuse_enrolment(self, response: httpx.Response) -> None:
        if response.status_code == 401:
            raise FleetAuthError(
                f"the fleet server {self.url} refused server.enrolment_token (unknown, already used or expired): "
                "ask the operator for a new one with `poet-edge server enrol-token` and put it in "
                "server.enrolment_token", 401)
        if response.status_code == 409:
            raise FleetAuthError(
                f"the fleet server {self.url} already has a device named {self.device_name!r}: choose another "
                f"device.name, or ask the operator to revoke the old one (`poet-edge server revoke "
                f"{self.device_name}`)", 409)

    def _compare_keys(self, pem: Any) -> None:
        """Warn when the server names another signing key than the pinned one (its schedules will be refused)."""
        try:
            theirs = key_id(load_pem_public_key(pem.encode()))  # type: ignore[arg-type]
        except (AttributeError, ValueError, TypeError):
            return
        if theirs != key_id(self.public_key):
            log.warning("the fleet server signs with key %s but server.public_key is key %s: its schedules will "
                        "be refused until the operator copies the right key to the device", theirs,
                        key_id(self.public_key))

    def _stored_token(self) -> str | None:
        try:
            return self.token_path.read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise FleetAuthError(f"cannot read the device token {self.token_path}: {exc}") from exc

    # -- HTTP ------------------------------------------------------------------------
    def _send(self, method: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        self._check_network()
        try:
            return self._client().request(method, API + path, json=body, headers=headers)
        except httpx.HTTPError as exc:  # refused, DNS, TLS, timeouts, a broken answer
            raise FleetUnavailableError(f"the fleet server {self.url} is unreachable ({_describe(exc)})") from exc

    def _check_network(self) -> None:
        """Refuse, as if the server were unreachable, while ``[network]`` does not allow this network."""
        if self.network is None:
            return
        verdict = self.network.check()
        if not verdict.eligible:
            raise FleetUnavailableError(f"not using the network: {verdict.reason} ([network] in the config); "
                                        "heartbeats wait on disk, schedules come from the cache or a local solve")

    def _checked(self, response: httpx.Response, method: str, path: str, ok: tuple[int, ...] = ()) -> httpx.Response:
        code = response.status_code
        if 200 <= code < 300 or code in ok:
            return response
        where = f"the fleet server {self.url} ({method} {API}{path})"
        if code == 429 or code >= 500:
            raise FleetUnavailableError(f"{where} answered {code}{_detail(response)}; trying again later", code,
                                        _retry_after(response))
        raise FleetError(f"{where} refused the request: {code}{_detail(response)}", code)

    def _client(self) -> httpx.Client:
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self.ca_file is not None:
                verify = ssl.create_default_context(cafile=str(self.ca_file))
            self._http = httpx.Client(base_url=self.url, timeout=self.timeout, verify=verify,
                                      headers={"User-Agent": f"poet-edge-agent/{software_version()}"})
        return self._http


# -- schedules -------------------------------------------------------------------------------------------------
class ServerScheduleSource:
    """Schedules planned and signed by the fleet server, verified against its pinned key and this graph.

    Downloaded schedules are kept in ``directory`` by the server's schedule
    id, and asked for again with ``If-None-Match``: a 304 reuses the kept
    copy after verifying it once more.
    """

    def __init__(self, client: FleetClient, public_key: Any, directory: str | Path, *, wait_seconds: float,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        if public_key is None:
            raise ValueError("a ServerScheduleSource needs the server's pinned public key")
        self.client = client
        self.public_key = public_key
        self.directory = Path(directory)
        self.wait_seconds = wait_seconds
        self.sleep, self.clock = sleep, clock
        self.description = f"fleet server {client.url}"
        self.cacheable = True

    @classmethod
    def from_config(cls, config: AgentConfig) -> ServerScheduleSource:
        """The source ``[server]`` describes; it waits for a solve up to the solve time limit plus a margin."""
        client = FleetClient.from_config(config)
        return cls(client, client.public_key, config.fleet_dir / "schedules",
                   wait_seconds=config.schedule.solve_time_limit + SOLVE_WAIT_MARGIN_SECONDS)

    def fetch(self, request: Request) -> Schedule:
        """Ask the server to plan ``request``, wait for it, download and verify the schedule."""
        body = {"graph": request.graph.to_dict(), "device": request.device.to_dict(),
                "memory_budget": request.memory_budget, "runtime_budget": request.runtime_budget,
                "training": request.training.to_dict()}
        try:
            answer = _object(self.client.call("POST", "/schedule-requests", body=body), self.client.url)
            schedule_id = self._solved(answer)
            schedule = self._download(schedule_id)
        finally:
            self.client.close()
        try:
            request.check(schedule)
        except (PlannerError, FormatError) as exc:
            raise FleetError(f"the fleet server's schedule {schedule_id} does not fit this request: {exc}") from exc
        return schedule

    def _solved(self, answer: dict[str, Any]) -> str:
        """Poll the request until the server has solved it (backing off 0.5 s -> 5 s); the schedule's id."""
        request_id = _identifier(answer.get("request_id"), "request_id")
        deadline = self.clock() + self.wait_seconds
        delay = POLL_FIRST_SECONDS
        while True:
            status = answer.get("status")
            if status == "done":
                return _identifier(answer.get("schedule_id"), "schedule_id")
            _raise_for_failure(status, answer)
            if status not in ("queued", "solving"):
                raise FleetError(f"the fleet server said request {request_id} is {status!r} (expected queued, "
                                 "solving, done, failed, timed_out or cancelled): is server.url a POET Edge server?")
            if self.clock() + delay > deadline:
                raise FleetUnavailableError(f"the fleet server has not solved request {request_id} within "
                                            f"{self.wait_seconds:g} s (still {status})")
            self.sleep(delay)
            delay = min(POLL_MAX_SECONDS, 2 * delay)
            answer = _object(self.client.call("GET", f"/schedule-requests/{request_id}"), self.client.url)

    def _download(self, schedule_id: str, conditional: bool = True) -> Schedule:
        path = self.directory / f"{schedule_id}.json"
        etag_path = path.with_suffix(".etag")
        headers = {}
        if conditional and path.is_file() and etag_path.is_file():
            headers["If-None-Match"] = etag_path.read_text(encoding="utf-8").strip()
        response = self.client.call("GET", f"/schedules/{schedule_id}", headers=headers, ok=(304,))
        if response.status_code == 304:
            if not headers:
                raise FleetError(f"the fleet server answered 304 for schedule {schedule_id} without being asked "
                                 "about a kept copy")
            try:
                return Schedule.load(path, public_key=self.public_key)
            except (PlannerError, FormatError) as exc:
                log.warning("the kept copy of schedule %s is refused, downloading it again: %s", schedule_id, exc)
                return self._download(schedule_id, conditional=False)
        schedule = Schedule.from_json(response.content, public_key=self.public_key,
                                      what=f"schedule {schedule_id} from the fleet server")
        write_atomically(path, response.content)
        write_atomically(etag_path, (response.headers.get("etag") or f'"{schedule_id}"').encode())
        return schedule


def _raise_for_failure(status: Any, answer: dict[str, Any]) -> None:
    """The PoetEdgeError for a solve the server gave up on (infeasible budgets, a failed, timed-out or cancelled
    solve)."""
    error = answer.get("error") or "no reason given"
    if status == "infeasible" or (status == "failed" and "infeasible" in str(error).lower()):
        raise InfeasibleBudgetError(
            f"the fleet server found no schedule within the budgets ({error}); raise training.memory_budget or "
            "training.runtime_budget (`poet-edge solve` prints the smallest feasible budget)")
    if status == "failed":
        raise SolverError(f"the fleet server's solve failed: {error}")
    if status == "cancelled":  # an operator stopped it: unavailable for now, so a local solve may stand in
        raise FleetUnavailableError(f"the fleet server's solve was cancelled ({error}); it is asked again at the "
                                    "next training window")
    if status == "timed_out":
        seconds = answer.get("solve_seconds")
        after = f" after {seconds:g} s" if isinstance(seconds, (int, float)) else ""
        raise SolverError(f"the fleet server's solve ran past its time limit{after} ({error}); ask the operator "
                          "to raise the server's solve time limit, or raise training.memory_budget")


class FallbackSource:
    """Tries each source in turn, moving to the next only while one is unreachable.

    Any other refusal (a bad signature, an infeasible budget, a revoked
    device) is the answer.  ``say`` tells the preparing reason about each
    fallback; after a fetch, ``description`` names the source that gave the
    schedule and why the ones before it did not.
    """

    def __init__(self, sources: Sequence[ScheduleSource], say: Callable[[str], None] = log.info) -> None:
        if not sources:
            raise ValueError("a FallbackSource needs at least one source")
        self.sources = list(sources)
        self.say = say
        self.cacheable = all(s.cacheable for s in self.sources)
        self.description = ", else ".join(s.description for s in self.sources)

    def fetch(self, request: Request) -> Schedule:
        unreachable: list[str] = []
        for source, following in zip(self.sources, self.sources[1:]):
            try:
                schedule = source.fetch(request)
            except FleetUnavailableError as exc:
                self.say(f"{exc}; falling back to {following.description}")
                unreachable.append(source.description)
                continue
            self.description = source.description
            return schedule
        schedule = self.sources[-1].fetch(request)
        self.description = self.sources[-1].description + "".join(f", {d} unreachable" for d in unreachable)
        return schedule


# -- heartbeats ------------------------------------------------------------------------------------------------
class HeartbeatQueue:
    """Heartbeats waiting for the server, oldest first: JSON lines ``{"seq": N, "heartbeat": {...}}`` in ``path``.

    An append is one ``write`` to the end of the file; compaction and removal
    write a new file beside it and rename it over the old one, so a kill -9
    leaves either file whole.  A line cut short (power lost mid-write, a full
    disk) is skipped when read and dropped at the next rewrite.  At most
    ``limit`` heartbeats are kept (the oldest go); the file is compacted once
    it holds a tenth more, so a long outage does not rewrite it at every
    heartbeat (flash wears).  Safe to use from several threads.
    """

    def __init__(self, path: str | Path, limit: int) -> None:
        self.path = Path(path)
        self.limit = limit
        self._compact_at = limit + max(1, limit // 10)
        self._lock = threading.Lock()
        records, damaged = self._read()
        if damaged:
            log.warning("heartbeat queue %s: %d damaged line(s) skipped", self.path, damaged)
            records = records[-limit:]
            self._rewrite(records)
        self._count = len(records)
        self._next_seq = records[-1][0] + 1 if records else 1

    def append(self, heartbeat: dict[str, Any]) -> None:
        """Queue one heartbeat (dropping the oldest beyond the limit); raises OSError if the disk refuses."""
        with self._lock:
            line = json.dumps({"seq": self._next_seq, "heartbeat": heartbeat}, separators=(",", ":"),
                              allow_nan=False, default=str) + "\n"
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            self._next_seq += 1
            self._count += 1
            if self._count > self._compact_at:
                self._rewrite(self._read()[0][-self.limit:])

    def pending(self, most: int = HEARTBEAT_BATCH) -> list[tuple[int, dict[str, Any]]]:
        """Up to ``most`` of the oldest kept heartbeats, with their sequence numbers."""
        with self._lock:
            return self._read()[0][-self.limit:][:most]

    def remove_through(self, seq: int) -> None:
        """Forget every heartbeat up to sequence number ``seq`` (delivered)."""
        with self._lock:
            self._rewrite([r for r in self._read()[0] if r[0] > seq])

    def __len__(self) -> int:
        with self._lock:
            return min(self._count, self.limit)

    def _read(self) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return [], 0
        records, damaged = [], 0
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                seq, heartbeat = item["seq"], item["heartbeat"]
            except (ValueError, KeyError, TypeError):
                damaged += 1
                continue
            if isinstance(seq, int) and isinstance(heartbeat, dict):
                records.append((seq, heartbeat))
            else:
                damaged += 1
        return records, damaged

    def _rewrite(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        text = "".join(json.dumps({"seq": s, "heartbeat": h}, separators=(",", ":"), default=str) + "\n"
                       for s, h in records)
        write_atomically(self.path, text.encode(), sync_directory=False)
        self._count = len(records)


class HeartbeatReporter:
    """Sends the agent's status to the fleet server, through a queue on disk.

    :meth:`report` only appends to the queue (never blocks on the network);
    a daemon thread delivers the queue as one list, when the state changed
    and otherwise at most every ``interval`` seconds, and forgets what the
    server accepted.  Server unreachable: the queue waits and the thread
    retries, backing off from 5 s to 5 minutes.  Token refused (revoked):
    sending stops, logged once, and :attr:`problem` says why (the supervisor
    puts it into the status' ``last_error``).
    """

    def __init__(self, client: FleetClient, queue: HeartbeatQueue, interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.queue = queue
        self.interval = interval
        self.clock = clock
        self.problem: str | None = None
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._last_state: Any = None
        self._last_wake = -math.inf
        self._retry_at = -math.inf
        self._failures = 0
        self._batch = HEARTBEAT_BATCH
        self._disk_failed = False
        self._thread = threading.Thread(target=self._run, name="poet-heartbeats", daemon=True)
        self._thread.start()

    def report(self, status: dict[str, Any]) -> None:
        """Queue ``status`` as a heartbeat (with ``software_version`` and ``sent_at``) and wake the sender."""
        if self.problem is not None:
            return
        heartbeat = _json_safe({**status, "software_version": software_version(), "sent_at": time.time()})
        try:
            self.queue.append(heartbeat)
            self._disk_failed = False
        except OSError as exc:
            if not self._disk_failed:
                log.warning("cannot queue a heartbeat in %s: %s", self.queue.path, exc)
            self._disk_failed = True
        now = self.clock()
        changed, self._last_state = status.get("state") != self._last_state, status.get("state")
        if changed or now - self._last_wake >= self.interval:
            self._last_wake = now
            self._wake.set()

    def close(self, timeout: float | None = None) -> None:
        """One last delivery unless the server is being waited for, then stop the thread."""
        self._closing.set()
        self._wake.set()
        self._thread.join(self.client.timeout + 1 if timeout is None else timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._retry_at - self.clock() if self._retry_at > self.clock() else None)
            self._wake.clear()
            closing = self._closing.is_set()
            if self.problem is None and self.clock() >= self._retry_at:
                try:
                    self._deliver()
                except Exception as exc:  # the thread must outlive anything: it is the only sender
                    log.exception("delivering heartbeats failed")
                    self._back_off(FleetUnavailableError(str(exc)))
            if closing or self.problem is not None:
                self.client.close()
                return

    def _deliver(self) -> None:
        while self.problem is None and (batch := self.queue.pending(self._batch)):
            try:
                self.client.call("POST", "/heartbeats", body=[heartbeat for _, heartbeat in batch])
            except FleetAuthError as exc:
                self.problem = str(exc)
                log.error("heartbeats stopped: %s", exc)
                return
            except FleetUnavailableError as exc:
                self._back_off(exc)
                return
            except FleetError as exc:
                if exc.status == 413 and self._batch > 1:  # the server takes smaller lists
                    self._batch //= 2
                    continue
                log.warning("the fleet server refused %d heartbeat(s), dropping them: %s", len(batch), exc)
            self.queue.remove_through(batch[-1][0])
            if self._failures:
                log.info("the fleet server is reachable again: queued heartbeats delivered")
            self._failures, self._retry_at = 0, -math.inf

    def _back_off(self, exc: FleetUnavailableError) -> None:
        self._failures += 1
        delay = min(RETRY_MAX_SECONDS, min(self.interval, RETRY_FIRST_SECONDS) * 2 ** min(self._failures - 1, 16))
        self._retry_at = self.clock() + max(delay, exc.retry_after or 0.0)
        if self._failures == 1:
            log.warning("heartbeats wait on disk (%d queued): %s", len(self.queue), exc)


def reporter_from_config(config: AgentConfig) -> Reporter:
    """A :class:`HeartbeatReporter` when ``[server] url`` is set, else :class:`~agent.schedule_sources.NoReporter`."""
    s = config.server
    if not s.url:
        return NoReporter()
    return HeartbeatReporter(FleetClient.from_config(config),
                             HeartbeatQueue(config.fleet_dir / "heartbeats.jsonl", s.queue_limit), s.heartbeat_seconds)


# -- helpers ---------------------------------------------------------------------------------------------------
def _object(response: httpx.Response, url: str) -> dict[str, Any]:
    """A 2xx answer's JSON object; anything else means whatever answered is not the device API."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise FleetUnavailableError(f"{url} answered {response.request.url.path} with something that is not the "
                                    "fleet server's device API (is server.url right?)", response.status_code)
    return answer


def _identifier(value: Any, name: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise FleetError(f"the fleet server sent an unusable {name} {value!r}")
    return value


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    text = detail if isinstance(detail, str) else response.text
    return f" ({text.strip()[:200]})" if text and text.strip() else ""


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as null: strict JSON (a diverged loss must not break the server's parser)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock between this agent's processes (the daemon's reporter and the training worker)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
