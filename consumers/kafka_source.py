"""A PySpark data source that reads one Kafka topic through confluent-kafka: ``jobreg-kafka``.

Spark's own ``kafka`` source needs the ``spark-sql-kafka-0-10`` connector on the JVM
classpath; where it is missing (the pyspark wheel does not ship it) this Python data source
(``pyspark.sql.datasource``, Spark >= 4.2) reads the same topic with the **same option names
and the same output schema**, in streaming (``spark.readStream``) and batch (``spark.read``)
queries::

    spark.dataSource.register(KafkaSource)
    df = (spark.readStream.format("jobreg-kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "jobreg")
          .option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", 10000)
          .load())

Schema (Spark's ``KafkaRecordToRowConverter.kafkaSchema``; every field nullable)::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key string, value binary>>]

Options (semantics copied from Spark's "Structured Streaming + Kafka Integration Guide",
https://spark.apache.org/docs/latest/streaming/structured-streaming-kafka-integration.html;
option names are case-insensitive, as in Spark):

``kafka.bootstrap.servers`` (required)
    The brokers, ``host:port[,host:port...]``.
``subscribe`` (required)
    **One** topic. A comma-separated list, ``assign`` and ``subscribePattern`` are refused.
``startingOffsets``
    ``earliest`` | ``latest`` | JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 = earliest,
    -1 = latest; every partition of the topic must be listed). Only used when a query starts
    without a checkpoint. Default: ``earliest`` for both streaming and batch queries (Spark's
    streaming default is ``latest``; an audit reader wants the whole log).
``endingOffsets`` (batch only)
    ``latest`` (default) | JSON as above (-1 = latest; -2 is not allowed).
``maxOffsetsPerTrigger``
    A positive integer: at most this many offsets per micro-batch, shared among the
    partitions in proportion to their backlog (Spark's rule, but never more than the limit in
    total, and every partition with a backlog gets at least one offset while the limit is at
    least the number of such partitions). Also honoured by ``Trigger.AvailableNow``, which
    reads everything available when the query starts, in several batches.
``failOnDataLoss``
    ``true`` (default) | ``false``. ``true``: fail the query when data the query should read
    is gone: a committed offset below the partition's earliest available offset (deleted by
    retention), a partition whose log no longer holds the offsets already read (topic
    re-created, log truncated: see "End offsets that go backwards"), a partition that
    disappeared, a new partition that does not start at 0. ``false``: log a warning and skip
    ahead.
``includeHeaders``
    ``false`` (default) | ``true``: add the ``headers`` column.
``kafkaConsumer.pollTimeoutMs``
    Executors: fail a partition's read when no record and no end-of-partition arrived for
    this long (default 120000, Spark's ``spark.network.timeout``).
``fetchOffset.numRetries``, ``fetchOffset.retryIntervalMs``
    Driver: how often to retry an offset request and how long to wait in between
    (defaults 3 and 10, as Spark).
``fetchOffset.timeoutMs`` (jobreg extension)
    Driver: how long one offset request may take (default 30000). With the retries, the
    longest a query waits for an unreachable broker before it fails with
    :class:`KafkaUnavailableError`.
``probeEndOffsets`` (jobreg extension)
    ``true`` (default) | ``false``; see "End offsets" below.
``maxPartitions`` (jobreg extension)
    A positive integer: plan at most this many input partitions (Spark tasks) per batch.
    Without it (the default), as in Spark's source, each Kafka partition with records in the
    batch is one input partition. With it, when more Kafka partitions have records, they are
    grouped: each Kafka partition whole, in one group, the groups balanced by offsets, and a
    group read partition after partition in increasing id order by one consumer. Spark runs
    each input partition of a Python data source in a Python worker of its own (about 50 ms
    per input partition here, measured with 130 records each); grouping pays that once per
    task (the audit job sets it to its number of cores).
``groupIdPrefix``
    Prefix of the random, never-committed consumer group ids (default
    ``jobreg-kafka-source``); ``kafka.group.id`` sets one explicitly.
``kafka.*``
    Passed to confluent-kafka (librdkafka) with the prefix removed. librdkafka names are not
    always the Java client's (``fetch.wait.max.ms`` vs ``fetch.max.wait.ms``; no
    ``sasl.jaas.config``). Refused, as Spark refuses them: ``kafka.auto.offset.reset``,
    ``kafka.enable.auto.commit``, ``kafka.key.deserializer``, ``kafka.value.deserializer``;
    also ``kafka.enable.partition.eof`` (the reader needs it). ``kafka.isolation.level``
    defaults to ``read_committed`` (Spark's default is ``read_uncommitted``).

Offsets: what Spark stores in the checkpoint is Spark's own Kafka offset JSON,
``{"topic": {"0": 42, "1": 17}}``, each the next offset to read.

End offsets. The latest offset of a partition is what the broker's ListOffsets says
(``Consumer.get_watermark_offsets(cached=False)``), which under ``isolation.level=
read_committed`` is the last stable offset on Apache Kafka (librdkafka sends the consumer's
isolation level in the request), so an open transaction is never read past. With
``probeEndOffsets`` the driver also fetches from one offset before that end, and takes the
larger of the ListOffsets answer and what the fetch showed (the last record's offset + 1,
or the end-of-partition offset, which librdkafka takes from the fetch response's last
stable offset under read_committed). On Apache Kafka this costs one small fetch per
partition per trigger and changes nothing; on brokers whose ListOffsets lags behind their
fetch responses (the embedded Tansu reports a batch's base offset + 1) it keeps the source
from lagging by a batch, and ``Trigger.AvailableNow`` from stopping short.

End offsets that go backwards. An end offset answer below an offset known to exist (the
next offset the query reads, or an end this reader reported before) is asked again
(``fetchOffset.numRetries`` times, ``fetchOffset.retryIntervalMs`` apart, as Spark's
``KafkaOffsetReader`` does for KAFKA-7703); if it stays below, one fetch of the last offset
known to exist decides: when the broker says that offset is out of range (or delivers
nothing within the time limit, as Tansu does past a partition's end), the log was truncated
or the topic re-created, and the smaller end is reported as data loss; when the record (or
a later one) arrives, the answer was a passing one and the partition has nothing new yet (its end stays where it
was). So a streaming query never plans an end below its start, and records that are really
gone are still reported: by that fetch, by the partition's earliest offset being past the
next offset to read (retention), and by an executor's read ending before the planned end.
The embedded Tansu broker answers ListOffsets with 0 for a moment, under read_committed,
while a transactional writer is active on the partition (measured: 6 times in 85 asks over
10 s with one leader writing through the client); Apache Kafka's end offsets never go back
unless the log was truncated.

Offset gaps. Transaction markers (control records), aborted records (filtered by
read_committed) and compaction leave offsets without records, so a range ``[start, end)``
can hold fewer than ``end - start`` records. Readers therefore stop at the first record at
or past ``end`` or at end-of-partition, never after counting records, and
``maxOffsetsPerTrigger`` counts offsets, as Spark's does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from registry.extras import needs

with needs("spark", "the jobreg-kafka Spark source (consumers.kafka_source)"):
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

__all__ = [
    "KAFKA_SCHEMA",
    "SOURCE_NAME",
    "KafkaDataLossError",
    "KafkaInputGroup",
    "KafkaInputPartition",
    "KafkaOptionError",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaUnavailableError",
    "SourceOptions",
    "group_ranges",
    "kafka_schema",
    "rate_limit",
    "read_partition",
]

_LOG = logging.getLogger("consumers.kafka_source")
_LIBRDKAFKA_LOG = logging.getLogger("consumers.kafka_source.librdkafka")
_T = TypeVar("_T")

SOURCE_NAME = "jobreg-kafka"

#: Spark's Kafka schema (``KafkaRecordToRowConverter.kafkaSchema``).
KAFKA_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
])
_HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
])))

EARLIEST, LATEST = -2, -1  # Spark's sentinels in offset JSON
_DATA_LOSS_HINT = ("Some data may have been lost because they are not available in Kafka any "
                   "more; either the data was aged out by Kafka or the topic may have been "
                   "deleted before all the data in the topic was processed. If you want your "
                   "streaming query to skip ahead in such cases, set the source option "
                   "'failOnDataLoss' to 'false'.")

# Spark's names of options that jobreg-kafka does not implement: refused, not ignored.
_UNSUPPORTED = {
    "assign": "use 'subscribe' with one topic",
    "subscribepattern": "use 'subscribe' with one topic",
    "minoffsetspertrigger": "not implemented",
    "maxtriggerdelay": "not implemented",
    "startingtimestamp": "not implemented",
    "startingoffsetsbytimestamp": "not implemented",
    "startingoffsetsbytimestampstrategy": "not implemented",
    "endingtimestamp": "not implemented",
    "endingoffsetsbytimestamp": "not implemented",
    "minpartitions": "not implemented: one Spark partition per Kafka partition",
    "maxrecordsperpartition": "not implemented: one Spark partition per Kafka partition",
}
# Kafka settings Spark refuses (the source manages them), plus one librdkafka-only one.
_FORBIDDEN_KAFKA = {
    "auto.offset.reset": "use 'startingOffsets'",
    "enable.auto.commit": "the source never commits offsets to Kafka",
    "key.deserializer": "keys are always bytes",
    "value.deserializer": "values are always bytes",
    "enable.partition.eof": "the reader relies on end-of-partition events",
}
_KNOWN = {
    "subscribe", "startingoffsets", "endingoffsets", "maxoffsetspertrigger", "failondataloss",
    "includeheaders", "kafkaconsumer.polltimeoutms", "fetchoffset.numretries",
    "fetchoffset.retryintervalms", "fetchoffset.timeoutms", "probeendoffsets", "groupidprefix",
    "maxpartitions", "path",
}


class KafkaSourceError(Exception):
    """Base class of the errors this source raises."""


class KafkaOptionError(KafkaSourceError, ValueError):
    """An option is missing, malformed or not supported."""


class KafkaUnavailableError(KafkaSourceError):
    """No broker answered within the configured time."""


class KafkaDataLossError(KafkaSourceError):
    """Data the query should read is gone (and ``failOnDataLoss`` is true)."""


def kafka_schema(include_headers: bool = False) -> StructType:
    """The output schema: Spark's Kafka schema, with ``headers`` if asked for."""
    if not include_headers:
        return KAFKA_SCHEMA
    return StructType([*KAFKA_SCHEMA.fields, _HEADERS_FIELD])


