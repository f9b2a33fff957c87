"""A throwaway PostgreSQL cluster for tests and benchmarks.

:class:`ThrowawayPostgres` runs ``initdb`` into a temporary directory (superuser
``jobreg``, trusted without a password; other roles log in with theirs, SCRAM),
starts ``postgres`` on a free port of 127.0.0.1 only (its Unix socket in the
same temporary directory), and removes everything when it stops::

    with ThrowawayPostgres() as pg:
        url = pg.create_database("scratch")   # postgresql+psycopg://jobreg@127.0.0.1:PORT/scratch
        ...

The binaries come from ``$JOBREG_PG_BIN``, else ``/usr/lib/postgresql/15/bin``,
else ``pg_config --bindir``; :class:`PostgresNotFound` says so when there are
none. PostgreSQL refuses to run as root: under uid 0 the cluster runs as the
``postgres`` system user (``run_as``), which then owns the temporary directory.

Durability is off (``fsync``, ``full_page_writes``, ``synchronous_commit``):
the data is thrown away anyway. The wrapper signals only the one process it
started, by its pid (SIGINT, PostgreSQL's fast shutdown, then SIGKILL after a
timeout), and stops it at interpreter exit if the caller forgot to.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from registry.extras import needs

with needs("audit", "the throwaway PostgreSQL (registry.dev.pgcluster)"):
    import psycopg
    from psycopg import sql

from registry.audit.db import AuditError

__all__ = ["DEFAULT_BINDIR", "ENV_VAR", "PostgresNotFound", "ThrowawayPostgres", "find_pg_bindir"]

#: Environment variable naming the directory of ``initdb`` and ``postgres`` (takes precedence).
ENV_VAR = "JOBREG_PG_BIN"
#: Where Debian and Ubuntu install PostgreSQL 15.
DEFAULT_BINDIR = "/usr/lib/postgresql/15/bin"

_HOST = "127.0.0.1"
_PORT_ATTEMPTS = 3
_LOG_TAIL_LINES = 20
#: Variables libpq and the server tools read; the children must not inherit them.
_SCRUBBED_ENV = ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD",
                 "PGOPTIONS", "PGSERVICE", "PGSSLMODE", "PGCONNECT_TIMEOUT")


class PostgresNotFound(AuditError):
    """No PostgreSQL server binaries (``initdb``, ``postgres``) were found."""


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres"))


def find_pg_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``; raises :class:`PostgresNotFound`.

    Resolution: ``$JOBREG_PG_BIN`` (an error if it lacks them), then
    :data:`DEFAULT_BINDIR`, then ``pg_config --bindir``.
    """
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        if _has_server_binaries(Path(explicit)):
            return Path(explicit)
        raise PostgresNotFound(f"{ENV_VAR}={explicit!r} has no executable initdb and postgres")
    if _has_server_binaries(Path(DEFAULT_BINDIR)):
        return Path(DEFAULT_BINDIR)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out and _has_server_binaries(Path(out)):
                return Path(out)
    raise PostgresNotFound(
        f"PostgreSQL 15 binaries not found: set {ENV_VAR} to the directory of initdb and "
        f"postgres, or install them (Debian/Ubuntu: apt-get install postgresql-15, "
        f"which puts them in {DEFAULT_BINDIR})"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary directory, on 127.0.0.1, for as long as it is open.

    ``bindir``: the server binaries (default :func:`find_pg_bindir`). ``user``:
    the cluster's superuser (trust authentication, no password). ``run_as``:
    the system user running the server (default ``postgres`` when this process
    is root, else this process's user). ``startup_timeout`` bounds ``initdb``
    plus start-up, in seconds. ``also_listen``/``trust``: a second address to listen on and
    the network (CIDR) trusted there (tests: a network namespace of their own).
    """

    def __init__(
        self,
        bindir: str | os.PathLike[str] | None = None,
        *,
        user: str = "jobreg",
        run_as: str | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        also_listen: str | None = None,
        trust: str | None = None,
    ) -> None:
        self._bindir_arg = Path(bindir) if bindir is not None else None
        self.user = user
        self.run_as = run_as if run_as is not None else ("postgres" if os.geteuid() == 0 else None)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        # A second address to listen on and the network whose clients are trusted there: a
        # test's network namespace (an address on a veth pair it made), never a real one.
        self.also_listen = also_listen
        self.trust = trust
        self.host = _HOST
        self.port: int | None = None
        self.base_dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ThrowawayPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """``initdb``, start the server, wait until it accepts connections (bounded)."""
        if self._proc is not None:
            return
        bindir = self._bindir_arg or find_pg_bindir()
        if not _has_server_binaries(bindir):
            raise PostgresNotFound(f"{str(bindir)!r} has no executable initdb and postgres")
        deadline = time.monotonic() + self.startup_timeout
        self.base_dir = Path(tempfile.mkdtemp(prefix="jobreg-pg-"))
        try:
            data, sock = self.base_dir / "data", self.base_dir / "sock"
            sock.mkdir()
            self._log_file = self.base_dir / "postgres.log"
            self._log_file.touch()
            self._chown(self.base_dir, sock, self._log_file)
            self._initdb(bindir, data, deadline)
            for attempt in range(_PORT_ATTEMPTS):
                self.port = _free_port()
                self._spawn(bindir, data, sock)
                if self._wait_ready(deadline):
                    break
                if attempt + 1 == _PORT_ATTEMPTS or "already in use" not in self._log_tail():
                    raise AuditError(
                        f"PostgreSQL did not start on {self.host}:{self.port}:\n{self._log_tail()}"
                    )
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the server (SIGINT, then SIGKILL after ``stop_timeout``) and delete its files."""
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)  # fast shutdown
                try:
                    proc.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait(timeout=self.stop_timeout)
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    # ------------------------------------------------------------------ databases

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of ``database`` on this cluster (psycopg 3, no password)."""
        if self.port is None:
            raise AuditError("the PostgreSQL cluster is not running")
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def _admin(self) -> psycopg.Connection[Any]:
        if self.port is None:
            raise AuditError("the PostgreSQL cluster is not running")
        return psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres",
            autocommit=True, connect_timeout=5,
        )

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL."""
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, disconnecting its sessions."""
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    # ------------------------------------------------------------------ internals

    def _chown(self, *paths: Path) -> None:
        if self.run_as is None:
            return
        try:
            pw = pwd.getpwnam(self.run_as)
        except KeyError:
            raise AuditError(
                f"PostgreSQL cannot run as root and there is no user {self.run_as!r} to run it as"
            ) from None
        for path in paths:
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _child_kwargs(self) -> dict[str, Any]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env["LC_ALL"] = "C"
        kwargs: dict[str, Any] = {"env": env, "cwd": str(self.base_dir), "stdin": subprocess.DEVNULL}
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            env["HOME"] = str(self.base_dir)
        return kwargs

    def _initdb(self, bindir: Path, data: Path, deadline: float) -> None:
        cmd = [
            str(bindir / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust",
            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        ]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True,
                timeout=max(1.0, deadline - time.monotonic()), **self._child_kwargs(),
            )
        except subprocess.TimeoutExpired:
            raise AuditError(f"initdb did not finish within {self.startup_timeout} s") from None
        if done.returncode != 0:
            raise AuditError(f"initdb failed ({done.returncode}):\n{done.stderr or done.stdout}")
        # The superuser needs no password; every other role logs in with its own (SCRAM), so
        # a wrong password is refused as on a real server, and dblink works for non-superusers.
        (data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"host all {self.user} {self.host}/32 trust\n"
            f"host all all {self.host}/32 scram-sha-256\n")
        if self.trust:
            with open(data / "pg_hba.conf", "a") as hba:
                hba.write(f"host all all {self.trust} trust\n")

    def _spawn(self, bindir: Path, data: Path, sock: Path) -> None:
        assert self._log_file is not None and self.port is not None
        cmd = [
            str(bindir / "postgres"), "-D", str(data), "-h",
            ",".join(filter(None, [self.host, self.also_listen])), "-p", str(self.port),
            "-k", str(sock), "-F",
            "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
            "-c", "max_connections=50", "-c", "logging_collector=off",
        ]
        with open(self._log_file, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, **self._child_kwargs()
            )

    def _wait_ready(self, deadline: float) -> bool:
        """True once the server accepts connections; False if it exited; raise on the deadline."""
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                self._proc = None
                return False
            try:
                psycopg.connect(
                    host=self.host, port=self.port, user=self.user, dbname="postgres",
                    connect_timeout=2,
                ).close()
                return True
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise AuditError(
                    f"PostgreSQL did not accept connections within {self.startup_timeout} s:\n"
                    f"{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self) -> str:
        if self._log_file is None:
            return ""
        try:
            lines = self._log_file.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-_LOG_TAIL_LINES:])
