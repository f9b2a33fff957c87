"""The registry log on Kafka: topic settings, a reader that knows when it has caught up, writers.

Nothing here interprets records; that is :mod:`registry.fold`'s job. This
module only moves bytes and turns confluent-kafka errors into
:class:`~registry.errors.BrokerError`: a refused login into
:class:`~registry.errors.AuthenticationFailed`, and a refusal of the broker's authorizer (a
missing ACL) into :class:`~registry.errors.NotAuthorized`, one line naming the operation and
the resource (:func:`not_authorized`), raised at once: librdkafka alone would retry a read
it may not do until the caller's timeout, and report a refused write as any failed one.

Catching up without ListOffsets: some brokers (the embedded Tansu among them)
under-report the "latest" offset while producers batch. :meth:`LogReader.sync`
instead seeks the consumer to its own position, which makes librdkafka issue
a fresh fetch, and reads until that fetch reports end-of-partition
(``enable.partition.eof``). The fetch is issued after ``sync`` was called, so
everything committed before the call is folded when it returns.

Except right after a leader change on Kafka: a follower learns the high watermark
from its next fetch, so a new leader may start with one below the old leader's, and
its fetches end there until the other in-sync replicas have fetched from it; a
read_committed fetch then ends before records already acknowledged and read through
the old leader (the campaign on three nodes, issue 34: a read 0.1 s after a failover
missed a cancel). Kafka's ListOffsets refuses such a leader's answer
(OFFSET_NOT_AVAILABLE, KIP-207) until its high watermark has reached the start of its
term. So on a cluster of several brokers an end of partition is taken only once a
ListOffsets answer (read_committed: the last stable offset) says nothing lies past it
(a round trip more per read); one broker (the embedded one, a single Kafka node) has no
leader to change, and its ends are taken as they come.

A writer's own records need not be read back (:meth:`LogReader.take_own`): when
the reader knows the log to the very offset where the writer's records begin,
nothing can lie between, and the records the writer sent, at the offsets the
broker gave them, are exactly what a read would return. The chain goes on from
one write to the next while each begins where the last ended; any gap means
records of others, and the writer reads.

What a read would return, but not yet necessarily what every reader reads: a
read_committed reader reads only below the last stable offset, which a
transaction of another producer open before the records holds back. So the
records are taken only once a read_committed ListOffsets asked after the
acknowledgement puts the last stable offset past them (one round trip), or, where
it does not (the embedded broker answers an offset inside a producer's latest batch
of several records: 4 for one at 2 to 9), a probe fetch from the offset after them shows the end of the partition
there. (With transactions the probe asked two offsets on, past the commit marker:
on Kafka past the end before the marker was written, which waited out librdkafka's
100 ms offset reset.) If neither confirms, the writer reads its records back,
which waits for them to become readable. The reader's consumers are paused
between reads, so they fetch only when asked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic

from .errors import AuthenticationFailed, BrokerError, ConfigError, NotAuthorized
from .image import LogRecord
from .kafka_config import Kafka, login_refused, not_authorized_text, scrubbed
from .rules import DUPLICATE_WINDOW_MS

__all__ = [
    "DEFAULT_TOPIC",
    "LogReader",
    "no_broker",
    "PlainWriter",
    "TOPIC_CHECK_ENV",
    "TopicConfig",
    "topic_violations",
    "TRANSACTION_TIMEOUT_MS",
    "TopicInfo",
    "TransactionFailed",
    "TransactionNotAuthorized",
    "TransactionalWriter",
    "check_bootstrap",
    "ensure_topic",
    "kafka_error_of",
    "LeaderWriter",
    "leader_producer_settings",
    "Sending",
    "WriteFailed",
    "WriteNotAuthorized",
    "not_authorized",
    "refuse_fast",
    "topic_partitions",
    "transactional_id",
    "write_raw",
]

DEFAULT_TOPIC = "jobreg"

# Latency-sensitive defaults measured on the embedded broker: Nagle off, short
# fetch waits (the broker answers a long poll only when it expires).
_LOG = logging.getLogger("registry.kafka")
# Reconnects back off to at most 250 ms (librdkafka's default grows to 10 s), so
# a leader renews soon after a short network interruption (registry.election). The
# first back-off is 10 ms, not 100: librdkafka holds a new client's first connection to
# a broker the metadata named for half of it (measured: a new producer's start, and so
# a failover's claim, 0.145 s -> 0.054 s), on Kafka as on the embedded broker.
_CLIENT_DEFAULTS = {"socket.nagle.disable": True, "reconnect.backoff.ms": 10,
                    "reconnect.backoff.max.ms": 250, "logger": _LOG}


def _expected(record: logging.LogRecord) -> bool:
    """False for what librdkafka logs about a leader's producer that is no news: at every
    start, that enable.gapless.guarantee (set on purpose: leader_producer_settings) is
    experimental; and, as FATAL, the gap-less guarantee's refusal of the records a failed
    write purged in flight (the write purges them because it failed: it already said so, and
    retires the producer)."""
    text = record.getMessage()
    return "enable.gapless.guarantee is experimental" not in text and not (
        "gap-less guarantee" in text and "Purged in flight" in text)


_LOG.addFilter(_expected)

_DAY_MS = 24 * 60 * 60 * 1000


TOPIC_CHECK_ENV = "JOBREG_TOPIC_CHECK"
"""The environment variable that gives :attr:`TopicConfig.check` its default (``refuse``,
or ``warn`` on a test cluster): for whatever makes its own ``TopicConfig()`` (the CLI's
Flink bridge, the benchmarks)."""

TOPIC_CHECKS = ("refuse", "warn")


def _check_from_env() -> str:
    return os.environ.get(TOPIC_CHECK_ENV, "refuse").strip().lower() or "refuse"


@dataclass(frozen=True)
class TopicConfig:
    """The topic settings the guarantees rest on (README, "Compaction" and "Production
    deployment"); :func:`ensure_topic` creates a topic with them and refuses an existing one
    that breaks one of them (:func:`topic_violations`).

    * ``cleanup.policy=compact``: the log keeps the newest record per key for ever (never
      ``compact,delete`` with a retention: that deletes whole segments, grants with them).
    * ``min.compaction.lag.ms`` (7 days): no record younger than this is ever
      cleaned, so the forensics window sees every record and a leader has that
      long to reassert a key after a refused write landed on it. An existing topic must
      have at least this much; a deployment that accepts a shorter window says so here.
    * ``delete.retention.ms`` (1 day): how long a tombstone stays readable. The
      only tombstones jobreg writes are the leader's collection of checkpoint records no
      state stands on (fold rule 6), which a reader may miss without harm; a reader whose
      position is older than this must rebuild from the start.
    * ``message.timestamp.type=LogAppendTime``: the broker stamps records, so a
      writer with a skewed clock cannot make a fresh record look old to the
      cleaner's lag check, nor move fold rule 1's windows.
    * ``partitions``: the count a new topic gets. Namespaces hash onto the count;
      adding partitions later moves some, which every path refuses
      (:mod:`registry.placement`).
    * ``replication_factor``: ``None`` (the default) is min(3, the brokers the cluster
      lists) for a new topic; an existing one needs at least that many replicas.
    * ``min_insync_replicas``: ``None`` is 2 where the topic has two replicas or more (an
      ``acks=all`` write is then on two brokers before it is acknowledged), 1 on one broker,
      where nothing better exists; set on the topic itself.
    * ``check``: ``refuse`` (the default, or ``$JOBREG_TOPIC_CHECK``) raises
      :class:`ConfigError` for an existing topic that breaks a guarantee; ``warn`` logs the
      same line and goes on, for test clusters that need a degenerate topic.
    """

    partitions: int = 8
    replication_factor: int | None = None
    min_compaction_lag_ms: int = 7 * _DAY_MS
    delete_retention_ms: int = _DAY_MS
    timestamp_type: str = "LogAppendTime"
    min_insync_replicas: int | None = None
    check: str = field(default_factory=_check_from_env)

    def __post_init__(self) -> None:
        if self.check not in TOPIC_CHECKS:
            raise ConfigError(f"topic check {self.check!r} (TopicConfig.check or "
                              f"${TOPIC_CHECK_ENV}) is neither 'refuse' nor 'warn'")

    def replicas_for(self, brokers: int) -> int:
        """The replication factor a new topic gets on a cluster of ``brokers``."""
        if self.replication_factor is not None:
            return self.replication_factor
        return min(3, max(1, brokers))

    def min_insync_for(self, replicas: int) -> int:
        """The ``min.insync.replicas`` a new topic of ``replicas`` replicas gets."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return 2 if replicas >= 2 else 1

    def kafka_config(self, replicas: int | None = None) -> dict[str, str]:
        """The topic-level configuration as Kafka names it; with ``min.insync.replicas`` once
        the replication factor is known (``replicas``, or the one configured)."""
        config = {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": str(self.min_compaction_lag_ms),
            "delete.retention.ms": str(self.delete_retention_ms),
            "message.timestamp.type": self.timestamp_type,
        }
        replicas = replicas if replicas is not None else self.replication_factor
        if replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_for(replicas))
        return config


