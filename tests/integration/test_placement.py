"""Issue 26, section 6: a namespace written under one partition count is never silently read
or claimed on another partition after the topic's count changed (README "Scaling the topic").

The embedded broker refuses CreatePartitions, so the topics here are created with more
partitions (8) than the namespace's records were written for (4): the records, written raw
on the partition four partitions give and recording that count in their grant, are what an
``kafka-topics --alter --partitions 8`` of a four-partition topic would leave.
"""

from __future__ import annotations

import subprocess
import sys
import zlib

import pytest

from registry import ConfigError, NamespaceMoved, Registry
from registry.events import InlineGraph, JobSubmitted, LeadershipGranted, new_event_id
from registry.forensics import Forensics
from registry.kafka_config import Kafka
from registry.keys import partition_for, record_key
from registry.log import LogReader, TopicConfig, ensure_topic, write_raw
from registry.placement import former_partitions
from registry.wire import default_codec

JOBREG = [sys.executable, "-m", "registry.cli"]


def _named(moves: bool, start: int = 0) -> str:
    """A namespace whose partition under 4 partitions differs from (or equals) its
    partition under 8."""
    i = start
    while True:
        ns = f"ns{i}"
        if (partition_for(ns, 4) != partition_for(ns, 8)) == moves:
            return ns
        i += 1


MOVED = _named(True)
STAYED = _named(False)


def _write_under(bootstrap: str, topic: str, ns: str, partitions: int, *, job: str = "job-a",
                 epoch: int = 1, on: int | None = None) -> int:
    """Write a grant (recording ``partitions``) and a submit of ``ns`` where ``partitions``
    partitions map it (or on partition ``on``), as a client of that count would have."""
    codec = default_codec()
    partition = partition_for(ns, partitions) if on is None else on
    grant = LeadershipGranted(event_id=new_event_id(), namespace=ns, epoch=epoch,
                              writer="jm-old", created_at=1, prev_epoch=epoch - 1,
                              partitions=partitions, partition=partition)
    submit = JobSubmitted(event_id=new_event_id(), namespace=ns, epoch=epoch, writer="jm-old",
                          created_at=1, job_id=job, graph=InlineGraph(b"g"))
    for event in (grant, submit):
        write_raw(bootstrap, topic, partition, record_key(event), codec.encode(event))
    return partition


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOBREG, *args], capture_output=True, text=True, timeout=120)


# -- unit: which partitions are looked at ------------------------------------------------------


def test_former_partitions_are_read_only_when_a_first_grant_recorded_another_count() -> None:
    assert former_partitions(MOVED, 8, []) == {}                  # no grant anywhere
    assert former_partitions(MOVED, 8, [8, 8, 8]) == {}           # never resized
    crc = zlib.crc32(MOVED.encode())
    # resized from 4: every count from 4 to 7 is a count the topic may have had
    expected: dict[int, list[int]] = {}
    for n in range(4, 8):
        if crc % n != crc % 8:
            expected.setdefault(crc % n, []).append(n)
    assert former_partitions(MOVED, 8, [4, 8]) == expected
    assert partition_for(MOVED, 4) in former_partitions(MOVED, 8, [4])
    # a first grant written before counts were recorded: every smaller count
    assert set(former_partitions(MOVED, 8, [0])) == {
        crc % n for n in range(1, 8)} - {crc % 8}
    # a count above the topic's (records copied from a larger topic) is a candidate too
    big = next(n for n in range(9, 64) if crc % n < 8 and crc % n != crc % 8)
    assert crc % big in former_partitions(MOVED, 8, [8, big])
    # mapped with 8 on a topic of 12 (partitions added, clients pinned to 8): a namespace a
    # client of 12 wrote on partition 8 or above is found there
    wide = next(f"x{i}" for i in range(1000) if zlib.crc32(f"x{i}".encode()) % 12 >= 8)
    twelve = zlib.crc32(wide.encode()) % 12
    assert twelve in former_partitions(wide, 8, [8, 12], 12)
    assert twelve not in former_partitions(wide, 8, [8, 12])
    # where the old count put it is where it is now: not a candidate
    assert partition_for(STAYED, 4) not in former_partitions(STAYED, 8, [4])


