"""The audit job on a Spark standalone cluster (issue 28): a master and two workers started
from the pyspark package on this machine, one of them in a network namespace of its own (a
second host: its own address, reaching the driver, the broker and the database over a veth
pair the test made), the job submitted with ``spark-submit`` the way the README's "Running
on a Spark cluster" says (jobreg shipped as a zip on ``--py-files``, the workers' Python
has jobreg's dependencies but not jobreg), a worker killed mid-batch, exactly once checked
with ``audit check``. Everything listens on 127.0.0.1 or on the addresses of the veth pair
(10.200.N.1 on this side, 10.200.N.2 inside the namespace); no traffic leaves them.

Skipped, with the reason, where network namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.pg import query_as_reader
from support.sparkcluster import SPARK_HOME, SparkCluster, free_port

import registry
from registry import Registry
from registry.audit.db import migrate
from registry.dev.broker import find_tansu_binary
from registry.dev.kafka import KafkaCluster
from registry.dev.pgcluster import ThrowawayPostgres, find_pg_bindir
from registry.log import TopicConfig, ensure_topic

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(registry.__file__).resolve().parents[1]


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class Netns:
    """A network namespace with one end of a veth pair inside it."""

    name: str
    host_ip: str  # this side of the pair
    ns_ip: str  # inside the namespace
    cidr: str


@pytest.fixture
def netns() -> Iterator[Netns]:
    """A network namespace and a veth pair 10.200.N.1 <-> 10.200.N.2/30, removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    tag = uuid.uuid4().hex[:6]
    n = int(tag, 16) % 250 + 1
    ns = Netns(f"jobreg-{tag}", f"10.200.{n}.1", f"10.200.{n}.2", f"10.200.{n}.0/30")
    host_if, ns_if = f"jrh{tag}", f"jrn{tag}"
    try:
        _run("ip", "netns", "add", ns.name)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a network namespace here: {e.stderr.strip()}")
    try:
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", ns.name)
        _run("ip", "addr", "add", f"{ns.host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        _run("ip", "netns", "exec", ns.name, "ip", "addr", "add", f"{ns.ns_ip}/30", "dev", ns_if)
        _run("ip", "netns", "exec", ns.name, "ip", "link", "set", ns_if, "up")
        _run("ip", "netns", "exec", ns.name, "ip", "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


@pytest.fixture
def veth_broker(netns: Netns, tmp_path: Path) -> Iterator[str]:
    """Tansu listening on this side's veth address (so the namespace reaches it)."""
    port = free_port()
    address = f"{netns.host_ip}:{port}"
    log = (tmp_path / "tansu.log").open("w")
    proc = subprocess.Popen([str(find_tansu_binary()), "broker", "--listener-url",
                             f"tcp://{address}", "--advertised-listener-url",
                             f"tcp://{address}", "--storage-engine", "memory://tansu/"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        ensure_topic(address, "jobreg", TopicConfig())
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def veth_pg(netns: Netns) -> Iterator[str]:
    """A throwaway PostgreSQL also listening on this side's veth address, trusting the pair."""
    try:
        find_pg_bindir()
    except Exception as e:  # no server binaries: the PostgreSQL tests skip the same way
        pytest.skip(f"no PostgreSQL server binaries: {e}")
    with ThrowawayPostgres(also_listen=netns.host_ip, trust=netns.cidr) as pg:
        url = pg.create_database("audit").replace("@127.0.0.1:", f"@{netns.host_ip}:")
        migrate(url)
        yield url


def workers_python(tmp: Path) -> Path:
    """A Python with jobreg's dependencies but not jobreg: a virtualenv that sees this one's
    site-packages through a .pth line (which does not run that directory's own .pth files,
    so the editable install of jobreg is not on its path)."""
    env = tmp / "workers-python"
    venv.EnvBuilder(with_pip=False).create(env)
    site = next((env / "lib").glob("python*/site-packages"))
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and
                (p / "pyspark").is_dir())
    (site / "deps.pth").write_text(f"{deps}\n")
    python = env / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import consumers"], capture_output=True,
                           cwd=tmp, env={k: v for k, v in os.environ.items()
                                         if k != "PYTHONPATH"})  # installed, not pointed to
    assert probe.returncode != 0, "the workers' Python must not have jobreg"
    return python


def jobreg_zip(tmp: Path) -> Path:
    """jobreg's code as one zip, laid out as installed (schemas and migrations inside
    registry), for --py-files."""
    out = tmp / "jobreg.zip"
    with zipfile.ZipFile(out, "w") as z:
        for package, into in (("registry", "registry"), ("consumers", "consumers"),
                              ("schemas", "registry/schemas"),
                              ("migrations", "registry/migrations")):
            for f in (ROOT / package).rglob("*"):
                if f.is_file() and "__pycache__" not in f.parts:
                    z.write(f, f"{into}/{f.relative_to(ROOT / package)}")
    return out


def submit(cluster: SparkCluster, netns: Netns, tmp: Path, bootstrap: str, url: str,
           *args: str, jars: tuple[str, ...] = ()) -> subprocess.Popen:
    """``spark-submit`` of ``jobreg audit run`` as the README says, the driver on this
    side's veth address; ``jars`` (Spark's Kafka connector) on ``--jars``."""
    cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url,
           *(["--jars", ",".join(jars)] if jars else []),
           "--py-files", str(jobreg_zip(tmp)),
           "--conf", f"spark.pyspark.python={workers_python(tmp)}",
           "--conf", f"spark.pyspark.driver.python={sys.executable}",
           "--conf", f"spark.driver.host={netns.host_ip}",
           "--conf", f"spark.driver.bindAddress={netns.host_ip}",
           "--conf", "spark.executor.memory=512m",
           str(Path(registry.__file__).with_name("__main__.py")),
           "--bootstrap", bootstrap, "audit", "run", "--db", url, *args]
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME),
           "SPARK_LOCAL_IP": netns.host_ip}  # the driver's JVM binds nothing elsewhere
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "JOBREG_SPARK_MASTER",
                 "PYSPARK_SUBMIT_ARGS"):
        env.pop(name, None)
    # spark-submit's JVM passes the Python driver's stdout and stderr on as its stdout
    proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    SUBMITTED.append(proc)
    return proc


