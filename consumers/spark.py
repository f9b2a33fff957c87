"""Spark sessions for the audit consumers, and a Kafka stream from whichever source exists.

:func:`spark_session` starts a local session the way this project runs Spark (loopback only,
no UI, the current interpreter for Python workers) and registers the ``jobreg-kafka``
source. :func:`read_stream` returns the topic as a streaming DataFrame with Spark's Kafka
schema, from Spark's built-in ``kafka`` source when its connector is on the classpath and
from ``jobreg-kafka`` otherwise, with the same option names either way.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from registry.extras import needs

with needs("spark", "the Spark audit job (consumers.spark)"):
    from pyspark.sql import DataFrame, SparkSession

from registry.errors import ConfigError
from registry.kafka_config import Kafka, java_client_options

from .kafka_source import SOURCE_NAME, KafkaOptionError, KafkaSource

__all__ = [
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


class KafkaConnectorMissing(RuntimeError):
    """``source="kafka"`` was asked for, but Spark's Kafka connector is not on the classpath."""


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
    if os.environ.get("JOBREG_SPARK_PACKAGES"):  # e.g. the Kafka connector, in production
        defaults["spark.jars.packages"] = os.environ["JOBREG_SPARK_PACKAGES"]
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
                  extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """A Spark session for the audit jobs, with ``jobreg-kafka`` registered.

    The master: ``$JOBREG_SPARK_MASTER``, else ``master``, else what the launch says
    (``spark-submit --master``, ``PYSPARK_SUBMIT_ARGS``, spark-defaults.conf's
    ``spark.master``; spark-submit's own fallback ``local[*]`` does not count), else
    ``local[2]``. Every setting comes from the standard places first (spark-defaults.conf
    in ``$SPARK_CONF_DIR``, ``--conf`` in ``PYSPARK_SUBMIT_ARGS`` or on spark-submit,
    ``SPARK_*`` environment), then :func:`session_conf`'s defaults where those are silent,
    then ``extra_conf``. For a local master (only) the driver defaults to loopback:
    ``SPARK_LOCAL_IP`` to 127.0.0.1 and ``PYSPARK_PYTHON`` to this interpreter unless set.
    ``$JOBREG_SPARK_PACKAGES`` sets ``spark.jars.packages`` (production puts Spark's Kafka
    connector there). The driver's JVM, when this process starts it, logs errors only
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
    with _jvm_stderr_filtered():
        SparkContext._ensure_initialized()  # the JVM, with spark-defaults.conf and --conf read
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
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KafkaSource)
    return spark


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
