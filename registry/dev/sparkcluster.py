"""A Spark standalone cluster on this machine, from the pyspark package itself: a master and
workers started with ``$SPARK_HOME/bin/spark-class`` (SPARK_HOME = the pyspark package), bound
to 127.0.0.1 unless told otherwise, each a process this module started and stops by its pid
(its process group: a worker's executors with it). Used by ``jobreg bench audit``'s
``cluster[N]`` form and by the cluster tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["HOST", "SparkCluster", "cluster_workers", "free_port", "spark_home"]

HOST = "127.0.0.1"

_CLUSTER = re.compile(r"cluster\[([1-9][0-9]?)\]")


def cluster_workers(master: str) -> int | None:
    """The number of workers ``cluster[N]`` names (a standalone cluster of N workers of one
    core each, started on loopback for the run); None for any other master."""
    found = _CLUSTER.fullmatch(master)
    return int(found.group(1)) if found else None


def spark_home() -> Path:
    """The pyspark package's folder, which is a Spark distribution (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port(host: str = HOST) -> int:
    """A port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _wait_log(log: Path, proc: subprocess.Popen[bytes], line: str, deadline: float) -> None:
    """Wait until ``log`` shows ``line`` (Spark's default console log shows the INFO lines
    waited for)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if line in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{line!r} did not appear: {log.read_text()[-2000:]}")


def env(host: str) -> dict[str, str]:
    """The environment of a Spark process bound to ``host``."""
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host,
            "SPARK_NO_DAEMONIZE": "1"}


class SparkCluster:
    """``with SparkCluster(tmp) as c: c.add_worker(); c.master_url``: a master on ``host``
    and workers (1 core, 1 GiB each by default), their logs and work directories under
    ``tmp``. A worker may run in a network namespace (``netns``: the caller made it), bound
    to an address inside it. Everything started is stopped on exit (SIGTERM, then SIGKILL),
    by pid."""

    def __init__(self, tmp: Path, host: str = HOST, port: int | None = None) -> None:
        self.tmp = tmp
        self.host = host
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.port = port or free_port(host)
        self.master_url = f"spark://{host}:{self.port}"

    def _start(self, name: str, args: list[str], host: str,
               netns: str | None = None) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        prefix = ["ip", "netns", "exec", netns] if netns else []
        with log.open("w") as out:
            proc = subprocess.Popen([*prefix, str(spark_home() / "bin" / "spark-class"), *args],
                                    env={**env(host), "SPARK_LOG_DIR": str(self.tmp)},
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append(proc)
        _wait_log(log, proc, "Successfully registered with master" if "Worker" in args[0]
                  else "I have been elected leader", time.monotonic() + 90)
        return proc

    def __enter__(self) -> SparkCluster:
        try:
            self._start("master", ["org.apache.spark.deploy.master.Master", "--host",
                                   self.host, "--port", str(self.port), "--webui-port",
                                   str(free_port(self.host))], self.host)
        except BaseException:
            self.__exit__()
            raise
        return self

    def add_worker(self, cores: int = 1, memory: str = "1g", host: str = HOST,
                   netns: str | None = None) -> subprocess.Popen[bytes]:
        """Start a worker bound to ``host`` (inside ``netns`` if given); return once the
        master has registered it."""
        work = self.tmp / f"work-{len(self.workers)}"
        work.mkdir()
        proc = self._start(f"worker-{len(self.workers)}", [
            "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", host,
            "--webui-port", "0", "--cores", str(cores), "--memory", memory,
            "--work-dir", str(work)], host, netns)
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
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
