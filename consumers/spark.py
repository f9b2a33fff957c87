"""Spark sessions for the audit consumers, and a Kafka stream from whichever source exists.

:func:`spark_session` starts a local session the way this project runs Spark (loopback only,
no UI, the current interpreter for Python workers) and registers the ``jobreg-kafka``
source. :func:`read_stream` returns the topic as a streaming DataFrame with Spark's Kafka
schema, from Spark's built-in ``kafka`` source when its connector is on the classpath and
from ``jobreg-kafka`` otherwise, with the same option names either way.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from registry.extras import needs

with needs("spark", "the Spark audit job (consumers.spark)"):
    from pyspark.sql import DataFrame, SparkSession

from registry.errors import BrokerStartError, ConfigError, RegistryError
from registry.kafka_config import Kafka, java_client_options

from .kafka_source import SOURCE_NAME, KafkaOptionError, KafkaSource

__all__ = [
    "CONNECTOR_ARTIFACT",
    "EMBEDDED_CLUSTER_PREFIX",
    "EMBEDDED_WHY",
    "NEAREST_CONNECTOR",
    "SourceChoice",
    "choose_source",
    "connector_jars",
    "connector_versions",
    "launch_args",
    "on_embedded_broker",
    "DAEMON_CONF",
    "DEFAULT_CONF",
    "LOCAL_CONF",
    "KafkaConnectorMissing",
    "NoExecutors",
    "executors",
    "is_local",
    "session_conf",
    "wait_for_executors",
    "connector_package",
    "kafka_format_available",
    "read_stream",
    "spark_session",
]

#: Settings every session gets unless the launch settled them (spark-defaults.conf,
#: ``--conf``) or ``extra_conf`` overrides them.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    # spark.default.parallelism is left to the master (local[N]: N), which the audit job
    # reads as the number of tasks a micro-batch runs in (consumers.audit_job.fold_plan).
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.sql.adaptive.enabled": "false",  # not used by streaming queries; it warns if on
    # The audit tasks commit to the database: a speculative copy would be fenced (row lock,
    # compare-and-set on the progress) but would fold its batch twice for nothing.
    "spark.speculation": "false",
}

#: Settings of local masters only (``local``, ``local[N]``): the driver on loopback. A
#: cluster's executors on other hosts must reach the driver, so there its address comes from
#: the standard places (``spark.driver.host``, ``SPARK_LOCAL_IP``, ``SPARK_PUBLIC_DNS``).
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}

#: Python workers are forked from a daemon that has imported the fold and the source already
#: (consumers/spark_daemon.py), so a new worker's first task does not pay for it. Set where
#: the workers can import jobreg before any task: local masters (this interpreter), and
#: clusters that were shipped jobreg (``spark.archives``, or a zip on ``--py-files``, put on
#: the daemon's path with ``spark.executorEnv.PYTHONPATH``); elsewhere Spark's own daemon.
DAEMON_CONF = {"spark.python.daemon.module": "consumers.spark_daemon"}

DEFAULT_MASTER = "local[2]"


#: Lines the JVM writes to stderr that are not Spark's log and tell a jobreg user nothing:
#: Spark's launcher always adds the incubating Vector API module (``--add-modules=
#: jdk.incubator.vector``, unconditionally) and the JVM announces it before any logging starts.
JVM_NOISE = (b"WARNING: Using incubator modules: ",)


class KafkaConnectorMissing(RegistryError, RuntimeError):
    """``source="kafka"`` was asked for, but Spark's Kafka connector is not on the classpath
    or cannot be had (:func:`choose_source`)."""


def is_local(master: str) -> bool:
    """Whether ``master`` runs everything in this process (``local``, ``local[N]``,
    ``local[N,F]``, ``local[*]``)."""
    return master == "local" or master.startswith("local[")


def _defaults_file_master() -> str | None:
    """``spark.master`` of the spark-defaults.conf spark-submit would read, if any."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME")
        else None)
    if not conf_dir:
        return None
    path = Path(conf_dir) / "spark-defaults.conf"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0] == "spark.master":
            return parts[1].strip()
    return None