SUBMITTED: list[subprocess.Popen] = []


@pytest.fixture
def submitted() -> Iterator[None]:
    """Whatever spark-submit a test started is ended (its process group: the JVM and the
    Python driver) when the test ends, passed or not."""
    yield
    while SUBMITTED:
        proc = SUBMITTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def driver(submitted: subprocess.Popen) -> int:
    """The pid of the Python driver that spark-submit's JVM runs (the process that takes
    SIGTERM as ``audit run --follow``'s stop): the process of spark-submit's session (it
    was started in a session of its own) that runs ``registry/__main__.py``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == submitted.pid:
            continue
        try:
            if os.getsid(int(entry.name)) != submitted.pid:
                continue
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if any(part.endswith(b"registry/__main__.py") for part in cmdline):
            return int(entry.name)
    raise AssertionError("no Python driver in spark-submit's session")


def write_jobs(bootstrap: str, namespaces: int, jobs: int, first: int = 0) -> None:
    for i in range(namespaces):
        reg = Registry.connect(bootstrap, f"ns-{i}")
        try:
            term = reg.claim_leadership(f"jm-{first}")
            for j in range(first, first + jobs):
                term.submit(f"job-{j}", b"g")
        finally:
            reg.close()


def jobreg(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "registry", *args], capture_output=True,
                          text=True, timeout=300)


def exactly_once(bootstrap: str, url: str) -> int:
    """``audit check`` agrees and every (partition, offset) is in the table once."""
    checked = jobreg("--bootstrap", bootstrap, "audit", "check", "--db", url)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    _, rows = query_as_reader(url, 'SELECT count(*), count(DISTINCT (partition, "offset")) '
                                   "FROM audit_records")
    assert rows[0][0] == rows[0][1]
    return rows[0][0]


@pytest.mark.embedded_only("starts Tansu of its own on the veth address the second host reaches")
@pytest.mark.timeout(1200)  # two Spark applications on a 2-core machine
def test_the_audit_job_on_a_two_host_cluster_survives_a_killed_worker(
        netns, veth_broker, veth_pg, submitted, tmp_path) -> None:
    bootstrap, url = veth_broker, veth_pg
    with SparkCluster(tmp_path, host=netns.host_ip) as cluster:
        cluster.add_worker()  # this host
        remote = cluster.add_worker(host=netns.ns_ip, netns=netns.name)  # the second host
        write_jobs(bootstrap, namespaces=8, jobs=100)
        once = submit(cluster, netns, tmp_path, bootstrap, url, "--once")
        out, _ = once.communicate(timeout=600)
        assert once.returncode == 0, out[-4000:]
        assert "wrote" in out
        first = exactly_once(bootstrap, url)
        assert first >= 8 * 101
        # Both executors ran tasks: each worker's work directory has an executor's stderr.
        for i in range(2):
            assert list((tmp_path / f"work-{i}").glob("app-*/*/stderr")), f"worker {i} idle"

        # A follow run, small batches over a backlog; the second host's worker is killed
        # (SIGKILL, its process group: worker, executor, Python workers) mid-batch.
        write_jobs(bootstrap, namespaces=8, jobs=300, first=1000)
        follow = submit(cluster, netns, tmp_path, bootstrap, url, "--follow",
                        "--max-offsets-per-trigger", "200", "--interval", "200 milliseconds")
        lines: list[str] = []
        def read() -> None:
            for line in follow.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        while sum(line.startswith("batch ") for line in lines) < 2:
            assert follow.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        cluster.kill(remote)
        expected = first + 8 * 301
        while True:  # the rest of the backlog, on the surviving executor
            _, rows = query_as_reader(url, "SELECT count(*) FROM audit_records")
            if rows[0][0] >= expected:
                break
            assert follow.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(1)
        os.kill(driver(follow), signal.SIGTERM)  # a container's stop: between batches
        follow.wait(120)
        reader.join(10)
        assert follow.returncode == 0, "".join(lines)[-3000:]
        assert exactly_once(bootstrap, url) == expected


@pytest.fixture
def veth_kafka3(netns: Netns, tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes listening on this side's veth address (the second host
    reaches them), replication 3."""
    with KafkaCluster(nodes=3, hosts=[netns.host_ip] * 3,
                      directory=tmp_path / "kafka3") as kafka:
        ensure_topic(kafka.bootstrap, "jobreg", TopicConfig(replication_factor=3), timeout=30.0)
        yield kafka