# -- options -----------------------------------------------------------------------------


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise KafkaOptionError(f"option '{name}' must be 'true' or 'false', not {raw!r}")
    return text == "true"


@overload
def _int(options: Mapping[str, str], name: str, default: int, minimum: int) -> int: ...
@overload
def _int(options: Mapping[str, str], name: str, default: None, minimum: int) -> int | None: ...
def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise KafkaOptionError(f"option '{name}' must be an integer, not {raw!r}") from None
    if value < minimum:
        raise KafkaOptionError(f"option '{name}' must be >= {minimum}, not {value}")
    return value


def _offsets_spec(raw: str | None, name: str, topic: str, default: str,
                  words: tuple[str, ...]) -> str | dict[int, int]:
    """``earliest``/``latest`` or Spark's offset JSON, parsed to ``{partition: offset}``."""
    text = (raw if raw is not None else default).strip()
    if text.lower() in words:
        return text.lower()
    if not text.startswith("{"):
        allowed = " or ".join(f"'{w}'" for w in words)
        raise KafkaOptionError(f"option '{name}' must be {allowed} or a JSON object like "
                               f'{{"{topic}": {{"0": 23, "1": -2}}}}, not {raw!r}')
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise KafkaOptionError(f"option '{name}' is not valid JSON ({e}): {raw!r}") from None
    if not isinstance(parsed, dict) or set(parsed) != {topic} or \
            not isinstance(parsed[topic], dict):
        raise KafkaOptionError(f"option '{name}' must name exactly the subscribed topic "
                               f"{topic!r}, as {{\"{topic}\": {{\"0\": 23}}}}; got {raw!r}")
    out: dict[int, int] = {}
    for key, value in parsed[topic].items():
        try:
            partition = int(key)
        except ValueError:
            raise KafkaOptionError(f"option '{name}': partition {key!r} is not an "
                                   "integer") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise KafkaOptionError(f"option '{name}': offset {value!r} of partition {key} must "
                                   "be an integer >= 0, or -2 (earliest) or -1 (latest)")
        out[partition] = value
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class SourceOptions:
    """The validated options of one ``jobreg-kafka`` read (see the module docstring)."""

    bootstrap: str
    topic: str
    starting: str | dict[int, int] = "earliest"
    ending: str | dict[int, int] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    fetch_timeout_ms: int = 30_000
    fetch_retries: int = 3
    fetch_retry_interval_ms: int = 10
    probe_end_offsets: bool = True
    max_partitions: int | None = None
    group_id_prefix: str = "jobreg-kafka-source"
    kafka: dict[str, str] = field(default_factory=dict)
    ending_given: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate Spark-style ``options`` (keys case-insensitive); raise KafkaOptionError."""
        opts = {str(k).lower(): v for k, v in options.items()}
        for key in opts:
            if key in _UNSUPPORTED:
                raise KafkaOptionError(f"option '{key}' is not supported by {SOURCE_NAME} "
                                       f"({_UNSUPPORTED[key]})")
            if not key.startswith("kafka.") and key not in _KNOWN:
                raise KafkaOptionError(f"unknown option '{key}' for {SOURCE_NAME}; Kafka "
                                       "client settings take the prefix 'kafka.'")
        bootstrap = str(opts.get("kafka.bootstrap.servers") or "").strip()
        if not bootstrap:
            raise KafkaOptionError("option 'kafka.bootstrap.servers' is required "
                                   "(host:port[,host:port...])")
        topic = str(opts.get("subscribe") or "").strip()
        if not topic:
            raise KafkaOptionError("option 'subscribe' is required (one topic name)")
        if "," in topic:
            raise KafkaOptionError(f"option 'subscribe' must name one topic, not {topic!r}: "
                                   f"{SOURCE_NAME} reads a single topic (use one query per "
                                   "topic, or Spark's kafka source)")
        kafka: dict[str, str] = {}
        for key, value in opts.items():
            if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
                continue
            name = key[len("kafka."):]
            if name in _FORBIDDEN_KAFKA:
                raise KafkaOptionError(f"option '{key}' is not supported "
                                       f"({_FORBIDDEN_KAFKA[name]})")
            kafka[name] = str(value)
        return cls(
            bootstrap=bootstrap,
            topic=topic,
            starting=_offsets_spec(opts.get("startingoffsets"), "startingOffsets", topic,
                                   "earliest", ("earliest", "latest")),
            ending=_offsets_spec(opts.get("endingoffsets"), "endingOffsets", topic,
                                 "latest", ("earliest", "latest")),
            ending_given="endingoffsets" in opts,
            max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, 1),
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            include_headers=_bool(opts, "includeHeaders", False),
            poll_timeout_ms=_int(opts, "kafkaConsumer.pollTimeoutMs", 120_000, 1),
            fetch_timeout_ms=_int(opts, "fetchOffset.timeoutMs", 30_000, 1),
            fetch_retries=_int(opts, "fetchOffset.numRetries", 3, 0),
            fetch_retry_interval_ms=_int(opts, "fetchOffset.retryIntervalMs", 10, 0),
            probe_end_offsets=_bool(opts, "probeEndOffsets", True),
            max_partitions=_int(opts, "maxPartitions", None, 1),
            group_id_prefix=str(opts.get("groupidprefix") or "jobreg-kafka-source"),
            kafka=kafka,
        )

    def check_streaming(self) -> None:
        """Refuse what only a batch query may set (Spark refuses ``endingOffsets`` too)."""
        if self.ending_given:
            raise KafkaOptionError("option 'endingOffsets' is only for batch queries "
                                   "(spark.read), not for streaming ones")

    def check_batch(self) -> None:
        """Refuse what a batch query cannot mean (Spark's rules)."""
        if self.starting == "latest":
            raise KafkaOptionError("option 'startingOffsets' cannot be 'latest' for a batch "
                                   "query")
        if isinstance(self.starting, dict) and LATEST in self.starting.values():
            raise KafkaOptionError("option 'startingOffsets' cannot use -1 (latest) for a "
                                   "batch query")
        if self.ending == "earliest":
            raise KafkaOptionError("option 'endingOffsets' cannot be 'earliest' for a batch "
                                   "query")
        if isinstance(self.ending, dict) and EARLIEST in self.ending.values():
            raise KafkaOptionError("option 'endingOffsets' cannot use -2 (earliest) for a "
                                   "batch query")
        if self.max_offsets_per_trigger is not None:
            _LOG.warning("option 'maxOffsetsPerTrigger' is ignored by batch queries")

    def consumer_config(self, purpose: str) -> dict[str, Any]:
        """The confluent-kafka consumer settings: ours, then the ``kafka.*`` options."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            # librdkafka requires a group id; it is never joined (assign only) nor committed.
            "group.id": f"{self.group_id_prefix}-{uuid.uuid4()}",
            "client.id": f"{SOURCE_NAME}-{purpose}",
            "isolation.level": "read_committed",
            # Short fetch waits: a fetch at the end of a partition returns only when the wait
            # expires, and both the driver's end probe and a read ending in control records
            # wait for that (end-of-partition) answer.
            "fetch.wait.max.ms": 10,
            "fetch.error.backoff.ms": 50,
            "socket.nagle.disable": True,
            "reconnect.backoff.max.ms": 1000,
            "log.connection.close": False,
            # The driver's end probe and a range read need little read-ahead.
            "queued.max.messages.kbytes": 8192,
            **self.kafka,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # An offset that is out of range is reported, never silently reset (failOnDataLoss).
            "auto.offset.reset": "error",
        }
        return conf


def _consumer(opts: SourceOptions, purpose: str) -> Consumer:
    try:
        return Consumer({**opts.consumer_config(purpose), "logger": _LIBRDKAFKA_LOG})
    except KafkaException as e:
        raise KafkaOptionError(f"invalid Kafka client setting among the 'kafka.*' options: "
                               f"{e.args[0].str() if e.args else e}") from e


def _offset_json(topic: str, offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """Spark's Kafka offset JSON, partitions in numeric order (so equal offsets compare
    equal as JSON text, which is how Spark compares them)."""
    return {topic: {str(p): int(offsets[p]) for p in sorted(offsets)}}


def _parse_offset_json(topic: str, offset: Mapping[str, Any] | None) -> dict[int, int]:
    if not offset:
        return {}
    if topic not in offset:
        raise KafkaSourceError(f"the checkpointed offset {json.dumps(offset)} is not for topic "
                               f"{topic!r}; a checkpoint belongs to one topic")
    return {int(p): int(o) for p, o in offset[topic].items()}


# -- admission control -------------------------------------------------------------------


def rate_limit(limit: int, begins: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
    """Cap ``ends`` so that at most ``limit`` offsets lie between ``begins`` and them.

    Spark's ``KafkaMicroBatchStream.rateLimit`` shares the limit among partitions in
    proportion to their backlog and rounds a share below one up, so a batch may exceed the
    limit. Here the shares are proportional with the largest remainders rounded up, so they
    add up to exactly ``limit``; a partition whose share rounds to nothing gets one offset
    from the largest share (while ``limit`` is at least the number of partitions with a
    backlog; otherwise the ``limit`` largest backlogs get one each). Partitions without a
    backlog (or whose end moved backwards) keep their end.
    """
    sizes = {p: ends[p] - begins[p] for p in ends if p in begins and ends[p] > begins[p]}
    total = sum(sizes.values())
    if total <= limit:
        return dict(ends)
    if limit < len(sizes):
        shares = dict.fromkeys(sorted(sizes, key=lambda p: (-sizes[p], p))[:limit], 1)
    else:
        shares = {p: limit * size // total for p, size in sizes.items()}
        left = limit - sum(shares.values())
        for p in sorted(sizes, key=lambda p: (-(limit * sizes[p] % total), p))[:left]:
            shares[p] += 1
        for p in sorted(sizes):
            if shares[p] == 0:  # never starve a partition; the donor keeps at least one
                donor = max(shares, key=lambda q: (shares[q], -q))
                shares[donor] -= 1
                shares[p] = 1
    return {p: (begins[p] + shares.get(p, 0)) if p in sizes else ends[p] for p in ends}


# -- the driver's view of the topic -------------------------------------------------------


class _TopicOffsets:
    """Partitions and offsets of the topic, asked on the driver; retried and time-bounded."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts
        self._consumer: Consumer | None = None
        # Per partition: the highest end this reader has reported, and the earliest offset
        # of the last watermarks asked ("End offsets that go backwards", module docstring).
        self.highest: dict[int, int] = {}
        self.lows: dict[int, int] = {}

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = _consumer(self._opts, "driver")
        return self._consumer

    def _retrying(self, what: str, fn: Callable[[float], _T]) -> _T:
        opts = self._opts
        attempts = opts.fetch_retries + 1
        last: KafkaError | str | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(opts.fetch_retry_interval_ms / 1000)
            try:
                return fn(opts.fetch_timeout_ms / 1000)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if isinstance(err, KafkaError) and err.fatal():
                    raise KafkaSourceError(f"{what} failed: {err.str()}") from e
                last = err.str() if isinstance(err, KafkaError) else str(e)
                _LOG.debug("%s failed (attempt %d of %d): %s", what, attempt + 1, attempts, last)
        raise KafkaUnavailableError(
            f"no Kafka broker at {opts.bootstrap} answered while {what} "
            f"({attempts} attempt(s) of {opts.fetch_timeout_ms} ms; options "
            f"fetchOffset.timeoutMs, fetchOffset.numRetries): {last}")

    def partitions(self) -> list[int]:
        """The topic's partition ids (empty while the topic does not exist)."""
        topic = self._opts.topic

        def ask(timeout: float) -> list[int]:
            meta = self._client().list_topics(topic, timeout=timeout)
            found = meta.topics.get(topic)
            if found is None:
                return []
            if found.error is not None:
                if found.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                          KafkaError._UNKNOWN_TOPIC):
                    return []
                raise KafkaSourceError(f"cannot read the metadata of topic {topic!r} at "
                                       f"{self._opts.bootstrap}: {found.error.str()}")
            ids: list[int] = sorted(found.partitions)
            return ids

        parts = self._retrying(f"listing the partitions of topic {topic!r}", ask)
        if not parts:
            _LOG.warning("topic %r does not exist (yet) at %s", topic, self._opts.bootstrap)
        return parts

    def watermarks(self, partitions: list[int]) -> dict[int, tuple[int, int]]:
        """``{partition: (earliest offset, latest offset)}`` by ListOffsets; the latest is the
        last stable offset under read_committed on Apache Kafka."""
        topic = self._opts.topic

        def ask(timeout: float) -> dict[int, tuple[int, int]]:
            client = self._client()
            return {p: client.get_watermark_offsets(TopicPartition(topic, p),
                                                    timeout=timeout, cached=False)
                    for p in partitions}

        marks = self._retrying(f"fetching the offsets of topic {topic!r}", ask)
        self.lows.update({p: low for p, (low, _high) in marks.items()})
        return marks

    def _probe(self, marks: dict[int, tuple[int, int]]) -> dict[int, int]:
        """Ends seen by fetching from one offset before each ListOffsets end (module docstring,
        "End offsets").

        A partition's probe ends at its end-of-partition event only: records arrive in
        several deliveries even from one broker response, so having seen some says nothing
        about having seen the last. Best effort and time-bounded (at most 2 s or
        ``fetchOffset.timeoutMs``, and 0.25 s once every partition has delivered a record at
        or past its reported end): a partition that keeps receiving new records (never
        reaching its end) or does not answer keeps the larger of its ListOffsets end and
        the records seen.
        """
        topic = self._opts.topic
        ends = {p: high for p, (_low, high) in marks.items()}
        todo = {p: max(high - 1, low, 0) for p, (low, high) in marks.items() if high > low}
        if not todo:
            return ends
        client = self._client()
        client.assign([TopicPartition(topic, p, o) for p, o in todo.items()])
        deadline = time.monotonic() + min(self._opts.fetch_timeout_ms / 1000, 2.0)
        pending = set(todo)
        reached: set[int] = set()  # partitions that delivered the record before their end
        try:
            while pending and time.monotonic() < deadline:
                msgs = client.consume(1000, 0) or [m for m in [client.poll(0.05)] if m]
                for m in msgs:
                    # The binding gives None for an invalid (negative) offset or partition.
                    p, at = m.partition(), m.offset()
                    err = m.error()
                    if p is None or p not in pending:
                        continue
                    if err is None:
                        assert at is not None  # a record has its offset
                        ends[p] = max(ends[p], at + 1)
                        if p not in reached and at >= todo[p]:
                            reached.add(p)
                            if pending <= reached:
                                # Every partition is past its reported end. A partition that
                                # is being written to may not show an end-of-partition for a
                                # long time; what was seen exists, and anything later is the
                                # next trigger's: allow a short wait, not the whole limit.
                                deadline = min(deadline, time.monotonic() + _PROBE_GRACE_S)
                        continue
                    if err.code() == KafkaError._PARTITION_EOF:
                        if at is not None:
                            ends[p] = max(ends[p], at)
                    elif err.code() not in (KafkaError._AUTO_OFFSET_RESET,
                                            KafkaError.OFFSET_OUT_OF_RANGE):
                        continue  # transient; the deadline bounds it
                    # end-of-partition, or the offset was deleted meanwhile: done with p
                    pending.discard(p)
            if pending:
                _LOG.info("end probe of %s partitions %s did not reach their end within the "
                          "time limit", topic, sorted(pending))
        finally:
            client.unassign()
        return ends

    def _answer(self, parts: list[int]) -> dict[int, int]:
        """One answer of the broker: ListOffsets, and the end probe if it is on."""
        marks = self.watermarks(parts)
        if not self._opts.probe_end_offsets:
            return {p: high for p, (_low, high) in marks.items()}
        try:
            return self._probe(marks)
        except KafkaException as e:
            _LOG.warning("end probe of %s failed (%s); using ListOffsets", self._opts.topic, e)
            return {p: high for p, (_low, high) in marks.items()}

    def ends(self, partitions: list[int] | None = None,
             known: Mapping[int, int] | None = None) -> dict[int, int]:
        """The latest offset of every partition (see the module docstring, "End offsets"),
        never below an offset known to exist: ``known`` (the next offsets the query reads)
        or an end reported before ("End offsets that go backwards")."""
        parts = self.partitions() if partitions is None else partitions
        floor = {p: max(self.highest.get(p, 0), (known or {}).get(p, 0)) for p in parts}
        answer: dict[int, int] = {}
        for attempt in range(self._opts.fetch_retries + 1):
            if attempt:  # Spark's KafkaOffsetReader retries a smaller answer too (KAFKA-7703)
                time.sleep(self._opts.fetch_retry_interval_ms / 1000)
            answer = self._answer(parts)
            if all(answer.get(p, 0) >= floor[p] for p in parts):
                break
        out = {p: max(answer.get(p, 0), floor[p]) for p in parts}
        for p in parts:
            if answer.get(p, 0) < floor[p]:
                if self.holds(p, floor[p] - 1):
                    _LOG.info("%s[%d]: the end went back from %d to %d while the log holds "
                              "offset %d: taken as nothing new yet", self._opts.topic, p,
                              floor[p], answer.get(p, 0), floor[p] - 1)
                else:  # truncated, or re-created: the caller reports the loss
                    out[p] = answer.get(p, 0)
        self.highest.update(out)
        return out

    def holds(self, partition: int, offset: int) -> bool:
        """Whether the log still holds ``offset`` of ``partition``, by fetching it: True on
        a record at or past it, or an end past it; False when the broker says it is out of
        range (Apache Kafka: the log was truncated or the topic re-created) or delivers
        nothing within ``fetchOffset.timeoutMs`` (at most 2 s; the embedded broker answers
        a fetch past the end with nothing at all)."""
        client = self._client()
        client.assign([TopicPartition(self._opts.topic, partition, offset)])
        deadline = time.monotonic() + min(self._opts.fetch_timeout_ms / 1000, 2.0)
        try:
            while time.monotonic() < deadline:
                for m in client.consume(100, 0.05):
                    if m.partition() != partition:
                        continue
                    err, at = m.error(), m.offset()  # at: None for an invalid offset
                    if err is None:
                        if at is not None and at >= offset:
                            return True
                    elif err.code() == KafkaError._PARTITION_EOF:
                        if at is not None and at > offset:
                            return True
                    elif err.code() in (KafkaError._AUTO_OFFSET_RESET,
                                        KafkaError.OFFSET_OUT_OF_RANGE):
                        return False
            return False
        finally:
            client.unassign()

    def earliest(self, partitions: list[int]) -> dict[int, int]:
        """The earliest available offset of each partition."""
        return {p: low for p, (low, _high) in self.watermarks(partitions).items()}

    def resolve(self, spec: str | dict[int, int], option: str) -> dict[int, int]:
        """``earliest``/``latest``/``{partition: offset or -2/-1}`` -> concrete offsets."""
        parts = self.partitions()
        if spec == "earliest":
            return self.earliest(parts)
        if spec == "latest":
            return self.ends(parts)
        assert isinstance(spec, dict)
        if set(spec) != set(parts):
            raise KafkaOptionError(
                f"option '{option}' must list every partition of topic {self._opts.topic!r} "
                f"(it has {parts}, the option names {sorted(spec)}); use -2 for earliest and "
                "-1 for latest")
        out = dict(spec)
        if EARLIEST in out.values():
            out.update({p: o for p, o in self.earliest(parts).items() if spec[p] == EARLIEST})
        if LATEST in out.values():
            out.update({p: o for p, o in self.ends(parts).items() if spec[p] == LATEST})
        return dict(sorted(out.items()))