class _Closed:
    """What a jobreg reader or writer holds in place of its client once closed.

    The client object itself is dropped at once: confluent-kafka frees a client's
    thread-local key (a process has 1,024) only when the object is freed, and an owner in
    a reference cycle (a Registry and its terms, say) is freed only when the garbage
    collector gets to it. A long-lived process that opens and closes many clients (the
    fault campaign: ~1,000 in 74 runs) would otherwise run out. Using it after close
    raises ``RuntimeError``, as a closed confluent-kafka client does."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"this {self.what} is closed")


_REFUSED_PREFIX = re.compile(r"^Failed to create \w+( \w+)?: ")


def _client(kind: Any, settings: dict[str, Any]) -> Any:
    """``kind(settings)`` (a confluent-kafka client); :class:`ConfigError` when librdkafka
    refuses the settings (a SASL mechanism it does not know, a user name without a password),
    in its words, scrubbed of secret values."""
    try:
        return kind(settings)
    except KafkaException as e:
        why = _REFUSED_PREFIX.sub("", e.args[0].str())
        raise ConfigError(f"librdkafka refuses the client properties: "
                          f"{scrubbed(why, settings)}") from e


class _LastError:
    """An ``error_cb`` that keeps the last error's message, and the first refused login's
    (librdkafka reports "all brokers are down" after it, and retries the login for ever)."""

    __slots__ = ("login", "text")

    def __init__(self) -> None:
        self.text: str | None = None
        self.login: str | None = None

    def __call__(self, err: KafkaError) -> None:
        self.text = err.str()
        if err.code() == KafkaError._AUTHENTICATION and self.login is None:
            self.login = err.str()


class _Admin:
    """An admin client that remembers librdkafka's last error: a failed TLS handshake or
    SASL login says why only there (a request just times out), and the one-line error
    jobreg raises should say it too."""

    def __init__(self, bootstrap: str | Kafka) -> None:
        # The callback must not reference this object: the client holds it, so a bound
        # method would make a cycle through the client, and a client in a cycle lives (its
        # threads, sockets and thread-local key with it) until the collector gets to it.
        self._errors = _LastError()
        self.kafka = Kafka.of(bootstrap)
        self.client = _client(AdminClient, self.kafka.settings(_CLIENT_DEFAULTS, {
            "error_cb": self._errors}))

    @property
    def last_error(self) -> str | None:
        """librdkafka's last error message, if it reported one."""
        return self._errors.text

    def refused_login(self) -> AuthenticationFailed | None:
        """The error to raise if the broker refused this client's SASL login (callbacks
        are served on poll only: this polls)."""
        with contextlib.suppress(Exception):
            self.client.poll(0)
        if self._errors.login is None:
            return None
        return AuthenticationFailed(login_refused(self.kafka, self._errors.login))

    def drop(self) -> None:
        """Let the client go now (freed at once unless a caller holds it): a client whose
        login was refused retries it for as long as it lives, and an error's traceback keeps
        this object, and so the client, alive for as long as the error is kept."""
        self.client = _Closed("admin client")

    def __getattr__(self, name: str) -> Any:  # the AdminClient's own methods
        return getattr(self.client, name)


def _admin(bootstrap: str | Kafka) -> _Admin:
    return _Admin(bootstrap)


# The broker's authorizer refused the request: an ACL is missing. Each code names the kind
# of resource whose ACL it checked.
_AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
}
# An idempotent producer (grants, write_raw) gets its producer id only with IDEMPOTENT_WRITE
# on the cluster or WRITE on some topic (Kafka's InitProducerId): without WRITE on the topic
# it writes to, its first write fails with CLUSTER_AUTHORIZATION_FAILED, not the topic's code.
_IDEMPOTENT_HINT = ("the broker gives an idempotent producer its producer id only with WRITE "
                    "on a topic (or IDEMPOTENT_WRITE on the cluster)")


def kafka_error_of(error: BaseException | None) -> KafkaError | None:
    """The librdkafka error an exception carries (a ``KafkaException``'s, or its cause's:
    confluent-kafka raises a producer's fatal error from whichever call serves callbacks,
    inside a delivery callback as the cause of a ``SystemError``)."""
    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, KafkaException) and error.args \
                and isinstance(error.args[0], KafkaError):
            return error.args[0]
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def not_authorized(kafka: str | Kafka, error: KafkaError | BaseException | None,
                   operation: str, resource_type: str, resource: str,
                   hint: str = "") -> NotAuthorized | None:
    """The error to raise if ``error`` is the broker's authorizer refusing ``operation`` on
    ``resource`` (the one place jobreg words it); ``None`` for any other error.

    ``error``: a ``KafkaError``, or an exception carrying one (:func:`kafka_error_of`).
    The caller says what it asked for, since the broker's code names only the kind of
    resource: a refused Produce is WRITE on the topic, a refused Fetch READ on it."""
    err = error if isinstance(error, KafkaError) else kafka_error_of(error)
    if err is None or err.code() not in _AUTHORIZATION:
        return None
    code = err.name()
    if err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED and resource_type == "topic":
        hint = "; ".join(h for h in (hint, _IDEMPOTENT_HINT) if h)
    kafka = Kafka.of(kafka)
    return NotAuthorized(not_authorized_text(kafka, operation, resource_type, resource, code,
                                             hint),
                         operation=operation, resource_type=resource_type, resource=resource,
                         code=code)


_DESCRIBE_HINT = "READ or WRITE on it imply DESCRIBE; Kafka lists no topic a user may not describe"


def _hidden_topic(admin: _Admin, topic: str, timeout: float) -> NotAuthorized | None:
    """The error to raise when ``topic`` is missing from the cluster's listing because this
    client may not describe it (Kafka lists only the topics a principal may describe);
    ``None`` if it is missing (or the broker does not say). Asked with DescribeTopics, which
    never creates a topic (a Metadata request for one topic makes the embedded broker
    create it)."""
    from confluent_kafka import TopicCollection

    try:
        admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic]\
            .result(timeout)
    except Exception as e:  # noqa: BLE001 - missing, or a broker that cannot describe it
        return not_authorized(admin.kafka, e, "DESCRIBE", "topic", topic, _DESCRIBE_HINT)
    return None


@dataclass(frozen=True)
class TopicInfo:
    """What :func:`ensure_topic` found: the partition count and, if the broker said,
    the topic's ``delete.retention.ms``."""

    partitions: int
    delete_retention_ms: int | None


# What the topic check reads of a topic's configuration (DescribeConfigs).
_CHECKED = ("cleanup.policy", "message.timestamp.type", "min.compaction.lag.ms",
            "delete.retention.ms", "retention.ms", "retention.bytes", "min.insync.replicas",
            "unclean.leader.election.enable")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def topic_violations(bootstrap: str | Kafka, topic: str, settings: dict[str, str | None],
                     replicas: int | None, brokers: int,
                     config: TopicConfig | None = None) -> list[str]:
    """Each way the existing ``topic`` breaks a guarantee, one line each: the setting, its
    value, what jobreg needs and why, and the command that fixes it. Pure.

    ``settings``: the topic's configuration as the broker described it (a setting it did not
    report is not checked: the embedded broker reports only what the topic was created with);
    ``replicas``: the fewest replicas of any of its partitions (``None``: unknown);
    ``brokers``: how many brokers the cluster's metadata lists."""
    config = config or TopicConfig()
    kafka = Kafka.of(bootstrap)
    configs = (f"kafka-configs --bootstrap-server {kafka.bootstrap}"
               + (" --command-config CLIENT.properties" if kafka.config else "")
               + f" --alter --entity-type topics --entity-name {topic} --add-config")
    found: list[str] = []

    def say(what: str, need: str, fix: str) -> None:
        found.append(f"topic {topic!r} has {what}; jobreg needs {need}: {fix}")

    policy = settings.get("cleanup.policy")
    if policy is not None:
        kinds = {p.strip() for p in policy.split(",")}
        if "compact" not in kinds:
            say(f"cleanup.policy={policy}", "a compacted topic (README \"Compaction\")",
                f"{configs} cleanup.policy=compact")
        elif "delete" in kinds:
            kept = {k: settings.get(k) for k in ("retention.ms", "retention.bytes")}
            if any(v is None or _int(v) != -1 for v in kept.values()):
                shown = " and ".join(f"{k}={v if v is not None else 'unknown'}"
                                     for k, v in kept.items())
                say(f"cleanup.policy={policy} with {shown}",
                    "cleanup.policy=compact (deletion removes whole segments past the "
                    "retention: grants, call commits and a job's only record with them)",
                    f"{configs} cleanup.policy=compact")
    stamps = settings.get("message.timestamp.type")
    if stamps is not None and stamps != config.timestamp_type:
        # Record time must be the broker's: with CreateTime every writer's clock stamps its
        # records, and fold rule 1 and the cleaner's lag read them (README "Compaction").
        say(f"message.timestamp.type={stamps}",
            f"{config.timestamp_type} (the broker's stamps)",
            f"{configs} message.timestamp.type={config.timestamp_type}")
    lag, need = settings.get("min.compaction.lag.ms"), config.min_compaction_lag_ms
    lag_ms = _int(lag)
    if lag is not None and (lag_ms is None or lag_ms < need):
        say(f"min.compaction.lag.ms={lag}",
            f"at least {need} (the time a leader has to reassert a refused record's key "
            "before the cleaner may remove the key's earlier records, and the forensics "
            "window: README \"Compaction\"; a shorter window is TopicConfig("
            "min_compaction_lag_ms=...))", f"{configs} min.compaction.lag.ms={need}")
    unclean = settings.get("unclean.leader.election.enable")
    if unclean is not None and unclean.strip().lower() != "false":
        say(f"unclean.leader.election.enable={unclean}",
            "false (an unclean election makes a replica that missed acknowledged writes "
            "the leader)", f"{configs} unclean.leader.election.enable=false")
    needed = min(3, max(1, brokers))
    if replicas is not None and replicas < needed:
        say(f"replication factor {replicas}",
            f"at least {needed} (min(3, the {brokers} brokers): an acks=all write is "
            "acknowledged by the replicas in sync, and a broker holds it in its page cache, "
            "not on disk)",
            "add replicas with kafka-reassign-partitions --execute "
            "--reassignment-json-file FILE (README \"Production deployment\")")
    isr = settings.get("min.insync.replicas")
    isr_n = _int(isr)
    if replicas is not None and replicas >= 2 and isr is not None \
            and (isr_n is None or isr_n < 2):
        say(f"min.insync.replicas={isr} with {replicas} replicas",
            "at least 2 (with 1, acks=all is answered by the leader alone once the others "
            "fell behind, and its loss loses the acknowledged write)",
            f"{configs} min.insync.replicas=2")
    return found


