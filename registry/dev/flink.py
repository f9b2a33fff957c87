"""Apache Flink 2.3 session clusters from Maven Central's jars, on loopback, for failover tests.

:class:`FlinkCluster` runs ``jobmanagers`` JobManagers (``StandaloneSessionClusterEntrypoint``)
and one TaskManager (``TaskManagerRunner``) of Flink :data:`FLINK_VERSION`, each a JVM of its
own with its own configuration folder, log file and free ports on 127.0.0.1, with one of two
high-availability backends::

    with FlinkCluster(ha="zookeeper") as flink:          # Flink's own, on Debian's ZooKeeper
        leader = flink.leader()
    with FlinkCluster(ha="jobreg", bootstrap=broker.bootstrap) as flink:   # jobreg's backend
        ...

What it does, in order:

1. **Jars.** :func:`flink_classpath` asks Maven once for the runtime classpath of
   ``tests/support/flink/pom.xml`` (flink-runtime, flink-clients, flink-streaming-java,
   flink-rpc-akka-loader, log4j; flink-runtime brings flink-shaded-zookeeper-3, which holds
   the Curator Flink's ZooKeeper backend uses) and keeps the answer in
   ``<cache>/flink-<version>/classpath.txt`` (the cache of :mod:`registry.dev.kafka`). There
   is no flink-dist on Maven Central, so there is no ``BashJavaUtils`` either: the
   TaskManager's memory and CPU settings it would compute are set explicitly
   (:data:`TASKMANAGER_MEMORY`).
2. **ZooKeeper** (``ha="zookeeper"``): Debian's ZooKeeper server
   (``/usr/share/java/zookeeper.jar``, ``ZooKeeperServerMain``) on a free loopback port;
   Flink's client session timeout is ``zookeeper_session_timeout_ms`` (6 s by default, as in
   the measured control of ``shared/flink-ha.md``).
   **jobreg** (``ha="jobreg"``): ``high-availability.type`` is jobreg's factory class, the
   backend jar goes on every JVM's classpath, and each JVM's backend starts the
   ``jobreg flink-bridge`` child named by ``high-availability.jobreg.command``.
3. **Start.** Every JVM is started like the Kafka nodes (``setpriv --pdeathsig KILL``), then
   it waits until every JobManager's REST endpoint answers and the TaskManager's slots are
   registered.
4. **Faults and figures.** :meth:`FlinkCluster.kill`, :meth:`~FlinkCluster.pause`,
   :meth:`~FlinkCluster.resume` by pid; :meth:`~FlinkCluster.leader` (from the JobManagers'
   logs: the ResourceManager's grant and revocation lines); REST helpers for a job's status
   and checkpoints; :class:`LogWatcher` fires an action the moment a log line matches (how
   the cancel-then-kill window is hit within milliseconds).

Every failure is one line (:class:`~registry.errors.BrokerStartError`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from registry.dev.broker import _free_port, _popen, _track, _untrack, _with_parent_death_signal
from registry.dev.kafka import _cache_root, _need, _run_or_say, java_binary
from registry.errors import BrokerStartError, ConfigError

__all__ = ["FLINK_VERSION", "JOBREG_FACTORY", "SCHEDULERS", "TASKMANAGER_MEMORY", "CheckpointInfo",
           "FlinkCluster", "FlinkProcess", "LogWatcher", "ZooKeeperServer", "build_job_jar",
           "flink_classpath", "support_dir"]

_log = logging.getLogger(__name__)

#: The Flink release the failover test and bench run.
FLINK_VERSION = "2.3.0"
#: jobreg's Flink high-availability factory (``flink-jobreg/``).
JOBREG_FACTORY = "org.jobreg.flink.JobregHaServicesFactory"
#: ``FlinkCluster(scheduler=...)``: the value of ``jobmanager.scheduler`` for each.
SCHEDULERS: dict[str, str] = {"default": "Default", "adaptive": "Adaptive"}
#: The test job's main class (``tests/support/flink/src``).
JOB_MAIN = "org.jobreg.failover.FailoverJob"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"  # Debian's zookeeper package

#: What flink-dist's ``BashJavaUtils GET_TM_RESOURCE_PARAMS`` would derive for a small
#: TaskManager (it prints them as ``-D`` options for ``TaskManagerRunner``, which refuses to
#: start without them: "The required configuration option 'taskmanager.cpu.cores' is not
#: set"). Set explicitly here; the JVM's own limits follow from them (:func:`_tm_jvm_opts`).
TASKMANAGER_MEMORY: dict[str, str] = {
    "taskmanager.cpu.cores": "1.0",
    "taskmanager.memory.framework.heap.size": "128m",
    "taskmanager.memory.task.heap.size": "128m",
    "taskmanager.memory.framework.off-heap.size": "64m",
    "taskmanager.memory.task.off-heap.size": "0m",
    "taskmanager.memory.network.min": "32m",
    "taskmanager.memory.network.max": "32m",
    "taskmanager.memory.managed.size": "32m",
    "taskmanager.memory.jvm-metaspace.size": "192m",
    "taskmanager.memory.jvm-overhead.min": "96m",
    "taskmanager.memory.jvm-overhead.max": "96m",
}

_JVM_OPTS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
             "-XX:-OmitStackTraceInFastThrow",
             # what flink-dist's config.yaml puts in env.java.opts.all for Java 17
             "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
             "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
             "--add-opens=java.base/java.lang=ALL-UNNAMED",
             "--add-opens=java.base/java.net=ALL-UNNAMED",
             "--add-opens=java.base/java.io=ALL-UNNAMED",
             "--add-opens=java.base/java.nio=ALL-UNNAMED",
             "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
             "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
             "--add-opens=java.base/java.text=ALL-UNNAMED",
             "--add-opens=java.base/java.time=ALL-UNNAMED",
             "--add-opens=java.base/java.util=ALL-UNNAMED",
             "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
             "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
             "--add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED")

# One log file per JVM; the first field is the time in epoch milliseconds, which the
# figures are read from (the JVMs and this process share the machine's clock).
_LOG4J2 = """rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.immediateFlush = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{UNIX_MILLIS}} %d{{HH:mm:ss,SSS}} %-5p %c{{1}} [%t] - %m%n
logger.pekko.name = org.apache.pekko
logger.pekko.level = WARN
logger.zk.name = org.apache.flink.shaded.zookeeper3
logger.zk.level = WARN
logger.netty.name = org.apache.flink.shaded.netty4
logger.netty.level = WARN
"""

_fetch_lock = threading.Lock()


def support_dir() -> pathlib.Path:
    """``tests/support/flink`` of this source tree: the classpath POM and the job's source."""
    here = pathlib.Path(__file__).resolve().parents[2] / "tests" / "support" / "flink"
    if not (here / "pom.xml").exists():
        raise BrokerStartError(f"{here / 'pom.xml'} is missing: the Flink harness runs from "
                               "a jobreg source tree")
    return here