# -- the paths ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_namespace_written_under_fewer_partitions_is_refused_on_every_path(
        broker, topic, tmp_path) -> None:
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    old = _write_under(broker.bootstrap, topic, MOVED, 4)
    now = partition_for(MOVED, 8)
    assert old != now
    said = (f"namespace {MOVED!r} was written under 4 partitions of topic {topic!r} "
            f"(partition {old}); the topic now has 8, which maps it to partition {now}")

    # the client: connect refuses (no epoch 1 on the new partition, no empty job list)
    with pytest.raises(NamespaceMoved) as caught:
        Registry.connect(broker.bootstrap, MOVED, topic=topic, blob_store=tmp_path)
    assert str(caught.value).startswith(said)
    assert "partitions=4" in str(caught.value) and "\n" not in str(caught.value)
    assert (caught.value.found_partition, caught.value.written_under) == (old, 4)
    # forensics
    with pytest.raises(NamespaceMoved, match="was written under 4 partitions"):
        Forensics.from_broker(Kafka(broker.bootstrap), topic, MOVED, 10.0)
    # the CLI: one line, exit 1, for a read command and for the dump
    for command in (["jobs"], ["state", "--offset", "5"], ["dump", str(tmp_path / "d.avro")]):
        result = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "--namespace", MOVED,
                      *command)
        assert result.returncode == 1, result
        assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "d.avro").exists()
    # the audit: the run folds the namespace where its records are; the check maps it and
    # refuses
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    ran = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "audit", "run", "--plain",
               "--once", "--db", db)
    assert ran.returncode == 0, ran.stderr
    checked = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "audit", "check",
                   "--db", db)
    assert checked.returncode == 1 and said in checked.stderr, checked
    assert checked.stderr.count("\n") == 1

    # what the refusal says to do works: map with the count it was written under
    reg = Registry.connect(broker.bootstrap, MOVED, topic=topic, blob_store=tmp_path,
                           partitions=4)
    try:
        assert reg.partition == old and set(reg.jobs()) == {"job-a"}
        term = reg.claim_leadership("jm-new")
        assert term.epoch == 2  # the namespace's own history goes on, fenced as ever
    finally:
        reg.close()
    pinned = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "--namespace", MOVED,
                  "--partitions", "4", "--json", "leader")
    assert pinned.returncode == 0 and '"epoch": 2' in pinned.stdout, pinned
    checked = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "--partitions", "4",
                   "audit", "check", "--db", db)
    assert checked.returncode in (0, 1) and "written under" not in checked.stderr, checked
    with pytest.raises(ConfigError, match="cannot map namespaces with 9 partitions"):
        Registry.connect(broker.bootstrap, MOVED, topic=topic, partitions=9)


@pytest.mark.integration
def test_a_namespace_the_new_count_does_not_move_goes_on(broker, topic, tmp_path) -> None:
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    _write_under(broker.bootstrap, topic, MOVED, 4)  # the topic was resized: it shows
    here = _write_under(broker.bootstrap, topic, STAYED, 4, job="job-b")
    assert here == partition_for(STAYED, 8)
    reg = Registry.connect(broker.bootstrap, STAYED, topic=topic, blob_store=tmp_path)
    try:
        assert set(reg.jobs()) == {"job-b"}
        assert reg.claim_leadership("jm-new").epoch == 2
    finally:
        reg.close()
    assert Forensics.from_broker(Kafka(broker.bootstrap), topic, STAYED, 10.0
                                 ).state_at(offset=100).epoch == 2


def _grants(bootstrap: str, topic: str, ns: str, partition: int) -> list[tuple[int, int]]:
    reader = LogReader(bootstrap, topic, partition)
    try:
        return [(g.partitions, g.partition) for g in (
            default_codec().decode(r.value) for b in reader.read_to_end(10.0) for r in b
            if r.key and r.key.startswith(f"{ns}/term/".encode()))]
    finally:
        reader.close()


@pytest.mark.integration
def test_a_grant_records_the_count_and_the_partition_it_was_written_under(
        connect, broker, topic) -> None:
    reg = connect("prod")
    reg.claim_leadership("jm-1")
    reg.claim_leadership("jm-2")
    assert _grants(broker.bootstrap, topic, "prod", reg.partition) == \
        [(reg.partitions, reg.partition)] * 2


@pytest.mark.integration
def test_a_new_namespace_is_born_only_under_the_count_the_topic_was_first_written_under(
        broker, topic, tmp_path) -> None:
    """After partitions were added, a namespace born under the new count on a partition
    whose first grant recorded the old one would leave nothing a client of the old count
    (which the refusal tells people to be) looks for: it could be started twice. Its birth
    is refused; under the old count it is born, and reads find it with either count once it
    has records where that count puts it."""
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    _write_under(broker.bootstrap, topic, MOVED, 4)  # a resized topic
    fresh = _named(True, start=1000)
    reg = Registry.connect(broker.bootstrap, fresh, topic=topic, blob_store=tmp_path)
    try:
        assert reg.epoch() == 0  # reading a namespace that has no records anywhere is fine
        with pytest.raises(ConfigError) as caught:
            reg.claim_leadership("jm-1")
        assert str(caught.value).startswith(
            f"namespace {fresh!r} has no records yet, and the namespaces of topic {topic!r} "
            f"were first written under 4 partitions, not the 8 it would be mapped with")
        assert "partitions=4" in str(caught.value)
        assert reg.sync().epoch == 0  # nothing was written
    finally:
        reg.close()
    pinned = Registry.connect(broker.bootstrap, fresh, topic=topic, blob_store=tmp_path,
                              partitions=4)
    try:
        assert pinned.claim_leadership("jm-1").epoch == 1
    finally:
        pinned.close()
    assert _grants(broker.bootstrap, topic, fresh, partition_for(fresh, 4)) == \
        [(4, partition_for(fresh, 4))]
    with pytest.raises(NamespaceMoved, match="was written under 4 partitions"):
        Registry.connect(broker.bootstrap, fresh, topic=topic, blob_store=tmp_path)


