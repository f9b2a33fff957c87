"""Every metric jobreg exposes, in one place, through ``prometheus_client``.

A coordinator passes the :class:`~prometheus_client.CollectorRegistry` its metrics go to
(``Registry.connect(..., metrics=collector)``), or they go to
:data:`prometheus_client.REGISTRY`, the default one ``start_http_server`` serves. The metrics
of one collector registry are made once (:func:`metrics_for`), whatever the number of
:class:`~registry.client.Registry` objects that use it: each labels its series with its
``topic`` and ``namespace`` (:meth:`Metrics.client`), the audit job with its ``stream`` and
``topic`` (:meth:`Metrics.audit`). README "Metrics" describes each one; :data:`METRICS` is
that table as data (a test checks that the two and what is registered agree).

Cost on the write path: the series a write touches are looked up once per client
(:class:`ClientMetrics`), so a write pays a few increments and observations (measured with
``python -m registry.dev.bench_metrics``; README "Metrics").
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_http_server

from .errors import ConfigError

__all__ = [
    "METRICS",
    "AuditMetrics",
    "ClientMetrics",
    "MetricSpec",
    "Metrics",
    "MetricsServer",
    "check_port",
    "metrics_for",
    "serve",
]

_CLIENT = ("topic", "namespace")
_AUDIT = ("stream", "topic")

# Write latencies run from a millisecond (a write taken as read) to the registry's timeout.
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENESS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_CALLS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_RECORDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)


class MetricSpec(NamedTuple):
    """One metric: its full name (a counter's with ``_total``), Prometheus type, labels and
    help text (the README's table says the same)."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("jobreg_writes_total", "counter", (*_CLIENT, "outcome", "reason"),
               "Write calls of this process (leadership claims and every write of a term) by "
               "outcome (accepted, refused, fenced, lease_expired, unknown, broker_error, "
               "error) and reason (the fold's code for refused and fenced, the exception's "
               "class for error; else empty)."),
    MetricSpec("jobreg_write_duration_seconds", "histogram", _CLIENT,
               "Seconds a write call took, from the call to its answer (any outcome)."),
    MetricSpec("jobreg_write_group_calls", "histogram", _CLIENT,
               "Write calls per transaction the write path sent (calls made at once share one)."),
    MetricSpec("jobreg_write_group_records", "histogram", _CLIENT,
               "Records the write calls of one sent transaction carried (a call of several "
               "records with its CallCommitted; reassertions not counted)."),
    MetricSpec("jobreg_epoch", "gauge", _CLIENT,
               "The namespace's current fencing epoch, as this process last read the log."),
    MetricSpec("jobreg_leading", "gauge", _CLIENT,
               "Terms of this process that are the namespace's current, unrevoked term as "
               "last read (1: this process leads; 0: it does not)."),
    MetricSpec("jobreg_lease_renewals_total", "counter", (*_CLIENT, "result"),
               "Lease renewals of the built-in election by result (renewed, fenced, failed)."),
    MetricSpec("jobreg_lease_renewal_lateness_seconds", "histogram", _CLIENT,
               "How long after its due time (the previous renewal or the grant, plus "
               "lease / 4) a successful renewal was sent."),
    MetricSpec("jobreg_log_lag_records", "gauge", _CLIENT,
               "Offsets between the client's read position and the end of the namespace's "
               "partition, as the reader's last fetch reported that end (0 once a read "
               "reached it)."),
    MetricSpec("jobreg_records_refused_total", "counter", (*_CLIENT, "reason"),
               "Records the fold refused, by the fold's reason code (each record once)."),
    MetricSpec("jobreg_records_ignored_total", "counter", _CLIENT,
               "Records the fold kept without effect (a late checkpoint failure)."),
    MetricSpec("jobreg_records_quarantined_total", "counter", (*_CLIENT, "reason"),
               "Records the fold could not use (undecodable, tombstone, no_rule)."),
    MetricSpec("jobreg_snapshot_age_seconds", "gauge", _CLIENT,
               "Age of the snapshot this client last read or wrote: now minus the older of "
               "its newest record's log time and its writing."),
    MetricSpec("jobreg_audit_batch_duration_seconds", "histogram", _AUDIT,
               "Seconds the audit job took to fold and commit one batch."),
    MetricSpec("jobreg_audit_rows_written_total", "counter", _AUDIT,
               "Record rows the audit job wrote to the audit database."),
    MetricSpec("jobreg_audit_lag_records", "gauge", _AUDIT,
               "Offsets of the topic the audit database does not reflect yet, after the "
               "last batch (each partition's end minus the database's progress; a span with "
               "no record, such as a commit marker, counts 0)."),
    MetricSpec("jobreg_audit_freshness_seconds", "gauge", _AUDIT,
               "Seconds since the newest record the audit job materialized was written to "
               "the log (its log time); absent until a batch wrote a record."),
)
"""Every metric, as README "Metrics" lists them."""