def flink_classpath(progress: Callable[[str], None] | None = None) -> list[pathlib.Path]:
    """The jars a Flink :data:`FLINK_VERSION` JobManager and TaskManager run on.

    Resolved once with ``mvn dependency:build-classpath`` on ``tests/support/flink/pom.xml``
    (Maven keeps the jars in its own repository) and cached in
    ``<cache>/flink-<version>/classpath.txt``; a cached list whose jars are all still there is
    used without asking Maven.

    :raises BrokerStartError: no ``mvn``, or Maven could not resolve the jars (one line).
    """
    home = _cache_root() / f"flink-{FLINK_VERSION}"
    cached = home / "classpath.txt"
    with _fetch_lock:
        if cached.exists():
            jars = [pathlib.Path(p) for p in cached.read_text().split(os.pathsep) if p.strip()]
            if jars and all(j.exists() for j in jars):
                return jars
        mvn = _need("mvn", f"Maven to resolve Flink {FLINK_VERSION}'s jars from Maven Central "
                           "once (apt-get install maven)")
        home.mkdir(parents=True, exist_ok=True)
        out = home / "classpath.tmp"
        if progress is not None:
            progress(f"resolving Flink {FLINK_VERSION}'s classpath with Maven (once)")
        _run_or_say(f"Maven could not resolve Flink {FLINK_VERSION}",
                    [mvn, "-q", "-B", "-f", str(support_dir() / "pom.xml"),
                     "dependency:build-classpath", "-DincludeScope=runtime",
                     f"-Dmdep.outputFile={out}"])
        text = out.read_text().strip()
        os.replace(out, cached)
        jars = [pathlib.Path(p) for p in text.split(os.pathsep) if p.strip()]
    if not any(j.name.startswith("flink-runtime-") for j in jars):
        raise BrokerStartError(f"Maven's classpath for Flink lacks flink-runtime; delete {home}")
    return jars