@pytest.mark.integration
def test_a_claim_by_a_client_that_mapped_with_an_older_count_is_refused(
        broker, topic, tmp_path) -> None:
    # A client connected when the topic had 4 partitions; then partitions were added.
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    reg = Registry(broker.bootstrap, MOVED, topic=topic, partitions=4, blob_store=tmp_path)
    try:
        with pytest.raises(ConfigError, match=r"has 8 partitions now, not the 4 this client "
                                              r"mapped namespace"):
            reg.claim_leadership("jm-1")
        assert reg.sync().epoch == 0  # nothing was written
    finally:
        reg.close()


@pytest.mark.integration
def test_the_audit_refuses_a_namespace_found_on_two_partitions(broker, topic, tmp_path) -> None:
    # What a client without the check left: a second history on the new partition.
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    old = _write_under(broker.bootstrap, topic, MOVED, 4)
    new = _write_under(broker.bootstrap, topic, MOVED, 8, job="job-b")
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    ran = _cli("--bootstrap", broker.bootstrap, "--topic", topic, "audit", "run", "--plain",
               "--once", "--db", db)
    assert ran.returncode == 1, ran
    assert (f"namespace {MOVED!r} has records on partitions {min(old, new)} and "
            f"{max(old, new)} of topic {topic!r}") in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.integration
def test_a_grant_written_before_counts_were_recorded_is_found_and_still_folds(
        broker, topic, tmp_path) -> None:
    """Grants of schema version 1 record no count: the partition's first grant says 0, so
    every smaller count is a candidate; the namespace is found where one of them put it, and
    with that count it folds as it always did."""
    from support.model import encode_with

    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    old = partition_for(MOVED, 4)
    grant = LeadershipGranted(event_id=new_event_id(), namespace=MOVED, epoch=1, writer="jm-old",
                              created_at=1, prev_epoch=0)
    v1 = next(e.id for e in default_codec().catalog.entries()
              if e.type == "LeadershipGranted" and e.version == 1)
    write_raw(broker.bootstrap, topic, old, record_key(grant), encode_with(grant, v1))
    with pytest.raises(NamespaceMoved) as caught:
        Registry.connect(broker.bootstrap, MOVED, topic=topic, blob_store=tmp_path)
    message = str(caught.value)
    assert f"was written on partition {old} of topic {topic!r}, when the topic had " in message
    assert caught.value.written_under is None and "4" in message.split("partitions=")[1]
    reg = Registry.connect(broker.bootstrap, MOVED, topic=topic, blob_store=tmp_path,
                           partitions=4)
    try:
        assert reg.leader().contender == "jm-old"
    finally:
        reg.close()


@pytest.mark.spark
@pytest.mark.integration
def test_the_audit_job_on_spark_refuses_a_namespace_found_on_two_partitions(
        broker, topic, tmp_path, spark) -> None:
    """The same check on the executors: Spark's tasks commit through the same
    PartitionWriter as --plain."""
    from consumers.audit_job import run_audit
    from registry.audit.db import AuditError, migrate

    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    old = _write_under(broker.bootstrap, topic, MOVED, 4)
    new = _write_under(broker.bootstrap, topic, MOVED, 8, job="job-b")
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    with pytest.raises(AuditError) as caught:
        run_audit(url, broker.bootstrap, topic, spark=spark, mode="once")
    assert (f"namespace {MOVED!r} has records on partitions {min(old, new)} and "
            f"{max(old, new)} of topic {topic!r}") in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.integration
def test_an_election_raises_the_refusal_instead_of_retrying_it_for_ever(
        broker, topic, tmp_path) -> None:
    ensure_topic(broker.bootstrap, topic, TopicConfig(partitions=8))
    reg = Registry(broker.bootstrap, MOVED, topic=topic, partitions=4, blob_store=tmp_path,
                   timeout=1.0)
    try:
        with pytest.raises(ConfigError, match="partitions were added"):
            reg.elect("jm-1", lease=2.0).acquire(timeout=60)
    finally:
        reg.close()