def _planned_violations(topic: str, config: TopicConfig, brokers: int) -> list[str]:
    """What a topic created with ``config`` on ``brokers`` brokers would break."""
    replicas = config.replicas_for(brokers)
    needed = min(3, max(1, brokers))
    found = []
    if replicas < needed:
        found.append(f"TopicConfig(replication_factor={replicas}) would create topic "
                     f"{topic!r} with {replicas} replica(s) on a cluster of {brokers} brokers; "
                     f"jobreg needs at least {needed}: leave replication_factor unset")
    if replicas >= 2 and config.min_insync_for(replicas) < 2:
        found.append(f"TopicConfig(min_insync_replicas={config.min_insync_for(replicas)}) "
                     f"would create topic {topic!r} with {replicas} replicas and "
                     "min.insync.replicas 1; jobreg needs at least 2: leave "
                     "min_insync_replicas unset")
    return found


def _act_on(violations: list[str], config: TopicConfig) -> None:
    """Refuse the topic (one line) or, with ``check='warn'``, log each line."""
    if not violations:
        return
    if config.check == "warn":
        for line in violations:
            _LOG_TOPIC.warning("%s (not refused: TopicConfig check='warn' or $%s=warn)",
                               line, TOPIC_CHECK_ENV)
        return
    also = f" (and {len(violations) - 1} more: " + "; ".join(violations[1:]) + ")" \
        if len(violations) > 1 else ""
    raise ConfigError(violations[0] + also + f" (on a test cluster: TopicConfig(check='warn') "
                      f"or ${TOPIC_CHECK_ENV}=warn)")


_LOG_TOPIC = logging.getLogger("registry.topic")


def ensure_topic(bootstrap: str | Kafka, topic: str, config: TopicConfig | None = None,
                 timeout: float = 10.0) -> TopicInfo:
    """Create the registry topic if it is missing; return what it is.

    Always explicit: some brokers auto-create missing topics without
    compaction. A new topic gets ``config``'s settings, min(3, brokers) replicas and
    ``min.insync.replicas`` 2 (1 on one broker). An existing one (or one another client
    created meanwhile) is checked against them (:func:`topic_violations`): a setting that
    breaks a guarantee raises :class:`ConfigError` in one line naming it and its fix, or, with
    ``config.check == "warn"``, is logged. A setting the broker does not report is not
    checked (the embedded broker reports only those a topic was created with).
    Raises :class:`BrokerError` if the broker does not answer within
    ``timeout`` seconds and :class:`ConfigError` for a topic we cannot use.
    """
    config = config or TopicConfig()
    admin = _admin(bootstrap)
    meta = _list_topics(admin, bootstrap, timeout)
    if topic not in meta.topics or meta.topics[topic].error is not None:
        brokers = len(meta.brokers)
        _act_on(_planned_violations(topic, config, brokers), config)
        factor = config.replicas_for(brokers)
        futures = admin.create_topics([NewTopic(topic, num_partitions=config.partitions,
                                                replication_factor=factor,
                                                config=config.kafka_config(factor))],
                                      request_timeout=timeout)
        try:
            futures[topic].result(timeout)
        except KafkaException as e:
            # Kafka answers TOPIC_AUTHORIZATION_FAILED both for a user without CREATE and
            # for an existing topic the user may not describe (it does not say which).
            refused = not_authorized(bootstrap, e, "CREATE", "topic", topic,
                                     f"or, if an administrator created it, DESCRIBE "
                                     f"({_DESCRIBE_HINT})")
            if refused is not None:
                raise refused from None
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"could not create topic {topic!r} on {bootstrap}: "
                                  f"{e.args[0].str()}") from e
        meta = _await_topic(admin, bootstrap, topic, timeout)
    found = meta.topics[topic]
    partitions = len(found.partitions)
    replicas: int | None = min(
        (len(p.replicas) for p in found.partitions.values() if p.replicas), default=None)
    settings: dict[str, str | None] = {}
    try:
        described = admin.describe_configs([ConfigResource("topic", topic)])
        entries = next(iter(described.values())).result(timeout)
        settings = {k: entries[k].value for k in _CHECKED if k in entries}
    except Exception as e:  # a broker that cannot describe configs: trust creation
        # ... but not a user who may not: the checks below are what jobreg's guarantees
        # rest on, and an ACL missing must not switch them off unseen.
        refused = not_authorized(bootstrap, e, "DESCRIBE_CONFIGS", "topic", topic,
                                 "jobreg checks the topic's cleanup.policy, "
                                 "message.timestamp.type, min.compaction.lag.ms and "
                                 "min.insync.replicas before it uses it")
        if refused is not None:
            raise refused from None
    _act_on(topic_violations(bootstrap, topic, settings, replicas, len(meta.brokers), config),
            config)
    return TopicInfo(partitions, _int(settings.get("delete.retention.ms")))


def _await_topic(admin: _Admin, bootstrap: str | Kafka, topic: str,
                 timeout: float) -> ClusterMetadata:
    """The cluster's metadata once it lists ``topic`` and its partitions.

    On a cluster of several Kafka brokers, CreateTopics returns once the controller has the
    topic, and each broker learns it from the metadata log a moment later: a metadata
    request answered by one that has not yet lacks the topic (the campaign on three nodes,
    issue 34: 29 of 40 fresh topics). So the metadata is asked again until it lists it.
    Kafka never lists a topic the user may not describe: that is :class:`NotAuthorized`.
    """
    deadline = time.monotonic() + timeout
    while True:
        meta = _list_topics(admin, bootstrap, max(0.001, deadline - time.monotonic()))
        found = meta.topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return meta
        hidden = _hidden_topic(admin, topic, max(0.001, deadline - time.monotonic()))
        if hidden is not None:
            raise hidden
        if time.monotonic() >= deadline:
            raise BrokerError(f"topic {topic!r} exists on {bootstrap}, but the metadata did "
                              f"not list it within {timeout:g} s")
        time.sleep(0.05)


def check_bootstrap(value: object) -> str:
    """``value`` if it is ``HOST:PORT[,HOST:PORT...]`` (an IPv6 host in brackets), else
    :class:`ConfigError`. Kafka's own clients need the port; so does jobreg."""
    servers = value.split(",") if isinstance(value, str) else [""]
    for server in servers:
        host, sep, port = server.strip().rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or any(c.isspace() or c in "/[]" for c in host) \
                or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"bootstrap {value!r}: {server.strip()!r} is not HOST:PORT "
                              "(several: HOST:PORT,HOST:PORT)")
    return ",".join(s.strip() for s in servers)


def refuse_fast(bootstrap: str | Kafka, timeout: float) -> None:
    """Raise :class:`BrokerError` at once if no address of ``bootstrap`` can be reached at
    all: every one refuses the connection or does not resolve. An address that does not
    answer (a firewall, a paused broker) is left to the caller's own timeout."""
    reasons = []
    for server in check_bootstrap(str(bootstrap)).split(","):
        host, _, port = server.rpartition(":")
        host = host.strip("[]")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            reasons.append(f"{server}: {e.strerror}")
            continue
        for family, kind, proto, _, address in infos:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(min(timeout, 2.0))
                try:
                    sock.connect(address)
                    return
                except ConnectionRefusedError:
                    reasons.append(f"{server}: connection refused")
                except OSError:  # no answer, unreachable: not conclusive
                    return
    raise BrokerError(f"no Kafka broker at {bootstrap} ({'; '.join(reasons)})")


def topic_partitions(bootstrap: str | Kafka, topic: str, timeout: float = 10.0) -> int:
    """How many partitions an existing topic has (never creates it).

    Raises :class:`BrokerError` at once if no address of ``bootstrap`` can be reached
    (:func:`refuse_fast`) or if the broker does not answer within ``timeout`` seconds,
    and :class:`ConfigError` if the topic does not exist.
    """
    refuse_fast(bootstrap, timeout)
    admin = _admin(bootstrap)
    meta = _list_topics(admin, bootstrap, timeout)
    found = meta.topics.get(topic)
    if found is None:
        hidden = _hidden_topic(admin, topic, timeout)
        if hidden is not None:
            raise hidden
    if found is None or found.error is not None or not found.partitions:
        names = sorted(t for t in meta.topics if not t.startswith("__"))
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10
                                         else "")
        raise ConfigError(f"topic {topic!r} does not exist on {bootstrap} "
                          f"(topics there: {shown or 'none'})")
    return len(found.partitions)


# librdkafka's words for a peer that answered in another protocol (an HTTP server, a TLS
# listener to a plaintext client): it reads the reply's first 4 bytes as a Kafka frame size
# and suggests raising receive.message.max.bytes, which is never the fix.
_NOT_KAFKA = re.compile(r"Invalid response size|Protocol parse failure|Unsupported protocol",
                        re.I)
# ... and for a peer that never answered (accepted and silent, or no route at all).
_SILENT = re.compile(r"Broker transport failure|brokers are down|timed out|Timed out", re.I)


def no_broker(bootstrap: str | Kafka, timeout: float, why: str) -> BrokerError:
    """The one-line error for a bootstrap address where no Kafka broker answered within
    ``timeout``, given librdkafka's last word ``why``: a peer that answered in another
    protocol, or one that never answered, is said in words that name the address and the
    likely causes; any other reason (a TLS or SASL failure) is kept as librdkafka says it."""
    why = " ".join(why.split())
    if _NOT_KAFKA.search(why):
        said = (f"something at {bootstrap} answered, but not in the Kafka protocol: the wrong "
                "port, another server, or a TLS listener, which needs security.protocol=SSL "
                "in --command-config")
    elif _SILENT.search(why):
        said = ("nothing there answered the Kafka handshake: a broker that is down or paused, "
                "a firewall, or the wrong address")
    else:
        said = why
    return BrokerError(f"no Kafka broker answered at {bootstrap} within {timeout:g} s ({said})")


_LOGIN_CHECK_S = 0.25  # the first wait of a metadata request before a look for a refused login


def _list_topics(admin: _Admin, bootstrap: str | Kafka, timeout: float) -> ClusterMetadata:
    """The cluster's metadata. A refused SASL login ends the wait at once, as Kafka's own
    clients end it (librdkafka would retry the login until the timeout): the request waits
    :data:`_LOGIN_CHECK_S`, then twice as long each time (a distant broker's answer may take
    longer than the first waits), and between waits looks for a refused login."""
    deadline = time.monotonic() + timeout
    wait = _LOGIN_CHECK_S
    while True:
        left = deadline - time.monotonic()
        try:
            meta: ClusterMetadata = admin.list_topics(timeout=max(0.001, min(left, wait)))
            return meta
        except KafkaException as e:
            refused = admin.refused_login()
            if refused is not None or left <= wait:
                # Neither our frame's admin nor confluent-kafka's frame in the cause's
                # traceback may keep the client alive after the error.
                admin.drop()
                e.with_traceback(None)
            if refused is not None:
                raise refused from e
            if left <= wait:
                raise no_broker(bootstrap, timeout, admin.last_error or e.args[0].str()) from e
        wait *= 2