def _report_data_loss(opts: SourceOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise KafkaDataLossError(f"{message}. {_DATA_LOSS_HINT}")
    _LOG.warning("%s. Skipping ahead (failOnDataLoss=false).", message)


# -- partitions and reading ----------------------------------------------------------------


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark task: the records of ``topic[partition]`` at offsets ``[start, end)``."""

    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class KafkaInputGroup(InputPartition):
    """One Spark task reading several Kafka partitions' ranges, one after the other in this
    order, each whole (option ``maxPartitions``)."""

    ranges: tuple[KafkaInputPartition, ...]


def group_ranges(ranges: list[KafkaInputPartition], most: int | None
                 ) -> list[KafkaInputPartition | KafkaInputGroup]:
    """``ranges`` as at most ``most`` input partitions: unchanged when they are that few (or
    ``most`` is None); else grouped, largest range first into the group with the fewest
    offsets so far, each group in increasing partition order."""
    if most is None or len(ranges) <= most:
        return list(ranges)
    groups: list[list[KafkaInputPartition]] = [[] for _ in range(most)]
    sizes = [0] * most
    for r in sorted(ranges, key=lambda r: (r.start - r.end, r.partition)):
        i = min(range(most), key=lambda i: (sizes[i], i))
        groups[i].append(r)
        sizes[i] += r.end - r.start
    return [KafkaInputGroup(tuple(sorted(g, key=lambda r: r.partition))) for g in groups if g]


def _plan(opts: SourceOptions, begins: Mapping[int, int], ends: Mapping[int, int]
          ) -> list[KafkaInputPartition | KafkaInputGroup]:
    out = []
    for p in sorted(ends):
        b, e = begins[p], ends[p]
        if e < b:
            _report_data_loss(opts, f"partition {opts.topic}[{p}]'s offset was changed from "
                                    f"{b} to {e}")
        elif e > b:
            out.append(KafkaInputPartition(opts.topic, p, b, e))
    return group_ranges(out, opts.max_partitions)


_PROBE_GRACE_S = 0.1  # how long the end probe waits for end-of-partition after the end was seen
_TS_TYPES = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}  # Kafka's TimestampType ids
_ARROW_ROWS = 8192


def read_partition(opts: SourceOptions, schema: StructType, part: InputPartition
                   ) -> Iterator[Any]:
    """Yield the records of ``part`` (a :class:`KafkaInputPartition`, or a
    :class:`KafkaInputGroup` of them) as pyarrow record batches in ``schema``'s layout.

    Reads each range ``[start, end)`` in turn with one fresh consumer (assign, no group, no
    commits) and stops at the first record at or past ``end`` or at end-of-partition (offsets
    without records: transaction markers, aborted or compacted records). Raises
    :class:`KafkaUnavailableError` when nothing arrives for ``kafkaConsumer.pollTimeoutMs``
    and :class:`KafkaDataLossError` when a range is gone (unless ``failOnDataLoss`` is
    false: then what is left of it is read).
    """
    if isinstance(part, KafkaInputGroup):
        ranges = [r for r in part.ranges if r.start < r.end]
    elif isinstance(part, KafkaInputPartition) and part.start < part.end:
        ranges = [part]
    else:
        return
    if not ranges:
        return
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    with_headers = "headers" in schema.fieldNames()
    columns: list[list[Any]] = [[] for _ in arrow_schema]

    def flush() -> Any:
        batch = pa.RecordBatch.from_arrays(
            [pa.array(col, type=f.type) for col, f in zip(columns, arrow_schema, strict=True)],
            schema=arrow_schema)
        for col in columns:
            col.clear()
        return batch

    consumer = _consumer(opts, "executor")
    try:
        for r in ranges:
            for row in _read_range(opts, consumer, r, with_headers):
                for col, value in zip(columns, row, strict=True):
                    col.append(value)
                if len(columns[0]) >= _ARROW_ROWS:
                    yield flush()
        if columns[0]:
            yield flush()
    finally:
        consumer.close()


def _read_range(opts: SourceOptions, consumer: Consumer, part: KafkaInputPartition,
                with_headers: bool) -> Iterator[list[Any]]:
    """The rows of ``part``, read by ``consumer`` (assigned to it here; a consumer that read
    another range before ignores what it still delivers of that range's partition)."""
    topic, partition, end = part.topic, part.partition, part.end
    timeout = opts.poll_timeout_ms / 1000
    where = f"{topic}[{partition}]"
    consumer.assign([TopicPartition(topic, partition, part.start)])
    position = part.start
    progress = time.monotonic()
    last_error: str | None = None
    while True:
        msgs = consumer.consume(1000, 0)
        if not msgs:
            if time.monotonic() - progress > timeout:
                raise KafkaUnavailableError(
                    f"reading {where} offsets {position}..{end} from {opts.bootstrap}: "
                    f"nothing arrived for {opts.poll_timeout_ms} ms (option "
                    f"kafkaConsumer.pollTimeoutMs); last error: {last_error or 'none'}")
            m = consumer.poll(0.1)
            msgs = [m] if m is not None else []
        for m in msgs:
            of = m.partition()
            if of is not None and of >= 0 and (of != partition or m.topic() != topic):
                continue  # left over from the range this consumer read before
            err = m.error()
            if err is not None:
                code = err.code()
                if code == KafkaError._PARTITION_EOF:
                    eof = m.offset()  # None: the binding's word for an invalid offset
                    if eof is not None and eof < end:
                        _report_data_loss(opts, f"{where} ends at offset {eof}, before "
                                                f"the planned end {end}")
                    return
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    low, high = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout, cached=False)
                    _report_data_loss(opts, f"cannot fetch offset {position} of {where}: "
                                            f"the partition now holds offsets "
                                            f"{low}..{high}")
                    if low >= end or position >= high:
                        return
                    position = max(position, low)
                    consumer.assign([TopicPartition(topic, partition, position)])
                    progress = time.monotonic()
                    break
                if err.fatal():
                    raise KafkaSourceError(f"reading {where} failed: {err.str()}")
                last_error = err.str()
                continue
            offset = m.offset()
            assert offset is not None  # a record has its offset
            if offset >= end:
                return
            if offset < position:
                continue
            position = offset + 1
            progress = time.monotonic()
            ts_type, ts = m.timestamp()
            row: list[Any] = [m.key(), m.value(), topic, partition, offset,
                   ts * 1000 if ts_type in _TS_TYPES else None, _TS_TYPES.get(ts_type, -1)]
            if with_headers:
                headers = m.headers()
                pairs = headers.items() if isinstance(headers, dict) else headers
                row.append([{"key": k, "value": v} for k, v in pairs] if pairs else None)
            yield row
            if position >= end:
                return


# -- readers ------------------------------------------------------------------------------


class _ReaderBase:
    """What both readers share: options, schema, a lazily made driver-side client that is
    never pickled (Spark ships the reader to executors for ``read``)."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self._opts = opts
        self._schema = schema
        self._offsets: _TopicOffsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_opts": self._opts, "_schema": self._schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_opts"], state["_schema"])  # type: ignore[misc]

    @property
    def _topic(self) -> _TopicOffsets:
        if self._offsets is None:
            self._offsets = _TopicOffsets(self._opts)
        return self._offsets

    def _close(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None


class KafkaStreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader: offsets are Spark's Kafka offset JSON (next offset per partition).

    Spark keeps one instance per query on the driver for ``initialOffset``,
    ``latestOffset``, ``partitions`` and ``commit``; ``read`` runs on executors.
    """

    def __init__(self, opts: SourceOptions, schema: StructType,
                 problem: KafkaOptionError | None = None) -> None:
        super().__init__(opts, schema)
        self._problem = problem
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's end
        self._latest: dict[int, int] | None = None  # for reportLatestOffset

    def _check(self) -> None:
        # Raised here rather than in streamReader(): pyspark 4.3's streaming source runner
        # hides an exception from streamReader() behind an UnboundLocalError of its own.
        if self._problem is not None:
            raise self._problem

    def initialOffset(self) -> dict[str, Any]:
        """Where a query without a checkpoint starts (``startingOffsets``)."""
        self._check()
        return _offset_json(self._opts.topic,
                            self._topic.resolve(self._opts.starting, "startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as ``ReadMaxRows`` (offsets, like Spark's), else all."""
        n = self._opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end for ``Trigger.AvailableNow``: what is available now."""
        self._check()
        starting = self._opts.starting
        known = {p: o for p, o in starting.items() if o >= 0} \
            if isinstance(starting, dict) else None
        self._target = self._topic.ends(known=known)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next batch: the latest offsets (or AvailableNow's target), capped
        by ``limit``; partitions that are new since ``start`` begin at their earliest."""
        self._check()
        begins = _parse_offset_json(self._opts.topic, start)
        latest = dict(self._target) if self._target is not None else \
            self._topic.ends(known=begins)
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            new = [p for p in latest if p not in begins]
            froms = {**begins, **(self._topic.earliest(new) if new else {})}
            latest = rate_limit(limit.max_rows, froms, latest)
        return _offset_json(self._opts.topic, latest)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The latest offsets seen by the last ``latestOffset`` (before the read limit)."""
        return None if self._latest is None else _offset_json(self._opts.topic, self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> list[KafkaInputPartition | KafkaInputGroup]:
        """One input partition per Kafka partition with offsets in ``[start, end)``, or at
        most ``maxPartitions`` groups of them."""
        self._check()
        topic = self._opts.topic
        begins = _parse_offset_json(topic, start)
        ends = _parse_offset_json(topic, end)
        gone = sorted(set(begins) - set(ends))
        if gone:
            _report_data_loss(self._opts, f"partitions {gone} of {topic} are gone")
        new = sorted(set(ends) - set(begins))
        if new:
            earliest = self._topic.earliest(new)
            for p in new:
                if earliest[p] != 0:
                    _report_data_loss(self._opts, f"added partition {topic}[{p}] starts from "
                                                  f"{earliest[p]} instead of 0")
            begins = {**begins, **earliest}
        lows = self._topic.lows
        for p in sorted(set(begins) & set(ends)):
            low = lows.get(p, 0)
            if begins[p] < low:  # the log start moved past what we need: deleted records
                _report_data_loss(self._opts, f"partition {topic}[{p}]'s earliest offset is "
                                              f"{low}, past the next offset to read, "
                                              f"{begins[p]}")
                begins[p] = low
        return _plan(self._opts, begins, ends)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The records of one input partition (runs on an executor)."""
        return read_partition(self._opts, self._schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        """Close the driver-side client."""
        self._close()


class KafkaBatchReader(_ReaderBase, DataSourceReader):
    """The batch reader: ``[startingOffsets, endingOffsets)`` of every partition."""

    def partitions(self) -> list[KafkaInputPartition | KafkaInputGroup]:
        """Resolve the offsets now (on the driver) and plan one task per partition (or at most
        ``maxPartitions`` groups of them)."""
        try:
            begins = self._topic.resolve(self._opts.starting, "startingOffsets")
            ends = self._topic.resolve(self._opts.ending, "endingOffsets")
        finally:
            self._close()
        out = []
        for p in sorted(ends):
            b, e = begins[p], ends[p]
            if e < b:
                raise KafkaOptionError(f"the starting offset {b} of {self._opts.topic}[{p}] is "
                                       f"after its ending offset {e}")
            if e > b:
                out.append(KafkaInputPartition(self._opts.topic, p, b, e))
        return group_ranges(out, self._opts.max_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The records of one input partition (runs on an executor)."""
        return read_partition(self._opts, self._schema, partition)


class KafkaSource(DataSource):
    """``jobreg-kafka``: one Kafka topic, read through confluent-kafka (module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._opts = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        """The short name: ``spark.readStream.format("jobreg-kafka")``."""
        return SOURCE_NAME

    def schema(self) -> StructType:
        """Spark's Kafka schema (plus ``headers`` with ``includeHeaders``)."""
        return kafka_schema(self._opts.include_headers)

    def _check_schema(self, schema: StructType) -> None:
        if schema != self.schema():
            raise KafkaOptionError(f"{SOURCE_NAME} has a fixed schema and cannot be given "
                                   f"another one: {self.schema().simpleString()}")

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """The streaming reader (``spark.readStream``); a bad option fails its first call."""
        try:
            self._check_schema(schema)
            self._opts.check_streaming()
        except KafkaOptionError as e:
            return KafkaStreamReader(self._opts, schema, problem=e)
        return KafkaStreamReader(self._opts, schema)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        """The batch reader (``spark.read``)."""
        self._check_schema(schema)
        self._opts.check_batch()
        return KafkaBatchReader(self._opts, schema)