_SPECS = {m.name: m for m in METRICS}


def _name(full: str) -> str:
    # prometheus_client adds a counter's _total itself.
    return full.removesuffix("_total") if _SPECS[full].type == "counter" else full


class Metrics:
    """The metrics of one collector registry (make with :func:`metrics_for`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

        def spec(full: str) -> tuple[str, str, tuple[str, ...]]:
            m = _SPECS[full]
            return _name(full), m.help, m.labels

        def counter(full: str) -> Counter:
            name, doc, labels = spec(full)
            return Counter(name, doc, labels, registry=registry)

        def gauge(full: str) -> Gauge:
            name, doc, labels = spec(full)
            return Gauge(name, doc, labels, registry=registry)

        def histogram(full: str, buckets: tuple[float, ...]) -> Histogram:
            name, doc, labels = spec(full)
            return Histogram(name, doc, labels, registry=registry, buckets=buckets)

        try:
            self.writes = counter("jobreg_writes_total")
            self.write_duration = histogram("jobreg_write_duration_seconds", _SECONDS)
            self.group_calls = histogram("jobreg_write_group_calls", _CALLS)
            self.group_records = histogram("jobreg_write_group_records", _RECORDS)
            self.epoch = gauge("jobreg_epoch")
            self.leading = gauge("jobreg_leading")
            self.renewals = counter("jobreg_lease_renewals_total")
            self.renewal_lateness = histogram("jobreg_lease_renewal_lateness_seconds",
                                              _LATENESS)
            self.log_lag = gauge("jobreg_log_lag_records")
            self.refused = counter("jobreg_records_refused_total")
            self.ignored = counter("jobreg_records_ignored_total")
            self.quarantined = counter("jobreg_records_quarantined_total")
            self.snapshot_age = gauge("jobreg_snapshot_age_seconds")
            self.audit_batch_duration = histogram("jobreg_audit_batch_duration_seconds",
                                                  _BATCH_SECONDS)
            self.audit_rows = counter("jobreg_audit_rows_written_total")
            self.audit_lag = gauge("jobreg_audit_lag_records")
            self.audit_freshness = gauge("jobreg_audit_freshness_seconds")
        except ValueError as e:  # a name the registry holds already, not ours
            raise ConfigError(f"cannot register jobreg's metrics: {e}") from None
        self._lock = threading.Lock()
        self._folded: dict[tuple[str, str], int] = {}

    def client(self, topic: str, namespace: str) -> ClientMetrics:
        """The series of one namespace of one topic."""
        return ClientMetrics(self, topic, namespace)

    def audit(self, stream: str, topic: str) -> AuditMetrics:
        """The series of one audit stream of one topic."""
        return AuditMetrics(self, stream, topic)

    def claim_folded(self, topic: str, namespace: str, before: int, after: int) -> int:
        """Where the counting of a fold step from offset ``before`` to ``after`` of a
        namespace starts: records at or below the returned offset were counted already, by
        this or another client of the process (two clients of one namespace count each
        record once). Records the namespace's clients fold later than ``after`` are theirs."""
        key = (topic, namespace)
        with self._lock:
            counted = self._folded.get(key, -1)
            if after > counted:
                self._folded[key] = after
            return max(counted, before)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, Metrics] = \
    weakref.WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry | None = None) -> Metrics:
    """The jobreg metrics of ``registry`` (default :data:`prometheus_client.REGISTRY`),
    registered there on first use and shared by every later caller.

    Raises :class:`~registry.errors.ConfigError` when ``registry`` is not a
    ``CollectorRegistry`` or already holds a metric of one of jobreg's names that jobreg
    did not register."""
    registry = REGISTRY if registry is None else registry
    if not isinstance(registry, CollectorRegistry):
        raise ConfigError(f"metrics go to a prometheus_client CollectorRegistry, not "
                          f"{type(registry).__name__}")
    with _BY_REGISTRY_LOCK:
        found = _BY_REGISTRY.get(registry)
        if found is None:
            found = _BY_REGISTRY[registry] = Metrics(registry)
        return found