def transactional_id(topic: str, namespace: str) -> str:
    """The ``transactional.id`` a namespace's leader had while leaders wrote in
    transactions (before the idempotent write path; README "The write path"). Kept for
    :class:`TransactionalWriter`, which tests and benchmarks use as another producer's
    transactions on a partition, and for ACL examples of older deployments."""
    return f"jobreg.{topic}.{namespace}"


_STALL_S = 0.5  # a read without a record for this long asks whether records lie ahead
# take_own's ListOffsets, and its probe fetch, give up after this; then the writer reads its
# records back, which waits as long as the call may. The probe's fetches wait at most
# _PROBE_WAIT_MS at the broker (at the end of the partition a fetch is held for its wait).
_PROBE_WAIT_MS = 1
_PROBE_S = 0.2
_MAX_FETCH_WAIT_MS = 1000
_MIN_UNSTICK_MS = 20  # the first lengthened wait, whatever the configured one (0 included)


class LogReader:
    """Reads one partition from an offset, in order, read_committed; never commits offsets."""

    def __init__(self, bootstrap: str | Kafka, topic: str, partition: int, *,
                 start_offset: int = 0, fetch_wait_ms: int = 5, batch_size: int = 1000) -> None:
        self.kafka = Kafka.of(bootstrap)
        self.bootstrap = str(bootstrap)
        self.topic = topic
        self.partition = partition
        self.position = start_offset
        self._batch_size = batch_size
        self._fetch_wait_ms = fetch_wait_ms
        self.fetch_wait_ms = fetch_wait_ms
        """The longest a fetch waits at the broker for records. A read to the end
        (:meth:`read_to_end`, :meth:`sync`) lengthens it while fetches come back empty below
        the high watermark (:meth:`_unstick`), and restores it when it ends: a long wait
        would delay every later sync at the end of the partition by as much."""
        self._consumer: Consumer | _Closed = self._new_consumer()
        self._tp = TopicPartition(topic, partition, start_offset)
        self._consumer.assign([self._tp])
        self._consumer.pause([self._tp])  # it fetches only while a read runs
        self._paused = True
        self._eof = False
        self._known_end: int | None = None  # every offset below it was read (or taken)
        self.stable_end: int | None = None
        """Where the last end of partition a fetch reported lay: read_committed, that is the
        partition's last stable offset then (the first record of the earliest transaction
        the broker counts as open, else the high watermark). Nothing is read past it, so a
        write whose records lie at or after it cannot be confirmed until it moves."""
        self._moved = False  # the position moved without the consumer (take_own)
        self._probe: Consumer | None = None  # made by the first take_own that needs it
        self._several_brokers: bool | None = None  # asked by the first _end_confirmed

    def _settings(self, fetch_wait_ms: int, reset: str) -> dict[str, Any]:
        return self.kafka.settings(_CLIENT_DEFAULTS, {
            "group.id": f"jobreg-reader-{uuid.uuid4()}",  # required by librdkafka; never used
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": fetch_wait_ms,
            "fetch.error.backoff.ms": 10,
            "auto.offset.reset": reset,
        })

    def _new_consumer(self) -> Consumer:
        consumer: Consumer = _client(Consumer, self._settings(self.fetch_wait_ms, "earliest"))
        return consumer

    def _unstick(self, timeout: float) -> None:
        """A read made no progress for a while: if the broker says records lie ahead, wait
        longer per fetch (a new consumer: librdkafka cannot change it on the fly).

        The embedded broker lists every stored batch of the partition on each fetch that
        has records to return, and when the listing outlasts the fetch's wait it answers
        with none although its high watermark says there are some (DESIGN.md; at 5 ms a
        partition of ~5,000 batches, sooner on a loaded machine). Kafka answers a fetch
        with records at once whatever its wait: there this triggers only while a connection
        is re-established, and costs nothing. Every read calls it (catch-up reads, syncs: a
        sync whose position is a commit marker of a long partition asks for a fetch with data
        too; a writer reading its records back), and restores the wait when it ends, so syncs
        at the end of the partition stay prompt.
        """
        # At the end of the partition a fetch is held for the whole wait: keep it well
        # inside the read's patience.
        cap = max(self._fetch_wait_ms, min(_MAX_FETCH_WAIT_MS, int(timeout * 1000 / 4)))
        if self.fetch_wait_ms >= cap:
            return
        high = self._high_watermark()
        if high is None or high <= self.position:
            return  # nothing ahead, or unreachable: waiting longer would not help
        wait = min(cap, max(self.fetch_wait_ms * 4, _MIN_UNSTICK_MS))
        _LOG.info("reading %s[%d]: no records at offset %d below the high watermark %d; "
                  "fetches now wait up to %d ms", self.topic, self.partition, self.position,
                  high, wait)
        self._renew_consumer(wait)

    def _high_watermark(self) -> int | None:
        """Where records this reader can read end, as far as the broker says (``None`` if it
        cannot say).

        Asked first as a ListOffsets under read_committed: the last stable offset on Kafka,
        which never lies below what a read_committed reader has read. The embedded broker
        answers 0 there for as long as any transaction is open on the partition (another
        namespace's leader mid-write, on a partition it shares with this one): an answer of 0
        or below the reader's position is that, and then the high watermark the reader's own
        fetches last reported stands in (a read of a long partition never lengthened its
        wait while the partition's other leaders kept writing:
        tests/integration/test_shared_partition.py). The high watermark is not asked first:
        it counts records of transactions still open, which a read_committed reader cannot
        read yet, and a read at the last stable offset would renew its consumer for them
        (a sync of a short timeout then missed its end).
        """
        tp = TopicPartition(self.topic, self.partition)
        try:
            _low, stable = self._consumer.get_watermark_offsets(tp, timeout=1.0, cached=False)
        except KafkaException:
            return None
        if stable is None or (stable >= self.position and stable > 0):
            return stable
        # Below the position, or 0 (at offset 0 too): the embedded broker's answer while a
        # transaction is open. On Kafka 0 is an empty partition (high watermark 0 too) or one
        # whose records all lie in an open transaction (a longer wait, nothing worse).
        with contextlib.suppress(KafkaException):
            _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            if high is not None and high >= 0:
                return high
        return stable

    def _renew_consumer(self, fetch_wait_ms: int) -> None:
        """A consumer with another fetch wait, reading from :attr:`position` (resumed)."""
        self.fetch_wait_ms = fetch_wait_ms
        old, self._consumer = self._consumer, self._new_consumer()
        with contextlib.suppress(KafkaException):
            old.close()
        self._tp = TopicPartition(self.topic, self.partition, self.position)
        self._consumer.assign([self._tp])
        self._paused = False
        self._moved = False
        self._eof = False
        # _known_end stays: where the partition was seen to end does not depend on which
        # consumer saw it (forgetting it made every later write read its records back).

    def take_own(self, records: list[LogRecord]) -> bool:
        """Take a writer's own just-acknowledged records as read, if nothing can lie before
        them and every reader can read them (see the module docstring); ``False``: read
        them instead."""
        first, last = records[0].offset, records[-1].offset
        if self._known_end != first or last - first != len(records) - 1 \
                or self.position > first:
            return False
        stable = self._stable_offset()
        if stable is None or stable <= last:
            # Not shown by ListOffsets (the embedded broker answers an offset inside a
            # producer's latest batch of several records): ask a fetch.
            stable = last + 1 if self._fetch_shows_end(last) else None
            if stable is None:
                return False
        self.position = last + 1
        # Where the partition ended when asked: known only if nothing followed ours.
        self._known_end = stable if stable == last + 1 else None
        self._moved = True
        return True

    def _fetch_shows_end(self, last: int) -> bool:
        """Whether a read_committed fetch from ``last + 1`` answered now shows the end of the
        partition there or records after it (every reader then reads up to ``last``), within
        _PROBE_S. A probe consumer of its own, so the reader's position and prefetched data
        stay as they are; at the end of the partition a fetch carries no records, so it
        stays cheap on the embedded broker, whose fetches with records cost more the more
        batches a partition holds. On Kafka ``last + 1`` is never past the high watermark
        once the records are acknowledged, so the fetch is never out of range (a fetch past
        the end waited out librdkafka's 100 ms offset reset)."""
        tp = TopicPartition(self.topic, self.partition, last + 1)
        deadline = time.monotonic() + _PROBE_S
        try:
            if self._probe is None:
                self._probe = _client(Consumer, self._settings(_PROBE_WAIT_MS, "latest"))
                self._probe.assign([tp])
            else:  # a seek wakes the fetcher at once (see _resume)
                self._probe.resume([tp])
                self._probe.seek(tp)
            while (left := deadline - time.monotonic()) > 0:
                first = self._probe.poll(left)  # consume(n, t) would wait all of t for n
                for m in [] if first is None else [first, *self._probe.consume(100, 0)]:
                    err = m.error()
                    if err is None and m.offset() > last:
                        return True
                    if err is not None and err.code() == KafkaError._PARTITION_EOF \
                            and m.offset() > last:
                        return True
        except KafkaException:
            return False  # the caller reads instead, and reports what fails there
        finally:
            if self._probe is not None:
                with contextlib.suppress(KafkaException):
                    self._probe.pause([tp])
        return False

    def _stable_offset(self) -> int | None:
        """The partition's last stable offset as a read_committed ListOffsets answers it now
        (``None`` if the broker does not answer within _PROBE_S): every reader reads every
        record below it. On Kafka an acknowledged (``acks=all``) record lies below the high
        watermark, so below this unless a transaction of another producer is open before it.
        The embedded broker answers 0 while any transaction is open on the partition: then
        the writer reads its records back."""
        try:
            _low, stable = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=_PROBE_S, cached=False)
        except KafkaException:
            return None  # the caller reads instead, and reports what fails there
        return stable

    def _resume(self) -> None:
        moved, self._moved = self._moved, False
        if self._paused:
            self._consumer.resume([self._tp])
            self._paused = False
            # A resumed partition is fetched only when librdkafka's broker thread next wakes
            # up, up to a second later (measured: 0.94 s to read a grant back right after a
            # catch-up); a seek wakes it at once. At our own position it loses nothing.
            moved = True
        if moved:  # and when the consumer's own position is behind what was taken
            with contextlib.suppress(KafkaException):
                self._consumer.seek(TopicPartition(self.topic, self.partition, self.position))

    def _pause(self) -> None:
        if not self._paused:
            with contextlib.suppress(KafkaException):
                self._consumer.pause([self._tp])
            self._paused = True

    def poll(self, timeout: float) -> list[LogRecord]:
        """Whatever records arrive within ``timeout`` seconds (possibly none)."""
        self._resume()
        out: list[LogRecord] = []
        try:
            # consume(n, t) waits for n messages or the whole of t; so take what is
            # queued, and block (poll) only when nothing is.
            msgs = self._consumer.consume(self._batch_size, 0)
            if not msgs:
                first = self._consumer.poll(timeout)
                if first is not None:
                    msgs = [first, *self._consumer.consume(self._batch_size - 1, 0)]
        except KafkaException as e:
            raise BrokerError(f"reading {self.topic}[{self.partition}] failed: "
                              f"{e.args[0].str()}") from e
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._eof = True  # in order: records after it clear it again
                    end = m.offset()  # None: the binding's word for an invalid offset
                    if end is not None and end >= 0:
                        self.stable_end = end
                    if end is not None and end >= 0 and (not out or end > out[-1].offset):
                        self._known_end = end
                    continue
                if err.fatal():
                    raise BrokerError(f"reading {self.topic}[{self.partition}] failed: "
                                      f"{err.str()}")
                if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    # librdkafka retries a refused fetch until the caller's timeout.
                    refused = not_authorized(self.kafka, err, "READ", "topic", self.topic)
                    assert refused is not None
                    raise refused
                # Transient (broker down, retrying): the caller's deadline bounds it. Also
                # GROUP_AUTHORIZATION_FAILED: librdkafka looks up the coordinator of the
                # consumer's group id, which a reader never uses (it needs no group ACL).
                continue
            ts_type, ts = m.timestamp()
            offset = m.offset()
            assert offset is not None  # a record has its offset
            out.append(LogRecord(offset, m.key(), m.value(),
                                 ts if ts_type != 0 else None, self.partition))
            self._eof = False
            self._known_end = None
        if out:
            self.position = out[-1].offset + 1
        return out

    def seek(self, offset: int) -> None:
        """Read from ``offset`` next (before the first poll: re-assigns the partition)."""
        self.position = offset
        self._tp = TopicPartition(self.topic, self.partition, offset)
        self._consumer.assign([self._tp])
        self._consumer.pause([self._tp])
        self._paused = True
        self._eof = False
        self._known_end = None
        self._moved = False

    def end_offset(self, timeout: float) -> int | None:
        """The partition's end offset as the broker reports it (``None`` if it cannot say).

        Only for sanity checks that err on the safe side: some brokers
        under-report it while producers batch, so never use it to decide that
        a reader has caught up (:meth:`sync` does that).
        """
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=timeout, cached=False)
        except KafkaException:
            return None
        return high

    def lag(self) -> int:
        """Offsets between :attr:`position` and the end of the partition as this reader's
        last fetch reported it (librdkafka's cached watermark: no request), 0 once a read
        saw the end or took its writer's records as the last ones. Metrics only: it says
        nothing about records appended since the last fetch."""
        if self._eof or (self._known_end is not None and self._known_end >= self.position):
            return 0
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), cached=True)
        except (KafkaException, RuntimeError):  # RuntimeError: closed
            return 0
        return max(0, high - self.position) if high is not None else 0

    def read_until(self, offset: int, timeout: float) -> Iterable[list[LogRecord]]:
        """Yield batches until a record at or past ``offset`` was read, and then, while
        nothing follows the record at ``offset``, until the end of the partition was seen
        (usually in the same fetch, or the next one, past a commit marker), so that the next
        write of this reader's writer can take its records as read (:meth:`take_own`). A
        record after it (another writer's) ends the read at once: on a busy partition the
        end would be chased for nothing. If the end does not show within ``timeout``, it
        stops.

        Raises :class:`BrokerError` if no record at or past ``offset`` was read within
        ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        stalled_since = time.monotonic()
        self._eof = False
        try:
            while self.position <= offset or (self.position == offset + 1 and not self._eof):
                left = deadline - time.monotonic()
                if left <= 0:
                    if self.position > offset:
                        return  # read; only the end was not seen
                    raise BrokerError(f"offset {offset} of {self.topic}[{self.partition}] was "
                                      f"not readable from {self.bootstrap} within {timeout:g} s")
                if time.monotonic() - stalled_since > _STALL_S:
                    self._unstick(timeout)
                    stalled_since = time.monotonic()
                batch = self.poll(min(left, 0.2))
                if batch:
                    stalled_since = time.monotonic()
                    yield batch
        finally:
            self._restore_wait()
            self._pause()

    def read_to_end(self, timeout: float, until: int | None = None
                    ) -> Iterable[list[LogRecord]]:
        """Yield batches until the end of the partition (or until a record past offset
        ``until`` was read), as :meth:`sync` does, except that ``timeout`` bounds the
        time *without progress*, not the whole read: raises :class:`BrokerError` when no
        record arrived and no end was seen for ``timeout`` seconds (an unreachable
        broker, for instance).
        """
        return self._read(timeout, until=until, per_progress=True)

    def sync(self, timeout: float) -> Iterable[list[LogRecord]]:
        """Yield batches until the end of the partition as of a fetch issued now.

        Raises :class:`BrokerError` if no end was seen within ``timeout`` s
        (an unreachable broker, for instance).
        """
        return self._read(timeout, until=None, per_progress=False)

    def _read(self, timeout: float, *, until: int | None,
              per_progress: bool) -> Iterator[list[LogRecord]]:
        deadline = time.monotonic() + timeout
        self._eof = False
        # A seek to our own position discards prefetched data and forces a fresh
        # fetch, whose end-of-partition event then means "caught up as of now"
        # (see the module docstring). Before the first fetch it may fail: then
        # the first fetch is fresh anyway.
        self._resume()
        with contextlib.suppress(KafkaException):
            self._consumer.seek(TopicPartition(self.topic, self.partition, self.position))
        stalled_since = time.monotonic()
        try:
            while not self._eof and (until is None or self.position <= until):
                left = deadline - time.monotonic()
                if left <= 0:
                    where = f"{self.topic}[{self.partition}] at {self.bootstrap}"
                    if per_progress:
                        raise BrokerError(f"reading {where} made no progress for {timeout:g} s "
                                          f"at offset {self.position} (is the broker "
                                          "reachable?)")
                    raise BrokerError(f"could not read to the end of {where} within "
                                      f"{timeout:g} s (is the broker reachable?)")
                if time.monotonic() - stalled_since > _STALL_S:
                    self._unstick(timeout)
                    stalled_since = time.monotonic()
                batch = self.poll(min(left, 0.2))
                if batch:
                    stalled_since = time.monotonic()
                    if per_progress:
                        deadline = time.monotonic() + timeout
                    yield batch
                if until is None or self.position <= until:
                    self._doubt_end(min(1.0, max(0.01, left)))
        finally:
            self._restore_wait()
            self._pause()

    def _doubt_end(self, timeout: float) -> None:
        """After a poll: an end of partition it reported that is not confirmed
        (:meth:`_end_confirmed`) is forgotten, and a fresh fetch from our position asked for
        after a moment (a new leader behind its term, or records appended since)."""
        if not self._eof or self._end_confirmed(timeout):
            return
        self._eof = False
        self._known_end = None
        time.sleep(0.02)
        with contextlib.suppress(KafkaException):
            self._consumer.seek(TopicPartition(self.topic, self.partition, self.position))

    def _end_confirmed(self, timeout: float) -> bool:
        """Whether the end of partition a fetch reported (:attr:`stable_end`, past a commit
        marker that follows our position) is the partition's (see the module docstring): a
        ListOffsets answer at or below it; ``False`` if the leader cannot answer yet
        (Kafka's OFFSET_NOT_AVAILABLE while a new leader's high watermark is behind the
        start of its term) or says more lies ahead."""
        if self._several_brokers is None:
            try:  # once per reader: one broker has no leader to change
                meta = self._consumer.list_topics(self.topic, timeout=timeout)
                self._several_brokers = len(meta.brokers) > 1
            except KafkaException:
                return False
        if not self._several_brokers:
            return True
        reported = max(self.position, self.stable_end or 0)
        try:
            _low, stable = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, self.partition), timeout=timeout, cached=False)
        except KafkaException:
            return False
        return stable is None or stable <= reported

    def _restore_wait(self) -> None:
        """After a read: the configured fetch wait again, so that syncs at the end of the
        partition are not held for a lengthened one."""
        if self.fetch_wait_ms != self._fetch_wait_ms:
            self._renew_consumer(self._fetch_wait_ms)

    def close(self) -> None:
        """Leave the broker; the reader cannot be used afterwards."""
        consumer, self._consumer = self._consumer, _Closed("reader")
        probe, self._probe = self._probe, None
        for client in (consumer, probe):
            if client is not None and not isinstance(client, _Closed):
                client.close()


def _warm_up(producer: Producer, timeout: float, topic: str | None) -> None:
    # Fetching metadata first brings a broker connection up, so the producer
    # id request does not wait for librdkafka's 500 ms retry timer (measured:
    # producer start 0.5 s -> 0.06 s on the embedded broker). One topic only:
    # a cluster's full metadata can be large. Twice: the first answer may come over
    # the bootstrap connection before the broker it names is up (then the id request
    # still waited 0.5 s: a grant's first write, a new term's producer); the second
    # goes to a broker the metadata named. On any broker it costs one metadata request.
    producer.list_topics(topic=topic, timeout=timeout)
    producer.list_topics(topic=topic, timeout=timeout)


class TransactionFailed(BrokerError):
    """A transaction did not commit; whether its records landed must be read from the log.

    ``fatal`` means the producer is unusable (fenced by a newer producer with
    the same ``transactional.id``) and must be re-created.
    """

    def __init__(self, message: str, *, fatal: bool, appended: tuple[int, ...] = (),
                 in_doubt: int = 0) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.appended = appended
        """Offsets the broker gave records of the failed transaction: they were appended,
        and whether a reader ever sees them is the broker's (Kafka: an aborted or fenced
        transaction's records, never; the embedded broker may show them later)."""
        self.in_doubt = in_doubt
        """Records of the failed transaction that may have been appended at an offset the
        client never learnt: sent, but no delivery report said where, or that the broker
        refused them (a commit that timed out with them in flight)."""


