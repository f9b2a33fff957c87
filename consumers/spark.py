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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

from registry.errors import ConfigError
from registry.kafka_config import Kafka, java_client_options

from .kafka_source import SOURCE_NAME, KafkaOptionError, KafkaSource

__all__ = [
    "KafkaConnectorMissing",
    "connector_package",
    "kafka_format_available",
    "read_stream",
    "spark_session",
]

#: Settings every session gets unless ``extra_conf`` overrides them.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
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
    # Python workers are forked from a daemon that has imported the fold and the source
    # already (consumers/spark_daemon.py), so a new worker's first task does not pay for it.
    "spark.python.daemon.module": "consumers.spark_daemon",
}


#: Lines the JVM writes to stderr that are not Spark's log and tell a jobreg user nothing:
#: Spark's launcher always adds the incubating Vector API module (``--add-modules=
#: jdk.incubator.vector``, unconditionally) and the JVM announces it before any logging starts.
JVM_NOISE = (b"WARNING: Using incubator modules: ",)


class KafkaConnectorMissing(RuntimeError):
    """``source="kafka"`` was asked for, but Spark's Kafka connector is not on the classpath."""


def spark_session(app_name: str = "jobreg-audit", master: str = "local[2]",
                  extra_conf: Mapping[str, str] | None = None) -> SparkSession:
    """A Spark session for the audit jobs, with ``jobreg-kafka`` registered.

    Sets the environment Spark needs here before the JVM starts: ``SPARK_LOCAL_IP`` to
    127.0.0.1 (unless already set), ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` to this
    interpreter (the workers must import confluent-kafka and this package). Applies
    :data:`DEFAULT_CONF` (no UI, loopback driver, two shuffle partitions, UTC session time
    zone), then ``extra_conf``; sets the log level to ERROR. ``$JOBREG_SPARK_MASTER`` overrides
    ``master`` and ``$JOBREG_SPARK_PACKAGES`` sets ``spark.jars.packages`` (production puts
    Spark's Kafka connector there). If a session is already active in
    this process, ``getOrCreate`` returns it (JVM-level settings then stay as they were).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    conf = dict(DEFAULT_CONF)
    # errors only from the JVM's log (Spark's default prints INFO and WARN lines, and a
    # log-level banner unless the gateway's logger is configured: see log4j2.properties)
    log4j = Path(__file__).with_name("log4j2.properties")
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    if os.environ.get("JOBREG_SPARK_PACKAGES"):  # e.g. the Kafka connector, in production
        conf["spark.jars.packages"] = os.environ["JOBREG_SPARK_PACKAGES"]
    builder = SparkSession.builder.appName(app_name).master(
        os.environ.get("JOBREG_SPARK_MASTER", master))
    for key, value in {**conf, **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    with _jvm_stderr_filtered():
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
