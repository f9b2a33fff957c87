"""The metrics (README "Metrics"), scraped over real HTTP after real writes to the embedded
broker, checked against what happened."""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from registry.client import Registry
from registry.election import Election
from registry.errors import ConfigError, Fenced, WriteRejected
from registry.log import write_raw
from registry.metrics import MetricsServer, serve

pytestmark = pytest.mark.integration


class Scrape:
    """One scrape of ``/metrics``, parsed with prometheus_client's own parser."""

    def __init__(self, url: str) -> None:
        with urllib.request.urlopen(url, timeout=10) as response:
            self.text = response.read().decode()
        self.types: dict[str, str] = {}
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(self.text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` with exactly ``labels``; ``None`` if there is none."""
        return self.samples.get((name, frozenset(labels.items())))

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """``name``'s samples matching ``labels``, keyed by the value of ``label``."""
        out: dict[str, float] = {}
        for (sample, pairs), value in self.samples.items():
            d = dict(pairs)
            if sample == name and all(d.get(k) == v for k, v in labels.items()) and value:
                out[d[label]] = value
        return out


@pytest.fixture
def served() -> Iterator[tuple[CollectorRegistry, MetricsServer]]:
    """A collector registry of the test's own, served on a free loopback port."""
    collector = CollectorRegistry()
    server = serve(0, "127.0.0.1", collector)
    try:
        yield collector, server
    finally:
        server.stop()


def test_a_scrape_after_real_writes_shows_what_happened(
        connect: Callable[..., Registry], tmp_path: Path,
        served: tuple[CollectorRegistry, MetricsServer]) -> None:
    """Writes accepted, refused and fenced, a quarantined and an ignored record, a newer
    claim: every figure scraped from /metrics equals what the log and the calls say."""
    collector, server = served
    url = f"http://127.0.0.1:{server.port}/metrics"
    reg = connect("metrics", metrics=collector)
    ns = {"topic": reg.topic, "namespace": "metrics"}
    term = reg.claim_leadership("jm-1")
    term.submit("job-1", b"graph")
    with pytest.raises(WriteRejected) as refused:
        term.submit("job-1", b"graph")  # a known id: the fold refuses it
    receipt = term.checkpoint_failed("job-1", 7, "declined")  # never triggered: ignored
    assert receipt.ignored
    write_raw(reg.bootstrap, reg.topic, reg.partition, "metrics/job/junk", b"not avro")
    reg.sync()

    first = Scrape(url)
    assert first.value("jobreg_epoch", **ns) == 1
    assert first.value("jobreg_leading", **ns) == 1
    assert first.value("jobreg_log_lag_records", **ns) == 0  # synced: at the end

    # A newer term (another client, another process's metrics) fences the first.
    other = connect("metrics", metrics=CollectorRegistry())
    other.claim_leadership("jm-2")
    with pytest.raises(Fenced) as fenced:
        term.submit("job-2", b"graph")
    reg.sync()
    reg.write_snapshot(tmp_path / "snap")
    # A second client of the namespace on the same collector registry reads the whole log
    # again: nothing is counted twice.
    connect("metrics", metrics=collector).sync()

    after = Scrape(url)
    assert after.value("jobreg_epoch", **ns) == 2
    assert after.value("jobreg_leading", **ns) == 0
    writes = after.by("jobreg_writes_total", "outcome", **ns)
    # the claim, the first submit and the checkpoint failure were accepted
    assert writes == {"accepted": 3, "refused": 1, "fenced": 1}
    assert after.value("jobreg_writes_total", outcome="refused", reason=refused.value.reason,
                       **ns) == 1
    assert after.value("jobreg_writes_total", outcome="fenced", reason=fenced.value.reason,
                       **ns) == 1
    assert after.value("jobreg_write_duration_seconds_count", **ns) == 5
    # One transaction per call that reached the fold (one call at a time here: groups of one).
    decided = 3 + (fenced.value.offset is not None)  # claims are not term transactions
    assert after.value("jobreg_write_group_calls_count", **ns) == decided
    assert after.value("jobreg_write_group_calls_sum", **ns) == decided
    assert after.value("jobreg_write_group_records_sum", **ns) == decided

    image = reg.sync()
    assert after.by("jobreg_records_refused_total", "reason", **ns) == dict(
        collections.Counter(d.reason for d in image.rejected))
    assert after.value("jobreg_records_ignored_total", **ns) == len(image.ignored) == 1
    assert after.by("jobreg_records_quarantined_total", "reason", **ns) == {"undecodable": 1}
    assert len(image.quarantined) == 1
    age = after.value("jobreg_snapshot_age_seconds", **ns)
    assert age is not None and age >= 0
    assert after.types["jobreg_writes"] == "counter"
    assert after.types["jobreg_write_duration_seconds"] == "histogram"


def test_two_registries_share_a_collector_registry(connect: Callable[..., Registry]) -> None:
    """Two clients on one collector registry: one set of metrics, a series each namespace."""
    collector = CollectorRegistry()
    a = connect("share-a", metrics=collector)
    b = connect("share-b", metrics=collector)
    a.claim_leadership("jm").submit("j", b"g")
    b.claim_leadership("jm")
    epochs = {s.labels["namespace"]: s.value
              for f in collector.collect() if f.name == "jobreg_epoch" for s in f.samples}
    assert epochs == {"share-a": 1, "share-b": 1}


def test_lease_renewals_and_their_lateness_are_counted(
        connect: Callable[..., Registry]) -> None:
    """Each renewal the log holds is counted as renewed and its lateness observed once, on
    the election's own clock: here 0 until the term is granted and 3.5 after, so the first
    renewal (due at 0 + lease / 4 = 1) is 2.5 s late and the later ones, due 1 s after it
    on a clock that stands still, are not late."""
    collector = CollectorRegistry()
    reg = connect("lease", metrics=collector, timeout=2.0)
    granted: list[Election] = []
    election = reg.elect("jm-1", lease=4.0,
                         clock=lambda: 3.5 if granted and granted[0].term else 0.0)
    granted.append(election)
    election.acquire()
    deadline = time.monotonic() + 120

    def renewals() -> int:
        term = reg.sync().term
        return 0 if term is None else term.renewals

    while renewals() < 2:
        assert time.monotonic() < deadline, "no renewals"
        time.sleep(0.2)
    election.cancel()
    renewed = renewals()
    labels = {"topic": reg.topic, "namespace": "lease"}
    assert collector.get_sample_value("jobreg_lease_renewals_total",
                                      {**labels, "result": "renewed"}) == renewed
    assert collector.get_sample_value("jobreg_lease_renewal_lateness_seconds_count",
                                      labels) == renewed
    assert collector.get_sample_value("jobreg_lease_renewal_lateness_seconds_sum",
                                      labels) == 2.5


def test_serving_on_a_busy_port_is_one_line() -> None:
    """A port that is taken: a ConfigError saying so, nothing served."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            serve(port)
    with pytest.raises(ConfigError, match="1 to 65535"):
        serve(70000)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def test_audit_run_follow_serves_its_metrics(connect: Callable[..., Registry],
                                             tmp_path: Path) -> None:
    """`audit run --follow --metrics-port` serves /metrics: rows written, batches, lag and
    freshness as the run and the database say."""
    from registry.audit.db import query

    reg = connect("follow-metrics")
    reg.claim_leadership("jm-1").submit("job-1", b"g")
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    port = _free_port()
    base = [sys.executable, "-m", "registry.cli", "--bootstrap", reg.bootstrap, "--topic",
            reg.topic, "audit", "run"]
    proc = subprocess.Popen([*base, "--follow", "--plain", "--db", db, "--metrics-port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    labels = {"stream": "audit", "topic": reg.topic}
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no rows written"
            try:
                scrape = Scrape(f"http://127.0.0.1:{port}/metrics")
                if scrape.value("jobreg_audit_rows_written_total", **labels) == 2:
                    break
            except (urllib.error.URLError, ConnectionError):  # not serving yet
                pass
            time.sleep(0.2)
        newest = query(db, "SELECT max(log_time) FROM audit_records")[1][0][0]
        before = time.time()
        scrape = Scrape(f"http://127.0.0.1:{port}/metrics")
        after = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "wrote 2 records in 1 batches" in out
    assert scrape.value("jobreg_audit_rows_written_total", **labels) == 2
    assert scrape.value("jobreg_audit_batch_duration_seconds_count", **labels) == 1
    assert scrape.value("jobreg_audit_lag_records", **labels) == 0
    freshness = scrape.value("jobreg_audit_freshness_seconds", **labels)
    assert freshness is not None
    assert before - newest / 1000 <= freshness <= after - newest / 1000

    # Bad ports: one line each, nothing run.
    for args, said in ((["--metrics-port", "0"], "0 is not in the range"),
                       (["--once", "--metrics-port", str(port)], "--follow")):
        bad = subprocess.run([*base, "--plain", "--db", db, *args], capture_output=True,
                             text=True, timeout=120)
        assert bad.returncode != 0 and said in bad.stderr and "Traceback" not in bad.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = taken.getsockname()[1]
        bad = subprocess.run([*base, "--follow", "--plain", "--db", db, "--metrics-port",
                              str(busy)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert f"cannot serve metrics on 127.0.0.1:{busy}" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.spark
def test_the_spark_audit_job_reports_its_batches(spark: Any, connect: Callable[..., Registry],
                                                 db_url: str) -> None:
    """The Spark job (on PostgreSQL the tasks commit on the executors and send their newest
    log time back in their summaries): rows and batches as the run says, lag 0 once it
    has read everything, freshness counted from the newest record it wrote."""
    from support.pg import query_as_reader as query

    from consumers.audit_job import run_audit

    reg = connect("spark-metrics")
    term = reg.claim_leadership("jm-1")
    for i in range(6):
        term.submit(f"job-{i}", b"g")
    collector = CollectorRegistry()
    run = run_audit(db_url, reg.bootstrap, reg.topic, spark=spark, max_offsets_per_trigger=3,
                    metrics=collector)
    after = time.time()
    labels = {"stream": "audit", "topic": reg.topic}
    assert run.records == 7 and run.batches >= 2
    assert collector.get_sample_value("jobreg_audit_rows_written_total", labels) == 7
    assert collector.get_sample_value("jobreg_audit_batch_duration_seconds_count",
                                      labels) == run.batches
    assert collector.get_sample_value("jobreg_audit_lag_records", labels) == 0
    newest = query(db_url, "SELECT max(log_time) FROM audit_records")[1][0][0]
    freshness = collector.get_sample_value("jobreg_audit_freshness_seconds", labels)
    assert freshness is not None
    assert after - newest / 1000 <= freshness <= time.time() - newest / 1000


def test_concurrent_writes_are_counted_once_each_whatever_their_groups(
        connect: Callable[..., Registry]) -> None:
    """Calls made at once on one term (which group commit may put in one transaction): each
    is counted once as a write and once in the group histograms' sums, whatever the groups."""
    import threading

    collector = CollectorRegistry()
    reg = connect("groups", metrics=collector)
    term = reg.claim_leadership("jm-1")
    errors: list[BaseException] = []

    def submit(thread: int) -> None:
        try:
            for i in range(5):
                term.submit_many([(f"job-{thread}-{i}-a", b"g"), (f"job-{thread}-{i}-b", b"g")])
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    labels = {"topic": reg.topic, "namespace": "groups"}

    def value(name: str, **more: str) -> float | None:
        return collector.get_sample_value(name, {**labels, **more})

    assert value("jobreg_writes_total", outcome="accepted", reason="") == 1 + 40
    assert value("jobreg_write_duration_seconds_count") == 1 + 40
    assert value("jobreg_write_group_calls_sum") == 40
    assert value("jobreg_write_group_records_sum") == 40 * 3  # two records and their commit
    groups = value("jobreg_write_group_calls_count")
    assert groups is not None and 1 <= groups <= 40
    assert value("jobreg_write_group_records_count") == groups