# Delivery errors that say a record was not appended: never sent (purged from the queue),
# or refused by the broker as a whole batch (Kafka appends a batch or refuses it).
# Anything else (a timeout, a purge in flight, a broker's REQUEST_TIMED_OUT or
# NOT_ENOUGH_REPLICAS_AFTER_APPEND) leaves the record in doubt.
_NOT_APPENDED = frozenset({
    KafkaError._PURGE_QUEUE, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.INVALID_TXN_STATE, KafkaError.INVALID_PRODUCER_ID_MAPPING,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.INVALID_TIMESTAMP,
})


_LATE_REPORTS_S = 0.2  # how long a failed transaction waits for its records' reports


class TransactionNotAuthorized(TransactionFailed, NotAuthorized):
    """A transaction the broker's authorizer refused (:class:`NotAuthorized`'s one line and
    attributes, with :class:`TransactionFailed`'s: what was appended, what is in doubt)."""

    def __init__(self, refused: NotAuthorized, *, fatal: bool, appended: tuple[int, ...] = (),
                 in_doubt: int = 0) -> None:
        # Not TransactionFailed.__init__: its super() is NotAuthorized's in this class.
        BrokerError.__init__(self, str(refused))
        self.fatal, self.appended, self.in_doubt = fatal, appended, in_doubt
        self.operation, self.resource_type = refused.operation, refused.resource_type
        self.resource, self.code = refused.resource, refused.code