class ClientMetrics:
    """The series of one namespace of one topic, looked up once (the write path pays only
    the increments and observations)."""

    def __init__(self, metrics: Metrics, topic: str, namespace: str) -> None:
        self.metrics = metrics
        self.topic = topic
        self.namespace = namespace
        labels = (topic, namespace)
        self._labels = labels
        self._accepted = metrics.writes.labels(*labels, "accepted", "")
        self.write_duration = metrics.write_duration.labels(*labels)
        self._group_calls = metrics.group_calls.labels(*labels)
        self._group_records = metrics.group_records.labels(*labels)
        self.epoch = metrics.epoch.labels(*labels)
        self.leading = metrics.leading.labels(*labels)
        self.renewal_lateness = metrics.renewal_lateness.labels(*labels)
        self.log_lag = metrics.log_lag.labels(*labels)
        self._ignored = metrics.ignored.labels(*labels)
        self._snapshot_stamp: float | None = None

    def write(self, outcome: str, reason: str, seconds: float) -> None:
        """One write call answered with ``outcome`` (``reason``) after ``seconds``."""
        if outcome == "accepted":
            self._accepted.inc()
        else:
            self.metrics.writes.labels(*self._labels, outcome, reason).inc()
        self.write_duration.observe(seconds)

    def observe_group(self, calls: int, records: int) -> None:
        """One transaction the write path sent: ``calls`` write calls carrying ``records``
        records in all. The write path calls it once per transaction it commits."""
        self._group_calls.observe(calls)
        self._group_records.observe(records)

    def renewal(self, result: str, lateness: float | None = None) -> None:
        """One lease renewal ended with ``result``; ``lateness``: seconds after its due time."""
        self.metrics.renewals.labels(*self._labels, result).inc()
        if lateness is not None:
            self.renewal_lateness.observe(max(0.0, lateness))

    def refused(self, reason: str, n: int = 1) -> None:
        """``n`` records refused by the fold for ``reason``."""
        self.metrics.refused.labels(*self._labels, reason).inc(n)

    def ignored(self, n: int = 1) -> None:
        """``n`` records kept without effect."""
        self._ignored.inc(n)

    def quarantined(self, reason: str, n: int = 1) -> None:
        """``n`` records quarantined for ``reason``."""
        self.metrics.quarantined.labels(*self._labels, reason).inc(n)

    def claim_folded(self, before: int, after: int) -> int:
        """:meth:`Metrics.claim_folded` for this namespace."""
        return self.metrics.claim_folded(self.topic, self.namespace, before, after)

    def snapshot(self, stamp_ms: int, clock: Callable[[], float] = time.time) -> None:
        """A snapshot stamped ``stamp_ms`` (ms since the Unix epoch) was read or written:
        :data:`jobreg_snapshot_age_seconds` is counted from it at every scrape."""
        first = self._snapshot_stamp is None
        self._snapshot_stamp = stamp_ms / 1000
        if first:
            gauge = self.metrics.snapshot_age.labels(*self._labels)
            gauge.set_function(lambda: clock() - (self._snapshot_stamp or 0.0))