@pytest.mark.kafka
@pytest.mark.timeout(1200)
def test_sparks_connector_on_a_two_host_cluster_and_three_kafka_nodes(
        netns, veth_kafka3, veth_pg, submitted, tmp_path) -> None:
    """The cluster form with Spark's own Kafka connector (``spark-submit --jars``, as a Spark
    user ships it) against three Kafka nodes: a follow run over a backlog in small batches,
    whose second host's worker is SIGKILLed mid-batch and the Kafka node leading a partition
    with it (back after the backlog is read); exactly once. (``--once`` on a cluster:
    the test below, with ``jobreg-kafka``.)"""
    from support.sparkfixture import MISSING, _required, connector

    jars = connector()
    if not jars:
        (pytest.fail if _required() else pytest.skip)(
            f"Spark's Kafka connector cannot be had: {MISSING.get('why')}")
    bootstrap, url = veth_kafka3.bootstrap, veth_pg
    with SparkCluster(tmp_path, host=netns.host_ip) as cluster:
        cluster.add_worker()  # this host
        remote = cluster.add_worker(host=netns.ns_ip, netns=netns.name)  # the second host
        write_jobs(bootstrap, namespaces=8, jobs=150)
        follow = submit(cluster, netns, tmp_path, bootstrap, url, "--follow", "--source",
                        "kafka", "--max-offsets-per-trigger", "200", "--interval",
                        "200 milliseconds", jars=jars)
        lines: list[str] = []

        def read() -> None:
            for line in follow.stdout:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 600
        while sum(line.startswith("batch ") for line in lines) < 2:
            assert follow.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        said = "".join(lines)
        assert "audit source: Spark's kafka source (spark-submit's classpath)" in said, said
        cluster.kill(remote)
        leader = veth_kafka3.leader_of("jobreg", 0)
        veth_kafka3.kill(leader)
        expected = 8 * 151
        try:
            while True:  # the rest of the backlog: the surviving executor, two Kafka nodes
                _, rows = query_as_reader(url, "SELECT count(*) FROM audit_records")
                if rows[0][0] >= expected:
                    break
                assert follow.poll() is None and time.monotonic() < deadline, \
                    "".join(lines)[-3000:]
                time.sleep(1)
        finally:
            veth_kafka3.restart(leader)
        os.kill(driver(follow), signal.SIGTERM)  # a container's stop: between batches
        follow.wait(120)
        reader.join(10)
        assert follow.returncode == 0, "".join(lines)[-3000:]
        assert exactly_once(bootstrap, url) == expected


def test_no_executor_is_a_one_line_error_not_a_hang(tmp_path, broker, topic) -> None:
    """A master without workers: the run stops after --executor-timeout with one line."""
    ensure_topic(broker.bootstrap, topic, TopicConfig())
    with SparkCluster(tmp_path) as cluster:
        done = jobreg("--bootstrap", broker.bootstrap, "--topic", topic, "audit", "run", "--once",
                      "--db", f"sqlite:///{tmp_path / 'a.db'}", "--master", cluster.master_url,
                      "--driver-host", "127.0.0.1", "--executor-timeout", "5")
    assert done.returncode == 1
    error = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert error and "no executor registered with the driver within 5 s" in error[0]
    assert "127.0.0.1" in error[0] and "Traceback" not in done.stderr


def test_jobreg_runs_from_the_zip_it_ships(tmp_path) -> None:
    """What --py-files ships is enough on its own: imported from the zip, jobreg finds its
    Avro schemas and its migrations (copied out of the zip for Alembic) and its daemon
    preloads the fold."""
    archive = jobreg_zip(tmp_path)
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import registry, consumers.spark_daemon as d\n"
        "assert registry.__file__.startswith(sys.argv[1]), registry.__file__\n"
        "from registry.audit.db import migrate, current_revision\n"
        "migrate(sys.argv[2]); print(current_revision(sys.argv[2]))\n"
        "from registry.wire.schemas import resolved_schemas; print(len(resolved_schemas()))\n"
        "print(d.preload())\n")
    done = subprocess.run([sys.executable, "-c", script, str(archive),
                           f"sqlite:///{tmp_path / 'z.db'}"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    revision, schemas, missing = done.stdout.split("\n")[:3]
    assert revision and int(schemas) > 10 and missing == "[]"