class _Delivery:
    """Delivery reports of one write. A record can be confirmed without an offset: the
    idempotent producer's retry of a record the broker already had comes back as a success
    (DUPLICATE_SEQUENCE_NUMBER) with no offset; then the writer cannot say where its
    records are, and the caller must read the log (``missing_offsets``). ``refused``
    counts the reports that say their record was not appended (:data:`_NOT_APPENDED`)."""

    __slots__ = ("error", "missing_offsets", "placed", "refused", "reports")

    def __init__(self) -> None:
        self.reports = 0  # every report, whatever it says
        self.placed: list[tuple[int, bytes | None, bytes | None, int | None]] = []
        """(offset, key, value, stamp) of every record reported appended, as the report
        says: reports may come in another order than the records were produced (seen in
        the fault campaign, seed 6029: a write's records labelled with each other's
        offsets), so a record is matched to its offset by its own bytes, never by the
        order of the reports (:meth:`in_order`)."""
        self.error: KafkaError | None = None
        self.missing_offsets = 0
        self.refused = 0

    def __call__(self, err: KafkaError | None, msg: Any) -> None:  # msg: a Message
        self.reports += 1
        if err is not None:
            self.error = err
            if err.code() in _NOT_APPENDED:
                self.refused += 1
        elif msg.offset() is None or msg.offset() < 0:
            self.missing_offsets += 1
        else:
            # The broker's stamp when the topic uses LogAppendTime (Kafka returns it in
            # the produce response), else the producer's, which is then what it stored:
            # either way what a reader of the record sees.
            ts_type, ts = msg.timestamp()
            self.placed.append((msg.offset(), msg.key(), msg.value(),
                                ts if ts_type != 0 else None))

    @property
    def offsets(self) -> list[int]:
        """The offsets the reports gave, in the order the reports came."""
        return [offset for offset, _, _, _ in self.placed]

    def in_order(self, records: Sequence[tuple[str, bytes | None]], partition: int
                 ) -> list[LogRecord] | None:
        """The written ``records`` as the log holds them, in the order given (which is the
        log's: one producer, one partition), each with the offset and stamp its own report
        gave it; ``None`` if the reports do not account for every record, one each, in
        that order (then the caller must read the log)."""
        placed = sorted(self.placed)
        if len(placed) != len(records) or any(
                key != want.encode("utf-8") or value != data
                for (_, key, value, _), (want, data) in zip(placed, records, strict=True)):
            return None
        return [LogRecord(offset, key, value, stamp, partition)
                for offset, key, value, stamp in placed]


TRANSACTION_TIMEOUT_MS = 15_000
"""``transaction.timeout.ms`` of a :class:`TransactionalWriter`: how long Kafka lets its
transaction stay open before the coordinator aborts it (and fences the producer).

Leaders wrote in transactions until issue 35 (README "The write path"); this is the value they
used, bounding how long a leader killed mid-transaction held the last stable offset of its
partition: Kafka aborts it between this timeout and this timeout plus the broker's
``transaction.abort.timed.out.transaction.cleanup.interval.ms`` (10 s by default), before a
held write gives up (half the duplicate window, 30 s). Kept for :class:`TransactionalWriter`,
which the tests and benchmarks use as another producer's transactions on a partition."""


class TransactionalWriter:
    """A producer whose every write is one transaction on a partition: the leaders' before
    issue 35, now another producer's transactions in tests and benchmarks.

    ``transaction_timeout_ms``: its ``transaction.timeout.ms`` (default
    :data:`TRANSACTION_TIMEOUT_MS`, read when the writer is made)."""

    def __init__(self, bootstrap: str | Kafka, topic: str, namespace: str, partition: int,
                 timeout: float = 10.0, *, transaction_timeout_ms: int | None = None) -> None:
        self.topic, self.partition = topic, partition
        self._timeout = timeout
        if transaction_timeout_ms is None:
            transaction_timeout_ms = TRANSACTION_TIMEOUT_MS
        self._kafka = Kafka.of(bootstrap)
        self._transactional_id = transactional_id(topic, namespace)
        self._producer = _client(Producer, self._kafka.settings(_CLIENT_DEFAULTS, {
            "transactional.id": self._transactional_id,
            # Nothing leaves before commit_transaction flushes, and a flush ignores
            # linger.ms (a one-record transaction takes 2.1 ms at 0 or 1000 on the embedded
            # broker): a group's records go in one produce request. At 0, each produce()
            # sent its own while earlier ones were in flight (a group of 64 records: 30 ms
            # a transaction on the embedded broker; 3.3 ms now).
            "linger.ms": 1000,
            "transaction.timeout.ms": transaction_timeout_ms,
        }))
        try:
            _warm_up(self._producer, timeout, topic)
            self._producer.init_transactions(timeout)
        except KafkaException as e:
            refused = not_authorized(bootstrap, e, "WRITE", "transactional id",
                                     transactional_id(topic, namespace))
            if refused is not None:
                self.close()
                raise TransactionNotAuthorized(refused, fatal=True) from None
            raise TransactionFailed(f"init_transactions failed: {e.args[0].str()}",
                                    fatal=True) from e

    def write(self, records: list[tuple[str, bytes]]) -> list[LogRecord]:
        """Write ``(key, value)`` records in one transaction; return them as the log holds
        them (offset, key, value, the stamp a reader sees), in order."""
        p, delivery = self._producer, _Delivery()
        produced = 0
        try:
            p.begin_transaction()
            for key, value in records:
                p.produce(self.topic, value=value, key=key.encode("utf-8"),
                          partition=self.partition, on_delivery=delivery)
                produced += 1
            p.commit_transaction(self._timeout)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            fatal = err.fatal() or not err.txn_requires_abort()
            if err.txn_requires_abort():
                try:
                    p.abort_transaction(self._timeout)
                except KafkaException:
                    fatal = True
            # The reports librdkafka holds now (an abort's purge, a fenced producer's):
            # each says appended (an offset), not appended, or nothing yet (in doubt).
            # librdkafka purges a fenced producer's unsent records in a thread of its own,
            # so their reports ("not sent") may come a moment after the error: wait for
            # them briefly, or they count in doubt and make the answer unknown where
            # Fenced is exact (tests/integration/test_kafka_fencing.py). Reports that do
            # not come (records in flight to a broker that stopped answering) stay in doubt.
            deadline = time.monotonic() + _LATE_REPORTS_S
            with contextlib.suppress(KafkaException):
                p.poll(0)
                while delivery.reports < produced and time.monotonic() < deadline:
                    p.poll(0.01)
            in_doubt = produced - len(delivery.offsets) - delivery.refused
            refused = (not_authorized(self._kafka, err, "WRITE", "topic", self.topic)
                       if err.code() != KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                       else not_authorized(self._kafka, err, "WRITE", "transactional id",
                                           self._transactional_id))
            if refused is not None:
                raise TransactionNotAuthorized(refused, fatal=fatal,
                                               appended=tuple(delivery.offsets),
                                               in_doubt=in_doubt) from None
            raise TransactionFailed(f"transaction failed: {err.name()} ({err.str()})",
                                    fatal=fatal, appended=tuple(delivery.offsets),
                                    in_doubt=in_doubt) from e
        if delivery.missing_offsets:  # committed, but where? The caller reads the log.
            raise TransactionFailed(f"{delivery.missing_offsets} record(s) confirmed without "
                                    "their offset (a retry the broker already had)", fatal=False)
        if delivery.error is not None or len(delivery.offsets) != len(records):
            raise TransactionFailed(f"delivery failed: {delivery.error}", fatal=False)
        written = delivery.in_order(records, self.partition)
        if written is None:  # committed, but the reports do not say where: read the log
            raise TransactionFailed("the delivery reports do not match the records written",
                                    fatal=False)
        return written

    def close(self) -> None:
        """Close the producer (the ``transactional.id`` stays ours until another fences it).

        Never raises: confluent-kafka raises a fatal error (fenced) from whichever call
        serves it, ``close()`` included, after the producer is destroyed all the same.
        """
        producer, self._producer = self._producer, _Closed("transactional producer")
        if isinstance(producer, _Closed):
            return
        # Bounded: librdkafka ends an open transaction before it lets go, retrying for as
        # long as the broker drops the connection. Kafka answers a fenced producer's
        # EndTxn with PRODUCER_FENCED; the embedded broker drops the connection when a
        # producer fenced after its records were appended ends its transaction, and the
        # close would never return (tests/integration/test_outcomes.py). Then the producer is left to
        # its retries in the background: one client leaked, the caller not hung.
        closing = threading.Thread(target=_destroy, args=(producer,), daemon=True,
                                   name=f"jobreg-close-{self.topic}-{self.partition}")
        closing.start()
        closing.join(min(self._timeout, 2.0))
        if closing.is_alive():
            _LOG.warning("the transactional producer of %s[%d] did not close within %g s "
                         "(its open transaction's end is still being retried); left to "
                         "finish in the background", self.topic, self.partition,
                         min(self._timeout, 2.0))