class AuditMetrics:
    """The series of one audit stream of one topic."""

    def __init__(self, metrics: Metrics, stream: str, topic: str,
                 clock: Callable[[], float] = time.time) -> None:
        labels = (stream, topic)
        self.batch_duration = metrics.audit_batch_duration.labels(*labels)
        self.rows = metrics.audit_rows.labels(*labels)
        self.lag = metrics.audit_lag.labels(*labels)
        self._freshness = metrics.audit_freshness
        self._labels = labels
        self._clock = clock
        self.newest_ms: int | None = None
        """The log time of the newest record materialized so far (ms)."""

    def batch(self, seconds: float, rows: int, newest_ms: int | None) -> None:
        """One batch committed in ``seconds``: ``rows`` record rows, the newest of log time
        ``newest_ms`` (``None``: none stamped, or nothing new)."""
        self.batch_duration.observe(seconds)
        self.rows.inc(rows)
        if newest_ms is not None and (self.newest_ms is None or newest_ms > self.newest_ms):
            first = self.newest_ms is None
            self.newest_ms = newest_ms
            if first:
                self._freshness.labels(*self._labels).set_function(
                    lambda: self._clock() - (self.newest_ms or 0) / 1000)

    def behind(self, records: int) -> None:
        """The audit database does not reflect ``records`` records of the topic yet."""
        self.lag.set(max(0, records))


def check_port(value: object) -> int:
    """A TCP port to serve metrics on (1-65535), or :class:`~registry.errors.ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigError(f"a metrics port is a number from 1 to 65535, not {value!r}")
    return value


class MetricsServer:
    """``/metrics`` served on a daemon thread (:func:`serve`); :meth:`stop` ends it."""

    def __init__(self, server: Any, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.host: str = server.server_address[0]
        self.port: int = server.server_address[1]
        """The port listened on (the one chosen when 0 was asked for)."""

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve(port: int, host: str = "127.0.0.1",
          registry: CollectorRegistry | None = None) -> MetricsServer:
    """Serve ``registry``'s metrics (default :data:`prometheus_client.REGISTRY`) at
    ``http://host:port/metrics`` on a daemon thread, with ``prometheus_client``'s
    ``start_http_server`` (port 0: any free port, see :attr:`MetricsServer.port`).

    Raises :class:`~registry.errors.ConfigError` for a bad port or one that cannot be
    listened on (busy, or an address not this host's)."""
    if port != 0:
        check_port(port)
    try:
        server, thread = start_http_server(port, addr=host,
                                           registry=REGISTRY if registry is None else registry)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: "
                          f"{e.strerror or e}") from None
    return MetricsServer(server, thread)


def port_range(value: str) -> tuple[int, int]:
    """``"9464"`` or ``"9464-9470"`` (as Flink's own reporters take a port): the first and
    last port, or :class:`~registry.errors.ConfigError` in one line."""
    first, sep, last = value.strip().partition("-")
    try:
        lo, hi = int(first), int(last) if sep else int(first)
    except ValueError:
        raise ConfigError(f"a metrics port is a number or a range such as 9464-9470, "
                          f"not {value!r}") from None
    check_port(lo)
    check_port(hi)
    if hi < lo:
        raise ConfigError(f"the metrics port range {value!r} ends below its start")
    return lo, hi


def serve_first(ports: str, host: str = "127.0.0.1",
                registry: CollectorRegistry | None = None) -> MetricsServer:
    """:func:`serve` on the first port of ``ports`` (:func:`port_range`) that can be listened
    on: several processes of one host (two JobManagers' bridges) share one setting. Raises
    :class:`~registry.errors.ConfigError` if none can."""
    lo, hi = port_range(ports)
    last: ConfigError | None = None
    for port in range(lo, hi + 1):
        try:
            return serve(port, host, registry)
        except ConfigError as e:
            last = e
    assert last is not None
    raise ConfigError(f"cannot serve metrics on any port of {ports} at {host}: {last}")
