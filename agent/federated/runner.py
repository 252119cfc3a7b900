"""The warm ClientApp runner: Flower's per-message ClientApp processes, forked ready-loaded.

Flower starts a fresh ``flwr-clientapp`` process for every message a device
answers, and each one imports Flower and torch and builds the model before it
can train: seconds of a small device's CPU per message.  While the device's
SuperNode runs, the agent also runs this process
(``python -m agent.federated.runner --config FILE --socket PATH``): it loads
Flower's ClientApp program, torch, :mod:`agent.federated.clientapp` and the agent's device
(workload, profile, schedule and data, :func:`agent.federated.clientapp.agent_device`)
once, then listens on a Unix socket.  The launcher installed as
``flwr-clientapp`` on the SuperNode's ``PATH``
(:mod:`agent.federated.launcher`, :func:`agent.federated.supernode.install_launcher`) sends each launch's arguments there;
the runner forks, and the child runs Flower's own ``flwr-clientapp`` entry
point with them (:func:`agent.federated.clientapp.run_clientapp_process`): the same
program, the same protocol and isolation, without the start-up.

Flower's SuperNode creates a message's task before it has pulled the message's
objects (the weights) from the SuperLink, and a ClientApp that asks for an
object too early backs off for a whole second.  A cold ClientApp never gets
there first; a forked one would, so the runner forks once the SuperNode's log
says the message has arrived (:class:`MessageArrival`; after at most
:data:`ARRIVAL_WAIT_SECONDS` it forks anyway).

Fork safety: torch's OpenMP thread pool does not survive a fork (a child that
computes after its parent ran a parallel region hangs), so this process
computes with one thread and each child sets ``workload.threads`` itself.
No gRPC channel or thread of Flower's exists here before a fork: the children
open their own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger("poet-agent")

REQUEST_BYTES = 65536
ARRIVAL_WAIT_SECONDS = 5.0  # from the launch: after it, the ClientApp is forked whatever the log says
ACCEPTED = b"accepted\n"  # the runner's answer to the launcher: it has taken the launch on
FORKED_AFTER = "the SuperNode receiving the message"  # logged with each fork: how long the weights took to come


class MessageArrival:
    """Follows the SuperNode's output: whether the message it is receiving has all its objects yet.

    The SuperNode receives one message at a time and logs ``Receiving: ...`` when it starts and
    ``Received successfully`` (or ``Failed to receive message``) when the objects are in.
    """

    STARTED = "Receiving: "
    ENDED = ("Received successfully", "Failed to receive message")

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = path.stat().st_size if path is not None and path.exists() else 0
        self.receiving = False
        self._partial = b""

    def _update(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace")
            if self.STARTED in text:
                self.receiving = True
            elif any(end in text for end in self.ENDED):
                self.receiving = False

    def wait(self, seconds: float = ARRIVAL_WAIT_SECONDS) -> bool:
        """Wait until no message is half-received; whether that happened within ``seconds``."""
        if self.path is None:
            return True
        deadline = time.monotonic() + seconds
        self._update()
        while self.receiving and time.monotonic() < deadline:
            time.sleep(0.005)
            self._update()
        return not self.receiving


class Runner:
    """Listens on ``socket_path`` and forks one ClientApp per request (see the module docstring)."""

    def __init__(self, config_path: str, socket_path: Path, threads: int, supernode_log: Path | None = None) -> None:
        self.config_path = config_path
        self.socket_path = socket_path
        self.threads = threads
        self.arrival = MessageArrival(supernode_log)
        self.children: set[int] = set()
        self.stopping = False
        self._selector: selectors.BaseSelector | None = None  # serve()'s: a forked ClientApp closes it

    def preload(self) -> None:
        """Import everything a ClientApp needs and build the agent's device, with one compute thread.

        The device's first profile (and its schedule) are made beforehand in a child with the configured
        threads, which this process has not computed with yet: profiled at one thread, the node times the
        planner uses would not be this device's.
        """
        import torch

        from agent.federated import clientapp

        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                torch.set_num_threads(self.threads)
                from agent.config import load_config
                from agent.prepare import prepare

                prepare(load_config(self.config_path))
                code = 0
            except BaseException:
                log.exception("warm ClientApp runner: preparing the device's workload failed")
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError("preparing the device's workload failed (see above)")
        torch.set_num_threads(1)
        clientapp.agent_device(self.config_path)  # the profile and schedule now come from the agent's cache
        clientapp.load_clientapp_program()

    def listen(self) -> socket.socket:
        """The runner's socket, readable and writable by this user only."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            listener.bind(str(self.socket_path))
        finally:
            os.umask(old_umask)
        listener.listen(8)
        return listener

    def serve(self, listener: socket.socket) -> None:
        """Fork a ClientApp for each request until SIGTERM; reap the children as they end."""
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        log.info("warm ClientApp runner ready on %s", self.socket_path)
        parent = os.getppid()
        bound = os.stat(self.socket_path).st_ino
        self._selector = selector
        try:
            while not self.stopping and os.getppid() == parent:  # the agent gone: so are we
                for _ in selector.select(timeout=1.0):
                    self._accept(listener)
                self._reap()
        finally:
            selector.close()
            listener.close()
            try:
                if os.stat(self.socket_path).st_ino == bound:  # not a newer runner's socket
                    self.socket_path.unlink()
            except OSError:
                pass

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _accept(self, listener: socket.socket) -> None:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(5.0)
            try:
                request = json.loads(_read_line(connection))
                argv, launched_at = [str(a) for a in request["argv"]], float(request["launched_at"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("warm ClientApp runner: unreadable request (%s); the launcher starts Flower's own", exc)
                return
            try:  # taken on: from here the launcher leaves the task to us
                connection.sendall(ACCEPTED)
            except OSError:  # the launcher gave up waiting and started Flower's own ClientApp
                return
        arrived = self.arrival.wait(max(0.0, launched_at + ARRIVAL_WAIT_SECONDS - time.time()))
        waited = time.time() - launched_at
        if not arrived:
            log.warning("warm ClientApp runner: the SuperNode's log shows no arrival of the message after %g s; "
                        "starting the ClientApp all the same", ARRIVAL_WAIT_SECONDS)
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # a stop now is for the runner, not the child
        pid = os.fork()
        if pid == 0:  # the ClientApp: never returns
            if self._selector is not None:
                self._selector.close()
            listener.close()
            self._child(argv, launched_at, stop_signals)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
        self.children.add(pid)
        log.info("ClientApp %d forked %.3f s after its launch (%s)", pid, waited, FORKED_AFTER)

    def _child(self, argv: list[str], launched_at: float, stop_signals: set[signal.Signals]) -> None:
        code = 1
        try:
            for stop_signal in stop_signals:
                signal.signal(stop_signal, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
            import torch

            from agent.federated import clientapp

            torch.set_num_threads(self.threads)
            os.environ[clientapp.LAUNCHED_AT] = repr(launched_at)
            clientapp.run_clientapp_process(argv)
            code = 0
        except SystemExit as exit_:  # Flower's program ends with sys.exit
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            log.exception("warm ClientApp runner: the ClientApp failed")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _reap(self) -> None:
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)


def _read_line(connection: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < REQUEST_BYTES:
        chunk = connection.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="poet-agent-clientapps", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the agent's config file")
    parser.add_argument("--socket", required=True, type=Path, help="where to listen for the launcher")
    parser.add_argument("--supernode-log", type=Path, help="the SuperNode's output (when its messages arrive)")
    args = parser.parse_args(argv)
    # our logger only: the ClientApps' libraries log through Flower's own handler, or not at all
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    from agent.config import load_config
    from common.errors import PoetEdgeError
    from common.exit_codes import exit_code_for

    config = load_config(args.config)
    runner = Runner(str(Path(args.config).resolve()), args.socket, config.workload.compute_threads, args.supernode_log)
    try:
        runner.preload()
    except (PoetEdgeError, OSError) as exc:
        log.error("warm ClientApp runner: cannot load the device's workload: %s (the SuperNode starts Flower's "
                  "own ClientApps, which will fail the same way)", exc)
        return int(exit_code_for(exc))
    runner.serve(runner.listen())
    return 0


if __name__ == "__main__":
    sys.exit(main())