def build_job_jar(target: pathlib.Path, classpath: list[pathlib.Path]) -> pathlib.Path:
    """Compile the test job (``tests/support/flink/src``) with ``javac`` against
    ``classpath`` and pack it into the jar ``target``; returns ``target``."""
    javac = _need("javac", "a JDK (javac) to compile the Flink test job "
                           "(apt-get install openjdk-17-jdk-headless)")
    sources = sorted(str(p) for p in (support_dir() / "src").rglob("*.java"))
    classes = pathlib.Path(tempfile.mkdtemp(prefix="flink-job-"))
    try:
        _run_or_say("javac could not compile the Flink test job",
                    [javac, "-nowarn", "-d", str(classes), "-cp",
                     os.pathsep.join(map(str, classpath)), *sources])
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w") as jar:
            jar.writestr("META-INF/MANIFEST.MF",
                         f"Manifest-Version: 1.0\r\nMain-Class: {JOB_MAIN}\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
    finally:
        shutil.rmtree(classes, ignore_errors=True)
    return target


def _yaml(settings: Mapping[str, object]) -> str:
    """Flink's ``config.yaml`` as flat keys (Flink 2 reads ``a.b: v`` as the nested form)."""
    return "".join(f"{key}: {json.dumps(str(value))}\n" for key, value in settings.items())


def _mb(size: str) -> int:
    match = re.fullmatch(r"(\d+)m", size)
    if match is None:
        raise ConfigError(f"memory size {size!r}: give it in MiB, e.g. 128m")
    return int(match.group(1))


def _tm_jvm_opts(memory: Mapping[str, str]) -> list[str]:
    """The JVM limits BashJavaUtils derives from the TaskManager's memory settings."""
    heap = _mb(memory["taskmanager.memory.framework.heap.size"]) + \
        _mb(memory["taskmanager.memory.task.heap.size"])
    direct = _mb(memory["taskmanager.memory.framework.off-heap.size"]) + \
        _mb(memory["taskmanager.memory.task.off-heap.size"]) + \
        _mb(memory["taskmanager.memory.network.max"])
    return [f"-Xmx{heap}m", f"-Xms{heap}m", f"-XX:MaxDirectMemorySize={direct}m",
            f"-XX:MaxMetaspaceSize={_mb(memory['taskmanager.memory.jvm-metaspace.size'])}m"]


# -- ZooKeeper ---------------------------------------------------------------------------------


class ZooKeeperServer:
    """Debian's ZooKeeper server (standalone) on a free 127.0.0.1 port, data in ``directory``."""

    def __init__(self, directory: pathlib.Path, *, tick_ms: int = 500) -> None:
        self.directory = directory
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._tick_ms = tick_ms
        self._owner_pid = os.getpid()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        jar = os.environ.get("JOBREG_ZOOKEEPER_JAR", ZOOKEEPER_JAR)
        if not os.path.exists(jar):
            raise BrokerStartError(f"{jar} not found: Flink's ZooKeeper control needs Debian's "
                                   "ZooKeeper (apt-get install zookeeper)")
        self.port = _free_port("127.0.0.1")
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        cfg = self.directory / "zoo.cfg"
        # maxSessionTimeout must allow Flink's 6 s (ZooKeeper clamps to 2..20 ticks).
        cfg.write_text(f"tickTime={self._tick_ms}\ndataDir={data}\nclientPort={self.port}\n"
                       "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                       "maxSessionTimeout=60000\nminSessionTimeout=1000\n"
                       "4lw.commands.whitelist=ruok,srvr\n")
        log = open(self.directory / "zookeeper.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self.proc = _popen(_with_parent_death_signal(
                [java_binary(), "-Xmx256m", *_JVM_OPTS[:3], "-Dzookeeper.jmx.log4j.disable=true",
                 "-cp", f"/etc/zookeeper/conf{os.pathsep}{jar}",
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise BrokerStartError(f"ZooKeeper exited with code {self.proc.returncode}; "
                                       f"see {self.directory / 'zookeeper.log'}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerStartError(f"ZooKeeper did not answer on {self.address} within "
                                       f"{timeout:g} s")
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(16) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after 10 s."""
        _stop_proc(self.proc)


def _stop_proc(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGCONT)  # a paused process cannot stop
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- Flink processes ---------------------------------------------------------------------------


@dataclass
class FlinkProcess:
    """One JVM of a :class:`FlinkCluster`: a JobManager or the TaskManager."""

    name: str
    role: str
    """``jobmanager`` or ``taskmanager``."""
    directory: pathlib.Path
    rpc_port: int
    rest_port: int = 0
    """The REST port (JobManagers only)."""
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def conf_dir(self) -> pathlib.Path:
        return self.directory / "conf"

    @property
    def log_file(self) -> pathlib.Path:
        return self.directory / "flink.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        """The whole log so far (empty before the JVM wrote any)."""
        try:
            return self.log_file.read_text("utf-8", "replace")
        except OSError:
            return ""

    def log_lines(self, pattern: str) -> list[tuple[float, str]]:
        """``(epoch seconds, line)`` of every log line that matches the regex ``pattern``."""
        found = []
        compiled = re.compile(pattern)
        for line in self.log_text().splitlines():
            if compiled.search(line):
                found.append((_line_time(line), line))
        return found

    def log_tail(self, lines: int = 8) -> str:
        text = self.log_text() + _read_tail(self.directory / "console.log")
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-lines:])


def _read_tail(path: pathlib.Path) -> str:
    try:
        return path.read_bytes()[-8192:].decode("utf-8", "replace")
    except OSError:
        return ""


def _line_time(line: str) -> float:
    """The epoch time a log line was written at (its first field, in ms); NaN if none."""
    head = line.split(" ", 1)[0]
    return int(head) / 1000.0 if head.isdigit() else float("nan")


@dataclass(frozen=True)
class CheckpointInfo:
    """A job's checkpoints as one JobManager's REST endpoint reports them."""

    completed: int
    """Checkpoints completed since the job was (re)started on this JobManager."""
    latest: int | None
    """Id of the latest completed checkpoint."""
    restored: int | None
    """Id of the checkpoint the job was restored from on this JobManager, if any."""


class LogWatcher:
    """Reads a log file as it grows and calls ``action`` the moment a line matches ``pattern``.

    It polls every ``interval`` s (2 ms by default) from the file's end when started (or from
    byte ``offset``); the first matching line fires ``action(line)`` once, on the watcher's
    thread, :attr:`fired_at` is the time (``time.time()``) the action began and :attr:`end`
    the byte offset just past the line (where a watcher for what follows it starts).
    :meth:`wait` waits for it.
    """

    def __init__(self, path: pathlib.Path, pattern: str, action: Callable[[str], object], *,
                 interval: float = 0.002, offset: int | None = None) -> None:
        self.path = path
        self.pattern = re.compile(pattern)
        self.action = action
        self.interval = interval
        self.line: str | None = None
        self.fired_at: float | None = None
        self.end: int | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._offset = offset if offset is not None else (
            path.stat().st_size if path.exists() else 0)
        self._thread = threading.Thread(target=self._run, name=f"watch {path.name}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        try:
            while not self._stop.is_set():
                try:
                    with open(self.path, "rb") as f:
                        f.seek(self._offset)
                        chunk = f.read()
                except OSError:
                    chunk = b""
                if chunk:
                    at = self._offset - len(pending)  # where ``pending`` begins
                    self._offset += len(chunk)
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        at += len(raw) + 1
                        line = raw.decode("utf-8", "replace")
                        if self.pattern.search(line):
                            self.fired_at = time.time()
                            self.line = line
                            self.end = at
                            self.action(line)
                            return
                time.sleep(self.interval)
        except BaseException as e:  # reported by wait()
            self.error = e
        finally:
            self._done.set()

    def wait(self, timeout: float) -> bool:
        """Whether the action ran within ``timeout`` s (re-raises what it raised)."""
        self._done.wait(timeout)
        if self.error is not None:
            raise self.error
        return self.fired_at is not None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class FlinkCluster:
    """A Flink :data:`FLINK_VERSION` session cluster on 127.0.0.1: ``jobmanagers``
    JobManagers and one TaskManager with ``slots`` slots, high availability by ``ha``.

    :param ha: ``zookeeper`` (Flink's backend on a ZooKeeper server started here) or
        ``jobreg`` (jobreg's backend: ``bootstrap`` is the broker, ``backend_jar`` the built
        ``flink-jobreg`` jar, ``jobreg_command`` the ``jobreg`` executable, by default the
        one beside this Python).
    :param lease: ``high-availability.jobreg.lease`` in seconds (jobreg only).
    :param zookeeper_session_timeout_ms: Flink's ZooKeeper client session timeout.
    :param config: extra Flink settings for every JVM (over the harness's).
    :param directory: where each JVM's folder goes (kept); ``None``: a temporary folder,
        deleted on :meth:`stop`.
    :param cluster_id: ``high-availability.cluster-id`` (a fresh one by default).
    :param scheduler: ``jobmanager.scheduler`` of every JobManager: ``default`` (Flink's
        ``DefaultScheduler``: one execution graph for a job's life) or ``adaptive`` (the
        ``AdaptiveScheduler``: a new execution graph on every restart).
    """

    def __init__(self, *, jobmanagers: int = 2, ha: str = "zookeeper",
                 bootstrap: str | None = None, backend_jar: str | os.PathLike[str] | None = None,
                 jobreg_command: str | None = None, lease: float = 5.0,
                 zookeeper_session_timeout_ms: int = 6000, slots: int = 2,
                 config: Mapping[str, object] | None = None,
                 directory: str | os.PathLike[str] | None = None,
                 cluster_id: str | None = None, startup_timeout: float = 180.0,
                 progress: Callable[[str], None] | None = None,
                 scheduler: str = "default") -> None:
        if ha not in ("zookeeper", "jobreg"):
            raise ConfigError(f"ha must be 'zookeeper' or 'jobreg', not {ha!r}")
        if scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler must be one of {', '.join(SCHEDULERS)}, "
                              f"not {scheduler!r}")
        if jobmanagers < 1:
            raise ConfigError(f"jobmanagers must be 1 or more, got {jobmanagers!r}")
        if ha == "jobreg":
            if not bootstrap:
                raise ConfigError("ha='jobreg' needs bootstrap (the broker jobreg runs on)")
            if backend_jar is None or not os.path.exists(backend_jar):
                raise ConfigError(f"ha='jobreg' needs the backend jar (flink-jobreg); "
                                  f"{backend_jar!r} does not exist: build it with "
                                  "mvn -f flink-jobreg/pom.xml package")
        self.ha = ha
        self.scheduler = scheduler
        self.bootstrap = bootstrap
        self.backend_jar = pathlib.Path(backend_jar) if backend_jar is not None else None
        self.jobreg_command = jobreg_command or _default_jobreg_command()
        self.lease = lease
        self._zk_timeout = zookeeper_session_timeout_ms
        self._slots = slots
        self._config = dict(config or {})
        self._directory = pathlib.Path(directory) if directory is not None else None
        self._temp: pathlib.Path | None = None
        self.cluster_id = cluster_id or f"flink-{os.urandom(4).hex()}"
        self._startup_timeout = startup_timeout
        self._progress = progress
        self._count = jobmanagers
        self.jobmanagers: list[FlinkProcess] = []
        self.taskmanager: FlinkProcess | None = None
        self.zookeeper: ZooKeeperServer | None = None
        self.root = pathlib.Path()
        self.classpath: list[pathlib.Path] = []
        self._owner_pid = os.getpid()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        """The jobreg namespace the backend uses: the cluster id, as the bridge protocol
        derives it (anything outside ``[A-Za-z0-9._-]`` becomes ``-``, leading ``/`` dropped)."""
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.cluster_id.lstrip("/"))

    @property
    def storage_dir(self) -> pathlib.Path:
        """``high-availability.storageDir`` (a local folder)."""
        return self.root / "ha"

    def start(self) -> FlinkCluster:
        """Resolve the jars, start ZooKeeper if needed, every JobManager and the TaskManager,
        and wait until each JobManager answers REST and the TaskManager's slots show.

        :raises BrokerStartError: see the module docstring; nothing is left running.
        """
        self.classpath = flink_classpath(self._progress)
        java = java_binary()
        if self._directory is None:
            self._temp = pathlib.Path(tempfile.mkdtemp(prefix="jobreg-flink-"))
            self.root = self._temp
        else:
            self.root = self._directory
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            if self.ha == "zookeeper":
                self.zookeeper = ZooKeeperServer(self.root / "zookeeper")
                self._say("starting ZooKeeper")
                self.zookeeper.start()
            taken: set[int] = set()
            self.jobmanagers = [
                FlinkProcess(f"jm{i + 1}", "jobmanager", self.root / f"jm{i + 1}",
                             rpc_port=_fresh(taken), rest_port=_fresh(taken))
                for i in range(self._count)]
            self.taskmanager = FlinkProcess("tm", "taskmanager", self.root / "tm",
                                            rpc_port=_fresh(taken))
            for jm in self.jobmanagers:
                self._write_conf(jm, taken)
                jm.argv = self._argv(java, jm)
            self._write_conf(self.taskmanager, taken)
            self.taskmanager.argv = self._argv(java, self.taskmanager)
            self._say(f"starting {self._count} JobManager(s) and a TaskManager "
                      f"(Flink {FLINK_VERSION}, high availability: {self.ha})")
            for p in (*self.jobmanagers, self.taskmanager):
                self._spawn(p)
            self._wait_ready(time.monotonic() + self._startup_timeout)
        except BaseException:  # includes KeyboardInterrupt: never leak a JVM
            self._kill_all()
            self._remove_temp()
            raise
        _track(self)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every JVM it started (SIGTERM, SIGKILL after ``timeout`` s) and ZooKeeper, by
        pid. Idempotent; a temporary folder is deleted."""
        for p in (*self.jobmanagers, *([self.taskmanager] if self.taskmanager else [])):
            _stop_proc(p.proc, timeout)
        if self.zookeeper is not None:
            self.zookeeper.stop()
        _untrack(self)
        self._remove_temp()

    def __enter__(self) -> FlinkCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults --------------------------------------------------------------------------------

    def kill(self, p: FlinkProcess) -> float:
        """SIGKILL ``p`` by pid and reap it; returns the time (``time.time()``) of the signal."""
        assert p.proc is not None
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            p.proc.send_signal(signal.SIGKILL)
        p.proc.wait()
        return at

    def pause(self, p: FlinkProcess) -> float:
        """SIGSTOP ``p``; returns the time of the signal."""
        assert p.proc is not None
        at = time.time()
        p.proc.send_signal(signal.SIGSTOP)
        return at

    def resume(self, p: FlinkProcess) -> float:
        """SIGCONT ``p``; returns the time of the signal."""
        assert p.proc is not None
        at = time.time()
        p.proc.send_signal(signal.SIGCONT)
        return at

    def restart(self, p: FlinkProcess) -> None:
        """Start a killed JVM again with its own configuration (a fresh standby). Its old
        log is kept as ``flink.log.<n>``, so that :meth:`leads` reads the new life only."""
        if p.is_running():
            raise BrokerStartError(f"{p.name} is running")
        if p.log_file.exists():
            n = 1
            while p.log_file.with_name(f"flink.log.{n}").exists():
                n += 1
            p.log_file.rename(p.log_file.with_name(f"flink.log.{n}"))
        self._spawn(p)

    def watch(self, p: FlinkProcess, pattern: str, action: Callable[[str], object], *,
              offset: int | None = None) -> LogWatcher:
        """A :class:`LogWatcher` on ``p``'s log from now on (from byte ``offset``, if given:
        another watcher's :attr:`LogWatcher.end`)."""
        return LogWatcher(p.log_file, pattern, action, offset=offset)

    # -- leadership ------------------------------------------------------------------------

    def leader(self, timeout: float = 120.0, among: list[FlinkProcess] | None = None
               ) -> FlinkProcess:
        """The running JobManager that leads now, from the logs: its Dispatcher's last
        grant is later than its last revocation. Waits up to ``timeout`` s for one."""
        deadline = time.monotonic() + timeout
        while True:
            leaders = [jm for jm in (among or self.jobmanagers) if jm.is_running()
                       and self.leads(jm)]
            if len(leaders) == 1:
                return leaders[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no single JobManager leads after {timeout:g} s "
                                   f"({len(leaders)} claim to)")
            time.sleep(0.1)

    @staticmethod
    def leads(jm: FlinkProcess) -> bool:
        """Whether ``jm``'s log says its Dispatcher leads now."""
        last = granted_at(jm)
        return last is not None and last > (revoked_at(jm) or 0.0)

    # -- REST --------------------------------------------------------------------------------

    def rest(self, jm: FlinkProcess, path: str, method: str = "GET", timeout: float = 5.0,
             body: Any = None) -> Any:
        """The JSON answer of ``jm``'s REST endpoint to ``method path`` (with ``body`` sent
        as JSON, if given)."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(jm.rest + path, data=data, method=method,
                                         headers={} if data is None else
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read()
        return json.loads(body) if body else None

    def job_status(self, jm: FlinkProcess, job_id: str) -> str | None:
        """The job's state as ``jm`` reports it (``RUNNING``, ``CANCELED``...), ``None`` if
        it does not know the job or does not answer."""
        try:
            state = self.rest(jm, f"/jobs/{job_id}")["state"]
            return str(state)
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            return None

    def jobs(self, jm: FlinkProcess) -> dict[str, str]:
        """``{job id: state}`` of every job ``jm``'s cluster knows."""
        answer = self.rest(jm, "/jobs/overview")
        return {j["jid"]: j["state"] for j in answer["jobs"]}

    def checkpoints(self, jm: FlinkProcess, job_id: str) -> CheckpointInfo | None:
        """The job's checkpoint counts as ``jm`` reports them; ``None`` if it cannot say."""
        try:
            answer = self.rest(jm, f"/jobs/{job_id}/checkpoints")
        except (OSError, ValueError, urllib.error.URLError):
            return None
        latest = (answer.get("latest") or {})
        completed = latest.get("completed") or {}
        restored = latest.get("restored") or {}
        return CheckpointInfo(int(answer.get("counts", {}).get("completed", 0)),
                              completed.get("id"), restored.get("id"))

    def cancel(self, jm: FlinkProcess, job_id: str) -> None:
        """Ask ``jm`` to cancel the job (``PATCH /jobs/<id>?mode=cancel``)."""
        self.rest(jm, f"/jobs/{job_id}?mode=cancel", method="PATCH")

    def stop_with_savepoint(self, jm: FlinkProcess, job_id: str, *, drain: bool) -> str:
        """Ask ``jm`` to stop the job with a savepoint (``POST /jobs/<id>/stop``, what ``flink
        stop [--drain]`` sends) into this cluster's savepoint folder; the request id of the
        asynchronous operation."""
        answer = self.rest(jm, f"/jobs/{job_id}/stop", method="POST",
                           body={"drain": drain, "formatType": "CANONICAL",
                                 "targetDirectory": self.savepoint_dir.as_uri()})
        return str(answer["request-id"])

    @property
    def savepoint_dir(self) -> pathlib.Path:
        """Where :meth:`stop_with_savepoint` writes savepoints."""
        return self.root / "savepoints"

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 120.0,
                 interval: float = 0.05) -> Any:
        """Poll ``check`` until it returns something true; raise ``TimeoutError`` naming
        ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
                got = check()
                if got:
                    return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:g} s")
            time.sleep(interval)

    # -- the test job ------------------------------------------------------------------------

    def job_jar(self) -> pathlib.Path:
        """The test job's jar, built once per cluster folder."""
        jar = self.root / "failover-job.jar"
        if not jar.exists():
            build_job_jar(jar, self.classpath)
        return jar

    def submit(self, jm: FlinkProcess, name: str = "failover", timeout: float = 120.0,
               *, fail_file: pathlib.Path | None = None, records: int | None = None,
               main: str = JOB_MAIN, args: tuple[str, ...] = ()) -> str:
        """Submit the test job to ``jm``'s REST endpoint (the job submits itself, from a JVM
        of its own, with ``createRemoteEnvironment`` and ``executeAsync``); its job id.

        With ``fail_file``, the job's counting task throws once each time that file appears
        (it deletes it first): :meth:`fail_task` makes Flink restart the job. ``main``: another
        job of the test jar (``org.jobreg.failover.HaVerifyJob``), ``args`` after the fail
        file."""
        jar = self.job_jar()
        argv = [java_binary(), "-Xmx256m", *_JVM_OPTS, "-cp",
                os.pathsep.join([str(jar), *map(str, self.classpath)]),
                f"-Dlog4j2.configurationFile={self._client_log4j()}",
                *([f"-Dfailover.records={records}"] if records is not None else []),
                main, "127.0.0.1", str(jm.rest_port), str(jar), name,
                *([str(fail_file)] if fail_file is not None else []), *args]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise BrokerStartError(f"submitting the job {name!r} took over {timeout:g} s") from e
        for line in done.stdout.splitlines():
            if line.startswith("JOBID "):
                return line.split()[1]
        said = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        raise BrokerStartError(f"submitting the job {name!r} failed (exit {done.returncode}): "
                               f"{said[-1][:300] if said else 'no output'}")

    def fail_file(self, name: str) -> pathlib.Path:
        """The fail file of the job called ``name`` (pass it to :meth:`submit`)."""
        return self.root / f"fail-{re.sub(r'[^A-Za-z0-9._-]', '-', name)}"

    def fail_task(self, fail_file: pathlib.Path, timeout: float = 60.0) -> float:
        """Make the job submitted with ``fail_file`` fail one task: create the file and wait
        until the task took it (deleted it, then threw); returns when the file appeared."""
        at = time.time()
        fail_file.write_text("fail once\n")
        self.wait_for(f"the task failure of {fail_file.name}", lambda: not fail_file.exists(),
                      timeout)
        return at

    def _client_log4j(self) -> pathlib.Path:
        path = self.root / "client-log4j2.properties"
        if not path.exists():
            path.write_text(_LOG4J2.format(log=self.root / "client.log"))
        return path

    # -- internals -------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        _log.info("%s", line)
        if self._progress is not None:
            self._progress(line)

    def _settings(self, p: FlinkProcess, taken: set[int]) -> dict[str, object]:
        leader = self.jobmanagers[0]
        settings: dict[str, object] = {
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": (p.rpc_port if p.role == "jobmanager" else leader.rpc_port),
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.memory.process.size": "768m",
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": p.rest_port or leader.rest_port,
            "blob.server.port": _fresh(taken),
            "taskmanager.host": "127.0.0.1",
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.rpc.port": p.rpc_port if p.role == "taskmanager" else 0,
            "taskmanager.data.port": _fresh(taken),
            "taskmanager.numberOfTaskSlots": self._slots,
            "metrics.internal.query-service.port": _fresh(taken),
            "execution.checkpointing.dir": (self.root / "checkpoints").as_uri(),
            "state.backend.type": "hashmap",
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": 1000000,
            "restart-strategy.fixed-delay.delay": "500 ms",
            "high-availability.storageDir": self.storage_dir.as_uri(),
            "high-availability.cluster-id": self.cluster_id,
            # the TaskManager finds its new JobManager as soon as the HA services say
            "heartbeat.interval": 2000,
            "heartbeat.timeout": 20000,
            "cluster.evenly-spread-out-slots": "false",
            "web.submit.enable": "false",
        }
        if self.ha == "zookeeper":
            assert self.zookeeper is not None
            settings.update({
                "high-availability.type": "zookeeper",
                "high-availability.zookeeper.quorum": self.zookeeper.address,
                "high-availability.zookeeper.path.root": "/flink",
                "high-availability.zookeeper.client.session-timeout": self._zk_timeout,
                "high-availability.zookeeper.client.connection-timeout": 5000,
            })
        else:
            settings.update({
                "high-availability.type": JOBREG_FACTORY,
                "high-availability.jobreg.bootstrap": self.bootstrap,
                "high-availability.jobreg.command": self.jobreg_command,
                "high-availability.jobreg.lease": f"{self.lease:g} s",
            })
        if p.role == "taskmanager":
            settings.update(TASKMANAGER_MEMORY)
        settings["jobmanager.scheduler"] = SCHEDULERS[self.scheduler]
        settings.update(self._config)
        return settings

    def _write_conf(self, p: FlinkProcess, taken: set[int]) -> None:
        p.conf_dir.mkdir(parents=True, exist_ok=True)
        (p.conf_dir / "config.yaml").write_text(_yaml(self._settings(p, taken)))
        (p.conf_dir / "log4j2.properties").write_text(_LOG4J2.format(log=p.log_file))

    def _argv(self, java: str, p: FlinkProcess) -> list[str]:
        jars = list(map(str, self.classpath))
        if self.backend_jar is not None and self.ha == "jobreg":
            jars.insert(0, str(self.backend_jar))
        if p.role == "jobmanager":
            main = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
            memory = ["-Xmx384m", "-Xms128m", "-XX:MaxMetaspaceSize=256m"]
        else:
            main = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
            memory = _tm_jvm_opts(TASKMANAGER_MEMORY)
        return [java, *memory, *_JVM_OPTS,
                f"-Dlog.file={p.log_file}",
                f"-Dlog4j.configurationFile={p.conf_dir / 'log4j2.properties'}",
                f"-Dlog4j2.configurationFile={p.conf_dir / 'log4j2.properties'}",
                "-cp", os.pathsep.join(jars), main, "-c", str(p.conf_dir)]

    def _spawn(self, p: FlinkProcess) -> None:
        console = open(p.directory / "console.log", "ab")  # noqa: SIM115 - the child keeps it
        env = dict(os.environ)
        if self.ha == "jobreg":
            # the bridge is jobreg's own Python: make it import this source tree's registry
            source = str(pathlib.Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = os.pathsep.join(
                [source, *filter(None, [env.get("PYTHONPATH")])])
        try:
            p.proc = _popen(_with_parent_death_signal(p.argv), stdin=subprocess.DEVNULL,
                            stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
                            env=env, cwd=p.directory)
        except OSError as e:
            raise BrokerStartError(f"cannot run java for Flink's {p.name}: {e}") from e
        finally:
            console.close()

    def _wait_ready(self, deadline: float) -> None:
        assert self.taskmanager is not None
        for p in (*self.jobmanagers, self.taskmanager):
            if not p.is_running():
                raise BrokerStartError(_tail(f"Flink's {p.name} exited at start", p))
        for jm in self.jobmanagers:
            while True:
                try:
                    overview = self.rest(jm, "/overview", timeout=2)
                    if overview.get("slots-total", 0) >= self._slots:
                        break
                except (OSError, ValueError, urllib.error.URLError):
                    pass
                for p in (jm, self.taskmanager):
                    if not p.is_running():
                        raise BrokerStartError(_tail(
                            f"Flink's {p.name} exited with code {p.proc.returncode if p.proc else '?'}"
                            " before the cluster was ready", p))
                if time.monotonic() > deadline:
                    stuck = [note for q in (*self.jobmanagers, self.taskmanager)
                             if (note := _deadlock(q))]
                    if stuck:
                        raise BrokerStartError(
                            f"Flink's {jm.name} did not show the TaskManager's slots on "
                            f"{jm.rest} within {self._startup_timeout:g} s: {stuck[0]}")
                    raise BrokerStartError(_tail(
                        f"Flink's {jm.name} did not show the TaskManager's slots on "
                        f"{jm.rest} within {self._startup_timeout:g} s", jm))
                time.sleep(0.25)
        self._say(f"Flink {FLINK_VERSION}: {self._count} JobManager(s) on " + ", ".join(
            jm.rest for jm in self.jobmanagers))

    def _kill_all(self) -> None:
        for p in (*self.jobmanagers, *([self.taskmanager] if self.taskmanager else [])):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.proc.wait(timeout=10)
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def _remove_temp(self) -> None:
        if self._temp is not None and not os.environ.get("JOBREG_KEEP_FLINK"):
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None


# The Dispatcher's runner says when its JobManager process gains and loses leadership (one
# leader election per process in Flink 2: every component is granted and revoked at once).
_GRANTED = r"DefaultDispatcherRunner was granted leadership"
_REVOKED = r"DefaultDispatcherRunner was revoked the leadership"


def granted_at(jm: FlinkProcess) -> float | None:
    """When ``jm``'s log last says it was granted leadership (epoch seconds), else ``None``."""
    found = jm.log_lines(_GRANTED)
    return found[-1][0] if found else None


def revoked_at(jm: FlinkProcess) -> float | None:
    """When ``jm``'s log last says its leadership was revoked, else ``None``."""
    found = jm.log_lines(_REVOKED)
    return found[-1][0] if found else None


def _deadlock(p: FlinkProcess) -> str | None:
    """If ``jstack`` finds a Java-level deadlock in ``p``: one line naming its first two
    frames (the whole dump is kept as ``jstack.txt`` in ``p``'s folder); else ``None``."""
    jstack = shutil.which("jstack")
    if jstack is None or not p.is_running():
        return None
    try:
        dump = subprocess.run([jstack, str(p.pid)], capture_output=True, text=True,
                              timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    (p.directory / "jstack.txt").write_text(dump)
    if "Found one Java-level deadlock" not in dump:
        return None
    part = dump.split("Java stack information for the threads listed above:", 1)[-1]
    frames = [ln.strip()[3:] for ln in part.splitlines() if ln.strip().startswith("at ")]
    return (f"{p.name} is deadlocked ({' / '.join(frames[:2])}; "
            f"the thread dump is {p.directory / 'jstack.txt'})")


def _fresh(taken: set[int]) -> int:
    for _ in range(50):
        port = _free_port("127.0.0.1")
        if port not in taken:
            taken.add(port)
            return port
    raise BrokerStartError("cannot find free ports on 127.0.0.1")


def _tail(message: str, p: FlinkProcess) -> str:
    tail = p.log_tail().splitlines()
    last = tail[-1].strip() if tail else ""
    return f"{message}; its log ends: {last[:300]} (more in {p.directory})" if last else message


def _default_jobreg_command() -> str:
    beside = pathlib.Path(sys.executable).parent / "jobreg"
    if beside.exists():
        return str(beside)
    found = shutil.which("jobreg")
    return found or str(beside)


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[FlinkCluster]:
    """``with running(ha=...) as flink:`` — a started :class:`FlinkCluster`, stopped after."""
    cluster = FlinkCluster(**kwargs)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