def _launch_master(explicit: str | None) -> str | None:
    """The master as far as it is known before the JVM starts: ``explicit``, the ``--master``
    of ``PYSPARK_SUBMIT_ARGS``, spark-defaults.conf's ``spark.master``; None under
    spark-submit (the JVM that runs this process knows) or when nothing names one."""
    if explicit:
        return explicit
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    args = os.environ.get("PYSPARK_SUBMIT_ARGS", "").split()
    for i, arg in enumerate(args[:-1]):
        if arg == "--master":
            return args[i + 1]
        if arg == "--conf" and args[i + 1].startswith("spark.master="):
            return args[i + 1].split("=", 1)[1]
    return _defaults_file_master()


def session_conf(master: str, launched: Mapping[str, str],
                 extra_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings :func:`spark_session` gives a session for ``master``: :data:`DEFAULT_CONF`
    (plus :data:`LOCAL_CONF` for a local master, and :data:`DAEMON_CONF` where the workers
    can import jobreg), each only where ``launched`` (what spark-submit settled:
    spark-defaults.conf, ``--conf``, ``PYSPARK_SUBMIT_ARGS``) has no value; then
    ``extra_conf`` (``jobreg audit run --spark-conf``), which wins over everything.

    On a cluster, zips on ``spark.submit.pyFiles`` are put on the Python daemon's path
    (``spark.executorEnv.PYTHONPATH``, their names in the executor's working directory,
    where Spark fetches them) unless that is set, so the daemon can import jobreg from them.
    """
    local = is_local(master)
    defaults = {**DEFAULT_CONF, **(LOCAL_CONF if local else {})}
    zips = [Path(f).name for f in launched.get("spark.submit.pyFiles", "").split(",")
            if f.strip().lower().endswith(".zip")]
    if not local and zips:
        defaults["spark.executorEnv.PYTHONPATH"] = ":".join(zips)
    if local or zips or launched.get("spark.archives"):
        defaults.update(DAEMON_CONF)
    conf = {k: v for k, v in defaults.items() if k not in launched}
    conf.update(extra_conf or {})
    return conf


LOG4J = Path(__file__).with_name("log4j2.properties")
"""The driver's log configuration: errors only (Spark's default prints INFO and WARN lines, and
a log-level banner unless the Py4J gateway's logger has a level)."""


def _quiet_driver_log() -> None:
    """Give the driver JVM this process is about to start :data:`LOG4J`, through
    ``SPARK_SUBMIT_OPTS`` (the launcher puts it on the driver's command line before
    ``spark.driver.extraJavaOptions``, so a log configuration a user gives there still wins).
    The JVM starts before any session setting can reach it, so a ``spark.driver.*`` setting of
    the session's would come too late. Nothing is added when ``SPARK_SUBMIT_OPTS`` names a
    log configuration already."""
    opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if "log4j2.configurationFile" not in opts:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{opts} -Dlog4j2.configurationFile=file:{LOG4J}".strip()


def spark_session(app_name: str = "jobreg-audit", master: str | None = None,
                  extra_conf: Mapping[str, str] | None = None,
                  jars: Sequence[str] = ()) -> SparkSession:
    """A Spark session for the audit jobs, with ``jobreg-kafka`` registered.

    The master: ``$JOBREG_SPARK_MASTER``, else ``master``, else what the launch says
    (``spark-submit --master``, ``PYSPARK_SUBMIT_ARGS``, spark-defaults.conf's
    ``spark.master``; spark-submit's own fallback ``local[*]`` does not count), else
    ``local[2]``. Every setting comes from the standard places first (spark-defaults.conf
    in ``$SPARK_CONF_DIR``, ``--conf`` in ``PYSPARK_SUBMIT_ARGS`` or on spark-submit,
    ``SPARK_*`` environment), then :func:`session_conf`'s defaults where those are silent,
    then ``extra_conf``. For a local master (only) the driver defaults to loopback:
    ``SPARK_LOCAL_IP`` to 127.0.0.1 and ``PYSPARK_PYTHON`` to this interpreter unless set.
    When this process starts the driver's JVM, ``jars`` (Spark's Kafka connector and its
    dependencies: :func:`choose_source`) are put on its command line (``--jars``, added to
    those of ``PYSPARK_SUBMIT_ARGS``), and so is ``$JOBREG_SPARK_PACKAGES`` (``--packages``:
    Maven coordinates Spark resolves itself); a JVM already running (``spark-submit``, an
    earlier session of this process) keeps the classpath it has. The SIGINT handler in place
    before the call stays (pyspark's would turn Ctrl-C into ``KeyboardInterrupt`` anywhere in
    the caller; :func:`_sigint_kept`). The driver's JVM, when this process starts it, logs errors only
    (:data:`LOG4J`) and its stderr drops :data:`JVM_NOISE`. Sets the log level to ERROR. If a session is already active in this
    process, ``getOrCreate`` returns it (JVM-level settings then stay as they were).
    """
    from pyspark import SparkConf, SparkContext

    wanted = os.environ.get("JOBREG_SPARK_MASTER") or master
    before = _launch_master(wanted)
    if (before is None or is_local(before)) and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # before the JVM starts
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # this process starts the driver's JVM
        _quiet_driver_log()
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if SparkContext._gateway is None and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Jars and packages reach the driver's class loader only on the JVM's command line:
        # as session settings they would come after the JVM has started.
        os.environ["PYSPARK_SUBMIT_ARGS"] = launch_args(
            submit_args, jars, os.environ.get("JOBREG_SPARK_PACKAGES"))
    try:
        with _jvm_stderr_filtered(), _sigint_kept():
            SparkContext._ensure_initialized()  # the JVM, with spark-defaults.conf and --conf
    finally:
        if submit_args is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args
    launched = dict(SparkConf().getAll())
    chosen = wanted or (launched.get("spark.master")
                        if launched.get("spark.master") not in (None, "local[*]") else None) \
        or DEFAULT_MASTER
    if is_local(chosen):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(chosen)
    for key, value in session_conf(chosen, launched, extra_conf).items():
        builder = builder.config(key, value)
    with _sigint_kept():
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaSource)
    return spark


