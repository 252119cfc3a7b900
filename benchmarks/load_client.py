"""The load generator of :mod:`benchmarks.server_load`: simulated devices speaking HTTP/1.1 over a keep-alive pool.

Each simulated device is a coroutine: starting at its own phase within the
heartbeat period (phases spread uniformly), it posts a heartbeat every
``period`` seconds and, on every ``fetch_every``-th heartbeat, asks for its
schedule with ``If-None-Match`` (a 304 is the expected answer).  Operators
(:func:`run_operators`) watch the fleet table as the dashboard's page does:
every ``operator_period`` seconds a page of 50 rows, sorted and filtered,
first whole and then as the page's live refresh asks for it (with a cursor:
only the rows changed since).  Devices
share one pool of keep-alive connections per server (:class:`ConnectionPool`),
not a connection each: ten thousand sockets would measure the kernel's and
uvicorn's connection handling rather than the API.

The client is a small hand-written HTTP/1.1 client over asyncio streams
(uvloop's loop where installed): httpx's asynchronous client costs about a
millisecond of CPU per request, which on a machine whose cores are shared
with the server would make the load generator the bottleneck.  Latency is
measured per request from the moment a device asks the pool for a connection
(so waiting for a free one counts) to the last byte of the answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

REQUEST_TIMEOUT_SECONDS = 10.0
IDLE_REUSE_SECONDS = 3.0  # uvicorn closes a connection idle for 5 s; one idle this long is not reused


@dataclass(frozen=True)
class SimulatedDevice:
    """An enrolled device: its token and the server it talks to (an index into the pools)."""

    name: str
    token: str
    server: int


@dataclass(frozen=True)
class SimulatedOperator:
    """A signed-in operator: its session cookie and the server whose dashboard it watches."""

    cookie: str
    server: int


# What operators look at: pages of 50 rows, sorted and filtered in the database.
FLEET_VIEWS = ("status=online&sort=steps", "state=training&sort=energy", "status=offline&sort=last_seen",
               "q=sim-00&sort=name&order=desc", "state=waiting&sort=last_seen", "sort=steps&order=asc")
REFRESHES_PER_VIEW = 4  # live refreshes of a view (with a cursor) before the operator changes it


@dataclass
class LoadPlan:
    """What every device does, and the measured window (``loop.time()`` seconds)."""

    period: float
    fetch_every: int
    schedule_id: str
    start: float
    measure_from: float
    measure_to: float


@dataclass
class Samples:
    """What the window saw: per-request latencies (s) by kind, errors by cause, how late devices woke (s)."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {"heartbeat": [], "schedule": [],
                                                                       "fleet page": []})
    errors: dict[str, int] = field(default_factory=dict)
    wake_lag: list[float] = field(default_factory=list)

    def error(self, cause: str) -> None:
        self.errors[cause] = self.errors.get(cause, 0) + 1


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = time.monotonic()

    def stale(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing() or time.monotonic() - self.used > IDLE_REUSE_SECONDS

    def close(self) -> None:
        self.writer.close()


class ConnectionPool:
    """At most ``size`` keep-alive connections to one server; the most recently used one is taken first."""

    def __init__(self, host: str, port: int, size: int) -> None:
        self.host, self.port, self.size = host, port, size
        self._idle: list[_Connection] = []
        self._open = 0
        self._freed = asyncio.Condition()

    async def request(self, head: bytes, body: bytes = b"") -> int:
        """Send one request (``head`` ends with the blank line) and read the whole answer; its status code."""
        connection = await self._acquire()
        try:
            connection.writer.write(head + body)
            status, keep = await _read_response(connection.reader)
        except BaseException:
            connection.close()
            await self._release(None)
            raise
        connection.used = time.monotonic()
        if not keep:
            connection.close()
        await self._release(connection if keep else None)
        return status

    async def _acquire(self) -> _Connection:
        async with self._freed:
            while True:
                while self._idle:
                    connection = self._idle.pop()
                    if not connection.stale():
                        return connection
                    connection.close()
                    self._open -= 1
                if self._open < self.size:
                    self._open += 1
                    break
                await self._freed.wait()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except BaseException:
            async with self._freed:
                self._open -= 1
                self._freed.notify()
            raise
        return _Connection(reader, writer)

    async def _release(self, connection: _Connection | None) -> None:
        async with self._freed:
            if connection is None:
                self._open -= 1
            else:
                self._idle.append(connection)
            self._freed.notify()

    def close(self) -> None:
        """Close every idle connection."""
        for connection in self._idle:
            connection.close()
        self._idle.clear()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Status and whether the connection stays open, after reading (and dropping) the body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    keep = b"\r\nconnection: close" not in lower
    if status in (204, 304) or 100 <= status < 200:
        return status, keep
    if b"\r\ntransfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return status, keep
    marker = lower.find(b"\r\ncontent-length:")
    if marker < 0:
        await reader.read()  # delimited by the end of the connection
        return status, False
    length = int(lower[marker + 17:lower.index(b"\r\n", marker + 2)])
    await reader.readexactly(length)
    return status, keep


def heartbeat_body(steps_done: int) -> bytes:
    """A heartbeat as the agent sends it (the fields of the agent's status)."""
    return json.dumps({"state": "training", "reason": "idle and charging", "steps_done": steps_done,
                       "sent_at": time.time(), "software_version": "0.1.0", "loss": 0.5, "energy_j": 3.25,
                       "eligibility": [{"name": "power", "eligible": True, "reason": "on mains"}]}).encode()


async def run_devices(devices: list[SimulatedDevice], pools: list[ConnectionPool], plan: LoadPlan,
                      samples: Samples) -> None:
    """Run every device until the window ends, adding the requests that began inside the window to ``samples``."""
    await asyncio.gather(*(_device(i, device, pools[device.server], plan, samples, len(devices))
                           for i, device in enumerate(devices)))


async def _device(index: int, device: SimulatedDevice, pool: ConnectionPool, plan: LoadPlan, samples: Samples,
                  count: int) -> None:
    loop = asyncio.get_running_loop()
    host = f"Host: {pool.host}:{pool.port}\r\nAuthorization: Bearer {device.token}\r\n"
    beat_head = f"POST /api/v1/heartbeats HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
    fetch_head = (f"GET /api/v1/schedules/{plan.schedule_id} HTTP/1.1\r\n{host}"
                  f"If-None-Match: \"{plan.schedule_id}\"\r\n\r\n").encode()
    due = plan.start + plan.period * index / count  # phases spread uniformly over one period
    beat = 0
    while due < plan.measure_to:
        await asyncio.sleep(due - loop.time())
        measured = plan.measure_from <= due
        if measured:
            samples.wake_lag.append(loop.time() - due)
        body = heartbeat_body(beat)
        head = f"{beat_head}Content-Length: {len(body)}\r\n\r\n".encode()
        await _timed(pool, "heartbeat", head, body, 204, measured, samples)
        if (beat + index) % plan.fetch_every == 0:
            await _timed(pool, "schedule", fetch_head, b"", 304, measured, samples)
        beat += 1
        due += plan.period


async def run_operators(operators: list[SimulatedOperator], pools: list[ConnectionPool], plan: LoadPlan,
                        period: float, samples: Samples) -> None:
    """Run every operator until the window ends, adding to ``samples`` (kind ``fleet page``)."""
    await asyncio.gather(*(_operator(i, operator, pools[operator.server], plan, period, samples, len(operators))
                           for i, operator in enumerate(operators)))


async def _operator(index: int, operator: SimulatedOperator, pool: ConnectionPool, plan: LoadPlan, period: float,
                    samples: Samples, count: int) -> None:
    loop = asyncio.get_running_loop()
    headers = f"Host: {pool.host}:{pool.port}\r\nCookie: poet_session={operator.cookie}\r\nAccept: application/json\r\n"
    due = plan.start + period * index / count
    shown = 0
    while due < plan.measure_to:
        await asyncio.sleep(due - loop.time())
        view = FLEET_VIEWS[(shown // (REFRESHES_PER_VIEW + 1) + index) % len(FLEET_VIEWS)]
        page = 1 + (shown // (REFRESHES_PER_VIEW + 1) * 7 + index) % 20
        refresh = shown % (REFRESHES_PER_VIEW + 1)
        since = f"&since={time.time() - period - 5:.3f}" if refresh else ""  # the previous answer's cursor
        head = f"GET /dashboard/fleet.json?{view}&page={page}{since} HTTP/1.1\r\n{headers}\r\n".encode()
        await _timed(pool, "fleet page", head, b"", 200, plan.measure_from <= due, samples)
        shown += 1
        due += period


async def _timed(pool: ConnectionPool, kind: str, head: bytes, body: bytes, expected: int, measured: bool,
                 samples: Samples) -> None:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
            status = await pool.request(head, body)
    except TimeoutError:
        cause = f"{kind}: no answer within {REQUEST_TIMEOUT_SECONDS:g} s"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        cause = f"{kind}: {type(exc).__name__}"
    else:
        cause = None if status == expected else f"{kind}: HTTP {status}"
    if measured:
        samples.latencies[kind].append(time.perf_counter() - started)
        if cause is not None:
            samples.error(cause)
