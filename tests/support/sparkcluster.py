"""A Spark standalone cluster from the pyspark package itself, for tests: a master and
workers started with ``$SPARK_HOME/bin/spark-class`` (SPARK_HOME = the pyspark package), on
127.0.0.1, each a process this module started and stops (by its pid)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_log(log: Path, proc: subprocess.Popen, line: str, deadline: float) -> None:
    """Wait until ``log`` shows ``line`` (the logs are this module's own; log4j's default
    console output shows the INFO lines it waits for)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if line in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{line!r} did not appear: {log.read_text()[-2000:]}")


def env(host: str) -> dict[str, str]:
    """The environment of a Spark process bound to ``host``."""
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": host,
            "SPARK_NO_DAEMONIZE": "1"}


class SparkCluster:
    """``with SparkCluster(tmp) as c: c.add_worker(); c.master_url``: a master on ``host``
    and workers (1 core, 1 GiB each by default), their logs and work directories under
    ``tmp``. A worker may run in a network namespace (``netns``: the test made it), bound
    to an address inside it."""

    def __init__(self, tmp: Path, host: str = HOST, port: int | None = None) -> None:
        self.tmp = tmp
        self.host = host
        self.procs: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self.port = port or free_port()
        self.master_url = f"spark://{host}:{self.port}"

    def _start(self, name: str, args: list[str], host: str, port: int,
               netns: str | None = None) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        prefix = ["ip", "netns", "exec", netns] if netns else []
        proc = subprocess.Popen([*prefix, str(SPARK_HOME / "bin" / "spark-class"), *args],
                                env={**env(host), "SPARK_LOG_DIR": str(self.tmp)},
                                stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        _wait_log(log, proc, "Successfully registered with master" if "Worker" in args[0]
                  else "I have been elected leader", time.monotonic() + 90)
        return proc

    def __enter__(self) -> SparkCluster:
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", self.host,
                               "--port", str(self.port), "--webui-port", str(free_port())],
                    self.host, self.port)
        return self

    def add_worker(self, cores: int = 1, memory: str = "1g", host: str = HOST,
                   netns: str | None = None) -> subprocess.Popen:
        """Start a worker bound to ``host`` (inside ``netns`` if given); return once the
        master has registered it."""
        work = self.tmp / f"work-{len(self.workers)}"
        work.mkdir()
        proc = self._start(f"worker-{len(self.workers)}", [
            "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", host,
            "--webui-port", "0", "--cores", str(cores), "--memory", memory,
            "--work-dir", str(work)], host, 0, netns)
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL one of this cluster's processes (and the executors it started: its
        process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