def launch_args(existing: str | None, jars: Sequence[str], packages: str | None) -> str:
    """``PYSPARK_SUBMIT_ARGS`` with ``jars`` added to its ``--jars`` (or a new ``--jars``) and
    ``packages`` to its ``--packages``; ``pyspark-shell`` (what pyspark launches when the
    variable is unset) stays last."""
    args = shlex.split(existing) if existing else ["pyspark-shell"]
    for flag, extra in (("--jars", ",".join(jars)), ("--packages", packages or "")):
        if not extra:
            continue
        if flag in args[:-1]:
            i = args.index(flag) + 1
            args[i] = f"{args[i]},{extra}"
        else:
            args[-1:-1] = [flag, extra]
    return shlex.join(args)


@contextmanager
def _sigint_kept() -> Iterator[None]:
    """Keep the SIGINT handler in place before the block: a SparkContext made in the main
    thread installs its own, which cancels every job and raises ``KeyboardInterrupt`` in
    whatever the main thread is doing (``jobreg audit run --follow`` would end as
    "Aborted!" in the middle of a batch instead of between two, as SIGTERM does)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


@contextmanager
def _jvm_stderr_filtered() -> Iterator[None]:
    """Run the block with this process's stderr (fd 2) going through a relay that drops the
    lines of :data:`JVM_NOISE`: a JVM the block starts keeps that stderr for its lifetime,
    so everything it (and the Python workers it forks) writes reaches this process's stderr,
    line by line, but those. If the block starts no process, the relay ends with it."""
    sys.stderr.flush()
    try:
        real = os.dup(2)  # this process's stderr: where the relay writes, while it runs
    except OSError:  # no stderr at all: nothing to keep clean
        yield
        return
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    threading.Thread(target=_relay, args=(read, real), name="jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(real, 2)  # the pipe's write end now stays open only in what the block started


def _relay(read: int, out: int) -> None:
    try:
        with os.fdopen(read, "rb") as pipe:
            for line in pipe:
                if not line.startswith(JVM_NOISE):
                    view = memoryview(line)
                    while view:
                        view = view[os.write(out, view):]
    except OSError:  # our stderr is gone: nothing left to say it to
        pass
    finally:
        os.close(out)


def executors(spark: SparkSession) -> int:
    """How many executors are registered with the driver now (local mode: 1)."""
    sc = spark.sparkContext
    count = sc._jsc.sc().getExecutorMemoryStatus().size()  # the driver's block manager too
    master = sc.master or ""  # set on every running context (pyspark types it Optional)
    return 1 if is_local(master) else max(0, count - 1)


def wait_for_executors(spark: SparkSession, timeout: float,
                       clock: Any = time.monotonic, sleep: Any = time.sleep) -> int:
    """Wait until at least one executor has registered with the driver, at most ``timeout``
    seconds; raise :class:`NoExecutors` (one line: the master and the driver's address that
    executors must reach) if none did. On a cluster whose executors cannot connect back to
    the driver, Spark keeps launching new ones and a query waits for ever."""
    deadline = clock() + timeout
    while True:
        n = executors(spark)
        if n > 0:
            return n
        if clock() >= deadline:
            conf = spark.sparkContext.getConf()
            raise NoExecutors(
                f"no executor registered with the driver within {timeout:g} s (master "
                f"{spark.sparkContext.master}; executors must reach the driver at "
                f"{conf.get('spark.driver.host', '?')}:{conf.get('spark.driver.port', '?')}: "
                "set spark.driver.host (jobreg audit run --driver-host) to an address the "
                "worker hosts reach, and check that the workers have free cores and memory)")
        sleep(0.5)


class NoExecutors(RuntimeError):
    """No executor registered with the driver in time (:func:`wait_for_executors`)."""


def connector_package(spark: SparkSession) -> str:
    """The Maven coordinates of the Kafka connector matching this Spark (Scala 2.13)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark.version}"


