"""A real PostgreSQL server in a temporary directory, for the server's tests and load benchmark.

Uses Debian's ``postgresql`` package (``initdb`` and ``pg_ctl`` under
``/usr/lib/postgresql/VERSION/bin``); ``.ci/run`` installs it where missing.
PostgreSQL refuses to run as root, so under root the cluster belongs to the
``postgres`` system user the package creates.  The server listens on a Unix
socket in the cluster's directory and on a free loopback port.

:meth:`TemporaryPostgres.stop` (also the ``with`` block's end) stops the
server (``pg_ctl stop -m fast``, then ``-m immediate`` if that fails) and
removes the directory, so no ``postgres`` process outlives its user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from common.programs import free_port


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or ``None`` when there is none."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return versions[-1].parent if versions else None


class TemporaryPostgres:
    """``with TemporaryPostgres() as pg: pg.url`` -- a fresh cluster with an empty database ``poet``."""

    def __init__(self, database: str = "poet", durable: bool = True) -> None:
        self.bin = postgres_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        self.database = database
        self.durable = durable
        """False: ``fsync=off`` (tests: nothing to keep, and faster); True: PostgreSQL's defaults (benchmarks)."""
        self.root = Path(tempfile.mkdtemp(prefix="poet-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3) of the database ``poet``, over the Unix socket."""
        return self.url_of(self.database)

    def url_of(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3) of ``database`` in this cluster, over the Unix socket."""
        return f"postgresql+psycopg://{self.user}@/{database}?host={self.root}&port={self.port}"

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` in this cluster; its URL."""
        self._run(str(self.bin / "createdb"), "-h", str(self.root), "-p", str(self.port), "-U", self.user, name)
        return self.url_of(name)

    def _run(self, *args: str) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        except subprocess.CalledProcessError as exc:  # say what PostgreSQL said
            raise RuntimeError(f"{' '.join(args)} failed: {exc.stderr.strip() or exc.stdout.strip()}") from exc

    def start(self) -> "TemporaryPostgres":
        """Make the cluster, start its server and create the database ``poet``; ``stop()`` undoes all of it."""
        try:
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres")
            self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", self.user, "-E", "UTF8")
            options = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1"
            if not self.durable:
                options += " -c fsync=off"
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.root / "log"),
                      "-o", options, "start")
            self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut) and remove the cluster's directory."""
        if (self.data / "postmaster.pid").exists():
            for mode in ("fast", "immediate"):
                try:
                    self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
                    break
                except (RuntimeError, subprocess.TimeoutExpired):
                    continue
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "TemporaryPostgres":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