class WriteFailed(BrokerError):
    """A leader's write (:class:`LeaderWriter`) was not confirmed; whether its records landed
    must be read from the log.

    The writer is unusable afterwards (``fatal``): its unconfirmed records were purged, and
    the next write makes a new producer. ``appended``: offsets the broker reported for
    records of the write; ``in_doubt``: records sent with no report of where they went or
    that they were refused (a record in flight may still be appended later, by a broker
    that received it before the client gave up: a reader decides it then, at its offset).
    """

    def __init__(self, message: str, *, fatal: bool = True, appended: tuple[int, ...] = (),
                 in_doubt: int = 0) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.appended = appended
        self.in_doubt = in_doubt


class WriteNotAuthorized(WriteFailed, NotAuthorized):
    """A leader's write the broker's authorizer refused (:class:`NotAuthorized`'s one line
    and attributes, with :class:`WriteFailed`'s: what was appended, what is in doubt)."""

    def __init__(self, refused: NotAuthorized, *, appended: tuple[int, ...] = (),
                 in_doubt: int = 0) -> None:
        BrokerError.__init__(self, str(refused))
        self.fatal, self.appended, self.in_doubt = True, appended, in_doubt
        self.operation, self.resource_type = refused.operation, refused.resource_type
        self.resource, self.code = refused.resource, refused.code


@dataclass(eq=False)
class Sending:
    """A write :meth:`LeaderWriter.start` began: its producer, its delivery reports, its
    records, how many were handed over, and what failed while handing them over."""

    producer: Any
    delivery: _Delivery
    records: list[tuple[str, bytes | None]]
    produced: int = 0
    failure: BaseException | None = None


# A producer id the partition's leader holds no state for (a new producer's, or one idle past
# the broker's producer.id.expiration.ms, 1 day by default) may start at any sequence
# (Kafka's ProducerStateManager, KIP-360): batches after a refused first batch of it land.
# So a producer's first write, and its first after this long without an acknowledged one,
# sends its first record alone and waits for it before the rest.
_SEQUENCE_IDLE_S = 3600.0
_FATAL_GRACE_S = 0.5  # a write whose producer failed fatally waits this long for its reports