#: Maven coordinates of Spark's Kafka connector, without the version.
CONNECTOR_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"

#: Connector releases to use when Maven Central has none of the installed Spark's version:
#: Spark 4.3.0's connector (like the rest of Spark 4.3.0's jars) is not on Maven Central, whose
#: newest is 4.2.0, and 4.2.0's connector reads with pyspark 4.3.0
#: (tests/integration/test_audit_spark.py runs the audit job on it).
NEAREST_CONNECTOR: dict[str, str] = {"4.3.0": "4.2.0"}


def connector_versions(spark_version: str) -> list[str]:
    """The connector releases to try for ``spark_version``, best first: its own, then
    :data:`NEAREST_CONNECTOR`'s. ``$JOBREG_SPARK_KAFKA_VERSION`` names the one release."""
    named = os.environ.get("JOBREG_SPARK_KAFKA_VERSION", "").strip()
    if named:
        return [named]
    nearest = NEAREST_CONNECTOR.get(spark_version)
    return [spark_version, *([nearest] if nearest else [])]


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients`` (a Maven jar's name without its
    version)."""
    name = Path(jar).name
    m = re.match(r"^(.+)-\d+(?:\.\d+)+[\w.\-]*\.jar$", name)
    return m.group(1) if m else name.removesuffix(".jar")


def connector_jars(jars: Sequence[str | Path], spark_jars: Path | None = None) -> list[str]:
    """The jars of the connector's runtime closure that this Spark does not ship already
    (``spark_jars``: pyspark's ``jars`` folder): ``spark-sql-kafka-0-10``,
    ``spark-token-provider-kafka-0-10``, ``kafka-clients``, ``commons-pool2``. Jars Spark has
    in another version (``scala-library``, ``spark-tags``, ``slf4j-api``, ...) stay out, as
    ``spark-submit --packages`` leaves Spark's own out: the classpath keeps one of each."""
    if spark_jars is None:
        import pyspark

        spark_jars = Path(pyspark.__file__).parent / "jars"
    shipped = {_artifact(j.name) for j in spark_jars.glob("*.jar")}
    return [str(j) for j in jars if _artifact(str(j)) not in shipped]


def _named_jars(spec: str) -> list[str]:
    """``--kafka-jars``: comma-separated jar files and folders (every ``*.jar`` in them)."""
    out: list[str] = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(str(j) for j in path.glob("*.jar"))
            if not found:
                raise ConfigError(f"--kafka-jars: {path} holds no *.jar")
            out += found
        elif path.is_file():
            out.append(str(path))
        else:
            raise ConfigError(f"--kafka-jars: {path} does not exist")
    if not any(_artifact(j) == "spark-sql-kafka-0-10_2.13" for j in out):
        raise ConfigError(f"--kafka-jars names no spark-sql-kafka-0-10_2.13 jar: {spec}")
    return out


#: How the cluster id of jobreg's embedded broker begins (``registry/dev/broker.py`` starts
#: every Tansu with ``--cluster-id jobreg-embedded-<hex>``; a unit test holds the two alike).
EMBEDDED_CLUSTER_PREFIX = "jobreg-embedded-"

#: Why ``auto`` leaves Spark's source aside on the embedded broker (README "What differs").
EMBEDDED_WHY = ("the embedded broker: its ListOffsets under-reports what an idempotent "
                "producer wrote outside a transaction, and Spark's kafka source would stop "
                "there")


def on_embedded_broker(kafka: str | Kafka, timeout: float = 10.0) -> bool:
    """Whether ``kafka`` is jobreg's embedded broker (Tansu), by the cluster id it was started
    with (:data:`EMBEDDED_CLUSTER_PREFIX`); False when the cluster does not answer (the run
    then says why itself). A Tansu started by hand under another cluster id is not
    recognised: ``--source python`` is the choice there."""
    from confluent_kafka.admin import AdminClient

    k = Kafka.of(kafka)
    try:
        admin = AdminClient(k.settings({"log_level": 0}, {}))
        cluster = admin.list_topics(timeout=timeout).cluster_id
    except Exception:  # unreachable, refused: not this function's to say
        return False
    return bool(cluster) and str(cluster).startswith(EMBEDDED_CLUSTER_PREFIX)


@dataclass(frozen=True)
class SourceChoice:
    """Which source the audit job reads with (``"kafka"``: Spark's, ``"python"``:
    ``jobreg-kafka``), the jars to start the JVM with, and why, in words for one line."""

    source: Literal["auto", "kafka", "python"]
    jars: tuple[str, ...]
    why: str


def choose_source(requested: Literal["auto", "python", "kafka"], kafka: str | Kafka, *,
                  spark_version: str, named_jars: str | None = None,
                  fetch: Callable[[str, bool], list[Path] | None] | None = None,
                  on_classpath: bool = False, embedded: bool = False) -> SourceChoice:
    """Settle the audit job's source before Spark starts.

    ``--source python`` is ``jobreg-kafka``. Otherwise Spark's ``kafka`` source, with its
    connector from, in order: ``named_jars`` (``--kafka-jars`` / ``$JOBREG_SPARK_KAFKA_JARS``:
    files or folders, for a machine without Maven Central); the launch's own classpath
    (``on_classpath``: ``--jars/--packages`` in ``PYSPARK_SUBMIT_ARGS``,
    ``$JOBREG_SPARK_PACKAGES``; under ``spark-submit`` the JVM runs already and ``auto``
    stays ``auto``: the connector is used if its launch put it on the classpath); the
    cache, then Maven Central, through ``fetch(version, download)`` (``registry.dev.kafka.
    spark_kafka_jars``; ``download=False``: the cache only, None if not there), for each of
    :func:`connector_versions`. ``auto`` falls back to ``jobreg-kafka`` on the embedded
    broker (``embedded``: :func:`on_embedded_broker`; :data:`EMBEDDED_WHY`), when the client
    settings have no Java client name (``--command-config`` properties only librdkafka
    knows) or no connector can be had, and says why; ``kafka`` then fails in one line
    (:class:`KafkaConnectorMissing`, :class:`~registry.errors.ConfigError`).
    """
    if requested == "python":
        return SourceChoice("python", (), "--source python")
    if requested == "auto" and embedded:
        return SourceChoice("python", (), EMBEDDED_WHY)
    try:
        java_client_options(Kafka.of(kafka).config)
    except ConfigError as e:
        if requested == "kafka":
            raise ConfigError(f"--source kafka: {e}") from None
        return SourceChoice("python", (), f"the client settings are librdkafka's only: {e}")
    if named_jars:
        return SourceChoice("kafka", tuple(connector_jars(_named_jars(named_jars))),
                            f"the connector jars named by --kafka-jars: {named_jars}")
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # spark-submit: the classpath is settled
        return SourceChoice(requested, (), "spark-submit's classpath")
    if on_classpath:
        return SourceChoice("kafka", (), "the connector is on the launch's classpath")
    versions = connector_versions(spark_version)
    failures: list[str] = []
    if fetch is not None:
        for download in (False, True):
            for version in versions:
                try:
                    found = fetch(version, download)
                except BrokerStartError as e:  # no mvn, or Maven could not fetch it
                    failures.append(str(e))
                    if "Could not find artifact" not in str(e):
                        break  # not a missing release: the next one would fail alike
                    continue
                if found:
                    jars = connector_jars(found)
                    where = str(Path(found[0]).parent.parent)
                    why = f"connector {CONNECTOR_ARTIFACT}:{version}"
                    if version != spark_version:
                        why += f" (Maven Central has none of Spark {spark_version})"
                    return SourceChoice("kafka", tuple(jars), f"{why}, jars in {where}")
            if failures and "Could not find artifact" not in failures[-1]:
                break
    reason = failures[-1] if failures else "no way to fetch it here"
    if requested == "kafka":
        raise KafkaConnectorMissing(
            f"Spark's Kafka connector cannot be had: {reason}; name its jars with "
            "--kafka-jars (or $JOBREG_SPARK_KAFKA_JARS), or use --source python")
    return SourceChoice("python", (), f"Spark's Kafka connector cannot be had: {reason}")


def kafka_format_available(spark: SparkSession) -> bool:
    """Whether Spark's built-in ``kafka`` format can be used (its connector is on the
    classpath). Asks the JVM the way ``format("kafka")`` would, without reading anything."""
    jvm = getattr(spark, "_jvm", None) or spark.sparkContext._jvm
    try:
        data_source = getattr(jvm, "org.apache.spark.sql.execution.datasources.DataSource")
        data_source.lookupDataSource("kafka", spark._jsparkSession.sessionState().conf())
        return True
    except Exception as e:  # Py4JJavaError wrapping DATA_SOURCE_NOT_FOUND
        text = str(e)
        if "DATA_SOURCE_NOT_FOUND" in text or "ClassNotFound" in text or \
                "Failed to find data source" in text:
            return False
        raise


def _ensure_registered(spark: SparkSession) -> None:
    """Register ``jobreg-kafka`` unless this session has it (re-registering logs a warning)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        if manager.dataSourceExists(SOURCE_NAME):
            return
    except Exception:  # no JVM handle (Spark Connect): just register
        pass
    spark.dataSource.register(KafkaSource)


def _kafka_name(key: str) -> str:
    """``fetch_wait_max_ms`` -> ``kafka.fetch.wait.max.ms``; ``kafka.x`` stays."""
    if key.startswith("kafka."):
        return key
    if "." not in key:
        key = key.replace("_", ".")
    return f"kafka.{key}"


def read_stream(spark: SparkSession, bootstrap: str | Kafka, topic: str, *,
                source: Literal["auto", "python", "kafka"] = "auto",
                starting_offsets: str = "earliest",
                max_offsets_per_trigger: int | None = None,
                options: Mapping[str, Any] | None = None,
                **kafka_options: Any) -> DataFrame:
    """The topic as a streaming DataFrame with Spark's Kafka schema.

    ``source``: ``"kafka"`` (Spark's built-in source; :class:`KafkaConnectorMissing` if
    its connector is not on the classpath), ``"python"`` (``jobreg-kafka``) or ``"auto"``
    (``kafka`` when available, else ``jobreg-kafka``). Both read with
    ``kafka.isolation.level=read_committed`` unless told otherwise.

    ``options``: further source options by their Spark names (``failOnDataLoss``,
    ``includeHeaders``, ``kafkaConsumer.pollTimeoutMs``, ...). ``kafka_options``: Kafka
    client settings, given as Kafka spells them (``**{"fetch.wait.max.ms": 10}``) or with
    underscores for dots (``fetch_wait_max_ms=10``); each becomes the ``kafka.``-prefixed
    option. The client differs by source (librdkafka for ``jobreg-kafka``, the Java client
    for ``kafka``), and so do a few setting names.

    ``bootstrap`` may be a :class:`~registry.kafka_config.Kafka` with the extra client
    properties of a secured cluster (librdkafka's names): ``jobreg-kafka`` takes them as
    they are, Spark's built-in source as the Java client spells them
    (:func:`~registry.kafka_config.java_client_options`); each with the ``kafka.`` prefix.
    """
    if source not in ("auto", "python", "kafka"):
        raise KafkaOptionError(f"source must be 'auto', 'python' or 'kafka', not {source!r}")
    if source == "auto":
        source = "kafka" if kafka_format_available(spark) else "python"
    elif source == "kafka" and not kafka_format_available(spark):
        raise KafkaConnectorMissing(
            "Spark's built-in 'kafka' source is not on the classpath: add the connector "
            f"package {connector_package(spark)} (spark.jars.packages, or its jar and "
            "dependencies in spark.jars), or use source='python' (jobreg-kafka)")
    kafka = Kafka.of(bootstrap)
    try:
        secured = dict(kafka.config) if source == "python" else java_client_options(kafka.config)
    except ConfigError as e:
        raise KafkaOptionError(str(e)) from None
    merged: dict[str, Any] = {
        **{f"kafka.{k}": v for k, v in secured.items()},
        "kafka.bootstrap.servers": kafka.bootstrap,
        "subscribe": topic,
        "startingOffsets": starting_offsets,
        "kafka.isolation.level": "read_committed",
    }
    if max_offsets_per_trigger is not None:
        merged["maxOffsetsPerTrigger"] = max_offsets_per_trigger
    merged.update({_kafka_name(k): v for k, v in kafka_options.items()})
    merged.update(options or {})
    fmt = "kafka" if source == "kafka" else SOURCE_NAME
    if fmt == SOURCE_NAME:
        _ensure_registered(spark)
    reader = spark.readStream.format(fmt)
    for key, value in merged.items():
        reader = reader.option(key, str(value).lower() if isinstance(value, bool) else value)
    return reader.load()