def leader_producer_settings(kafka: Kafka, timeout: float) -> dict[str, Any]:
    """The settings of a term's producer (:class:`LeaderWriter`) for a write patience of
    ``timeout`` seconds: what the guarantees need of librdkafka (issue 42, finding 7).

    * ``enable.gapless.guarantee``: a batch the broker refuses for good (a batch over the
      topic's ``max.message.bytes``, a revoked ACL, a corrupt batch) is a fatal error of the
      producer. Without it librdkafka bumps the idempotent producer's epoch and renumbers the
      batches after it, which then land: a call of several records split across batches
      would land torn, its commit and later records without the refused ones, and fold rule
      8 applies the present records alone. The fatal error is the write's failure
      (:class:`WriteFailed`), and the producer is retired as after any failed write.
    * ``message.timeout.ms``: librdkafka gives up on a record within the write's patience
      (at most half the duplicate window, 30 s), so no record is retried after the caller was
      answered. A produce request's own timeout is the first record's remaining message
      timeout (librdkafka's CONFIGURATION.md, ``socket.timeout.ms``), and a request that
      times out takes its connection down (``socket.max.fails`` 1) within the 1 s of
      librdkafka's timeout scan.
    * ``socket.timeout.ms`` and ``request.timeout.ms`` (the broker's wait for the in-sync
      replicas) no longer than that patience either (60 s and 30 s by default): no request
      of the producer (metadata, producer id) is waited on longer than the write itself.

    What no client setting bounds: a request that left the client before it gave up (in a
    stalled network path, or read by a paused broker when it resumes) is appended when it
    arrives (``test_kafka_gapless.py``, README "The write path")."""
    patience_ms = max(10, min(int(timeout * 1000), DUPLICATE_WINDOW_MS // 2))
    return kafka.settings(_CLIENT_DEFAULTS, {
        "enable.idempotence": True,
        "enable.gapless.guarantee": True,
        "acks": "all",
        "linger.ms": 0,  # a write leaves at once (start() queues a group in one call)
        "message.timeout.ms": patience_ms,
        "socket.timeout.ms": patience_ms,
        "request.timeout.ms": patience_ms,
    })


class LeaderWriter:
    """A term's producer: idempotent, ``acks=all``, no transaction (README "The write
    path"). A write produces its records to the namespace's partition and waits for
    every acknowledgement: Kafka answers ``acks=all`` once the high watermark covers the
    record, so it is then readable by every reader (read_committed ones too, unless a
    transaction of another producer is open before it on the partition).

    Nothing is fenced at the broker: the fold refuses a stale term's records wherever
    they land, and a call of several records is atomic by its ``CallCommitted`` (fold
    rule 8). Order holds within a producer (idempotence keeps it through retries); a
    failed write purges what it still holds and retires the producer, so no record of
    it is re-sent by librdkafka behind the caller's back.
    """

    def __init__(self, bootstrap: str | Kafka, topic: str, partition: int,
                 timeout: float = 10.0) -> None:
        self.topic, self.partition = topic, partition
        self._timeout = timeout
        self._kafka = Kafka.of(bootstrap)
        self._acknowledged: float | None = None  # monotonic time of the last acknowledged write
        self._starting = threading.Lock()
        self._producer = _client(Producer, leader_producer_settings(self._kafka, timeout))
        try:
            _warm_up(self._producer, timeout, topic)
        except KafkaException as e:
            self.close()
            raise no_broker(bootstrap, timeout, e.args[0].str()) from e

    def write(self, records: list[tuple[str, bytes | None]]) -> list[LogRecord]:
        """Write ``(key, value)`` records in order; return them as the log holds them
        (offset, key, value, the stamp a reader sees). Raises :class:`WriteFailed`
        (:class:`WriteNotAuthorized` for a refusal of the authorizer)."""
        return self.wait(self.start(records))

    def start(self, records: list[tuple[str, bytes | None]]) -> Sending:
        """Hand ``records`` to the producer and send them at once, without waiting for the
        acknowledgement (:meth:`wait`); writes started one after another land in that
        order. Never raises: a failure to hand them over is :meth:`wait`'s to report.

        The producer's first write of several records (and its first after an hour without
        an acknowledged one) sends its first record alone and waits up to the timeout for
        its report before the rest: Kafka takes any first sequence from a producer id it
        holds no state for, so without it, batches after a refused first batch would land
        (a call torn, its commit without its first records); once the partition's leader
        holds the producer's sequence it refuses every batch after a gap, and the gap-less
        guarantee stops the producer (:func:`leader_producer_settings`)."""
        with self._starting:
            p, delivery = self._producer, _Delivery()
            sending = Sending(p, delivery, records)
            batch = [{"key": key.encode("utf-8"), "value": value} for key, value in records]
            try:
                first = 0
                if len(batch) > 1 and (self._acknowledged is None or
                                       time.monotonic() - self._acknowledged
                                       > _SEQUENCE_IDLE_S):
                    first = sending.produced = p.produce_batch(
                        self.topic, batch[:1], partition=self.partition, on_delivery=delivery)
                    deadline = time.monotonic() + self._timeout
                    # (a fatal error of the producer is raised from poll: below)
                    while first and delivery.reports < first \
                            and (left_s := deadline - time.monotonic()) > 0:
                        p.poll(min(left_s, 0.05))
                    if not first or delivery.reports < first or delivery.error is not None:
                        if not first:
                            sending.failure = BufferError("1 record(s) not queued (the "
                                                          "producer's queue is full)")
                        elif delivery.reports < first:  # wait() need not wait again
                            sending.failure = TimeoutError(
                                f"its first record, sent alone, not confirmed within "
                                f"{self._timeout:g} s")
                        return sending  # nothing more of it is sent; wait() says why
                    self._acknowledged = time.monotonic()
                # One call queues them all, so librdkafka's broker thread finds them together
                # and sends them in one produce request (linger.ms 0: a lone record leaves at
                # once; queued one produce() at a time, the first left alone).
                sending.produced = first + p.produce_batch(
                    self.topic, batch[first:], partition=self.partition, on_delivery=delivery)
                if sending.produced < len(records):
                    sending.failure = BufferError(f"{len(records) - sending.produced} "
                                                  "record(s) not queued (the producer's "
                                                  "queue is full)")
                p.poll(0)  # serves reports already in
            except (KafkaException, BufferError, SystemError, RuntimeError) as e:
                sending.failure = e  # RuntimeError: a producer another write retired
            return sending

    def wait(self, sending: Sending) -> list[LogRecord]:
        """Wait (up to the writer's timeout) for every acknowledgement of a write
        :meth:`start` began; the records as the log holds them, or :class:`WriteFailed`.
        A failure retires the producer the write used (unless another failure did)."""
        delivery, records = sending.delivery, sending.records
        produced, failure = sending.produced, sending.failure
        deadline = time.monotonic() + self._timeout
        try:
            # A fatal error of the producer (the gap-less guarantee's: nothing after it is
            # sent) is raised from poll, and fails the write at once.
            while failure is None and delivery.reports < produced \
                    and (left_s := deadline - time.monotonic()) > 0:
                sending.producer.poll(min(left_s, 0.05))
        except (KafkaException, SystemError, RuntimeError) as e:
            failure = e
        stopped = kafka_error_of(failure)
        if stopped is not None and stopped.fatal():
            # The fatal error comes before the reports of the batch that caused it (which
            # say why: a refusal of the authorizer, a batch too large): serve them briefly.
            grace = min(deadline, time.monotonic() + _FATAL_GRACE_S)
            with contextlib.suppress(KafkaException, SystemError, RuntimeError):
                while delivery.reports < produced and time.monotonic() < grace:
                    sending.producer.poll(0.02)
        else:
            stopped = None
        left = produced - delivery.reports
        if not failure and not left and delivery.error is None \
                and not delivery.missing_offsets and len(delivery.offsets) == len(records):
            written = delivery.in_order(records, self.partition)
            if written is not None:
                if sending.producer is self._producer:
                    self._acknowledged = time.monotonic()
                return written
            # Acknowledged, but the reports do not say which record went where: the log
            # does (the producer stays: nothing of it failed).
            raise WriteFailed(f"write to {self.topic}[{self.partition}]: the delivery "
                              "reports do not match the records written; read the log",
                              fatal=False, appended=tuple(delivery.offsets))
        if sending.producer is self._producer:
            self._retire()
        else:  # retired by another write's failure: serve what its purge reported
            with contextlib.suppress(KafkaException, SystemError, RuntimeError):
                sending.producer.poll(0)
        left = produced - delivery.reports
        in_doubt = produced - len(delivery.offsets) - delivery.refused
        # A fatal error of the producer says why its reports failed (then _PURGE_INFLIGHT),
        # unless a report says the broker's authorizer refused the write: the gap-less
        # guarantee makes that refusal fatal too, and the refusal is what the caller needs.
        refusal = delivery.error is not None and delivery.error.code() in _AUTHORIZATION
        if refusal:
            stopped = None
        error = stopped or delivery.error or kafka_error_of(failure)
        refused = not_authorized(self._kafka, error, "WRITE", "topic", self.topic)
        if refused is not None:
            raise WriteNotAuthorized(refused, appended=tuple(delivery.offsets),
                                     in_doubt=in_doubt) from None
        if stopped is not None:
            why = f"the producer stopped: {stopped.name()} ({stopped.str()})"
        elif delivery.missing_offsets and not left and delivery.error is None:
            why = (f"{delivery.missing_offsets} record(s) confirmed without their offset "
                   "(a retry the broker already had)")
        elif left:
            why = f"{left} record(s) not confirmed within {self._timeout:g} s"
        else:
            why = f"delivery failed: {error.name() if error else failure} " \
                  f"({error.str() if error else ''})"
        raise WriteFailed(f"write to {self.topic}[{self.partition}] failed: {why}",
                          appended=tuple(delivery.offsets), in_doubt=in_doubt) from failure

    def _retire(self) -> None:
        # Records it still holds are purged (never sent later), and the producer closed:
        # the next write makes a new one, whose sequence starts afresh. Writes started on it
        # meanwhile get their reports from the purge (never sent, or in doubt).
        producer, self._producer = self._producer, _Closed("leader producer")
        if isinstance(producer, _Closed):
            return
        with contextlib.suppress(KafkaException, SystemError):
            producer.purge()
            producer.poll(0)

        def close_later() -> None:
            time.sleep(self._timeout)  # writes started on it serve their purge reports first
            _destroy(producer)

        threading.Thread(target=close_later, daemon=True,
                         name=f"jobreg-close-{self.topic}-{self.partition}").start()

    @property
    def usable(self) -> bool:
        """False once a failed write retired the producer."""
        return not isinstance(self._producer, _Closed)

    def close(self) -> None:
        """Close the producer (what it still holds is purged: every write was answered)."""
        producer, self._producer = self._producer, _Closed("leader producer")
        if not isinstance(producer, _Closed):
            _destroy(producer)


def _destroy(producer: Producer) -> None:
    with warnings.catch_warnings(), contextlib.suppress(KafkaException):
        # a fenced producer cannot abort its open transaction; nothing to do about it
        warnings.simplefilter("ignore", RuntimeWarning)
        # Messages it still holds are purged first: close() would otherwise flush
        # them, waiting up to message.timeout.ms for a broker that may be gone. A
        # write whose records are purged was already reported unknown or failed;
        # its open transaction is aborted by the broker or the id's next producer.
        with contextlib.suppress(KafkaException):
            producer.purge()
        producer.close()  # it takes no timeout (the 1.0 it was given was ignored)


class PlainWriter:
    """An idempotent, non-transactional producer: for grants and for raw writes in tests."""

    def __init__(self, bootstrap: str | Kafka, timeout: float = 10.0,
                 topic: str | None = None) -> None:
        self._timeout = timeout
        self._bootstrap = str(bootstrap)
        self._kafka = Kafka.of(bootstrap)
        self._refusal: NotAuthorized | None = None
        self._producer = _client(Producer, self._kafka.settings(_CLIENT_DEFAULTS, {
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": int(timeout * 1000),
        }))
        try:
            _warm_up(self._producer, timeout, topic)
        except KafkaException as e:
            raise no_broker(bootstrap, timeout, e.args[0].str()) from e

    def write(self, topic: str, partition: int, records: list[tuple[bytes | None, bytes | None]],
              *, timestamp: int | None = None) -> list[int]:
        """Write raw ``(key, value)`` records; return their offsets, or raise BrokerError.
        ``timestamp``: the producer's stamp (ms) instead of its clock's; a ``LogAppendTime``
        topic replaces it with the broker's on Kafka (the embedded broker keeps it)."""
        if self._refusal is not None:  # its producer id was refused: it cannot write
            raise self._refusal
        delivery = _Delivery()
        stamp = {} if timestamp is None else {"timestamp": timestamp}
        try:
            for key, value in records:
                self._producer.produce(topic, value=value, key=key, partition=partition,
                                       on_delivery=delivery, **stamp)
        except (KafkaException, BufferError) as e:
            # A producer whose fatal error (its producer id refused) was not served yet
            # refuses with _FATAL; serving its events raises the error itself (once).
            raise self._refused(e, topic) or self._refused(self._served(), topic) or \
                BrokerError(f"could not send to {topic}[{partition}]: {e}") from e
        try:
            left = self._producer.flush(self._timeout)
        except (KafkaException, SystemError) as e:
            # A fatal error is raised from the flush serving the delivery reports, as the
            # cause of a SystemError when it lands in one.
            raise self._refused(e, topic) or BrokerError(
                f"write to {topic}[{partition}] at {self._bootstrap} failed: "
                f"{kafka_error_of(e) or e}") from e
        refused = self._refused(delivery.error, topic)
        if refused is None and delivery.error is not None \
                and delivery.error.code() == KafkaError._PURGE_QUEUE:
            refused = self._refused(self._served(), topic)  # purged by the fatal error
        if refused is not None:
            raise refused
        if delivery.missing_offsets:
            raise BrokerError(f"write to {topic}[{partition}] at {self._bootstrap}: "
                              f"{delivery.missing_offsets} record(s) confirmed without their "
                              "offset (a retry the broker already had): read the log")
        if left or delivery.error is not None or len(delivery.offsets) != len(records):
            raise BrokerError(f"write to {topic}[{partition}] at {self._bootstrap} not "
                              f"confirmed within {self._timeout:g} s: "
                              f"{delivery.error or 'no delivery report'}")
        return delivery.offsets

    def _refused(self, error: KafkaError | BaseException | None,
                  topic: str) -> NotAuthorized | None:
        refused = not_authorized(self._kafka, error, "WRITE", "topic", topic)
        err = error if isinstance(error, KafkaError) else kafka_error_of(error)
        if refused is not None and err is not None and err.fatal():
            self._refusal = refused  # confluent-kafka raises a fatal error only once
        return refused

    def _served(self) -> BaseException | None:
        """What serving the producer's events raises now (a fatal error not yet raised)."""
        try:
            self._producer.poll(0)
        except (KafkaException, SystemError) as e:
            return e
        return None

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has now (a metadata request on this producer's
        connection); :class:`BrokerError` if the broker does not say within the timeout."""
        try:
            found = self._producer.list_topics(topic, timeout=self._timeout).topics.get(topic)
        except KafkaException as e:
            raise BrokerError(f"no Kafka broker answered at {self._bootstrap} within "
                              f"{self._timeout:g} s ({e.args[0].str()})") from e
        if found is None or found.error is not None or not found.partitions:
            raise BrokerError(f"the broker at {self._bootstrap} did not describe topic "
                              f"{topic!r}")
        return len(found.partitions)

    def close(self) -> None:
        """Flush what is queued (up to a second) and close the producer."""
        producer, self._producer = self._producer, _Closed("producer")
        if not isinstance(producer, _Closed):
            # It takes no timeout (the 1.0 it was given was ignored). A producer whose id
            # was refused raises that fatal error again here: the write already said it.
            with contextlib.suppress(KafkaException):
                producer.close()


def write_raw(bootstrap: str | Kafka, topic: str, partition: int, key: bytes | str | None,
              value: bytes | None, timeout: float = 10.0, *,
              timestamp: int | None = None) -> int:
    """Write one record straight to the topic, bypassing every check: a zombie's write.

    For tests and drills. ``value`` may be any bytes (``registry.wire.encode``
    of an event, or garbage). ``timestamp``: the stamp a producer whose clock says so would
    send (ms); the embedded broker keeps it, Kafka replaces it on a ``LogAppendTime`` topic.
    Returns the record's offset.
    """
    if isinstance(key, str):
        key = key.encode("utf-8")
    if partition < 0:
        raise ConfigError(f"partition must be >= 0, not {partition}")
    writer = PlainWriter(bootstrap, timeout, topic)
    try:
        return writer.write(topic, partition, [(key, value)], timestamp=timestamp)[0]
    finally:
        writer.close()
