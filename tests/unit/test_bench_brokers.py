"""The benchmarks' broker choice (``registry/dev/brokers.py``) and how ``bench peers`` lays out
its figures with and without jobreg on Apache Kafka: pure logic, no broker started."""

from __future__ import annotations

import os
import re

import pytest

from registry.dev.bench_peers import (
    JOBREG_STORES,
    Concurrent,
    NamespaceLayout,
    Namespaces,
    PeersFigures,
    StoreFigures,
    _cpu_seconds,
    format_peers,
)
from registry.dev.brokers import FSYNC_EVERY_APPEND, BrokerChoice
from registry.errors import ConfigError
from registry.keys import partition_for


def test_a_choice_gives_its_topics_the_replicas_its_min_insync_needs() -> None:
    assert BrokerChoice.embedded().topic_config().replication_factor == 1
    assert BrokerChoice.kafka(1).topic_config().replication_factor == 1
    three = BrokerChoice.kafka(3)
    assert (three.replicas, three.min_insync) == (3, 2)
    assert three.topic_config(partitions=4).replication_factor == 3
    assert three.topic_config(partitions=4).partitions == 4
    assert BrokerChoice.kafka(5).replicas == 3  # as KafkaCluster's default.replication.factor


def test_each_choice_says_how_durable_an_acknowledged_write_is() -> None:
    assert "never fsynced" in BrokerChoice.embedded().durability()
    one = BrokerChoice.kafka(1).durability()
    assert "acks=all on one node" in one and "never fsync on the write path" in one
    assert "log.flush.interval.messages" in one and "Long.MAX_VALUE" in one
    three = BrokerChoice.kafka(3).durability()
    assert "every in-sync replica" in three and "fewer than 2 refuses" in three
    fsync = BrokerChoice.kafka(1, FSYNC_EVERY_APPEND)
    assert fsync.fsyncs and not BrokerChoice.kafka(1).fsyncs
    assert "fsyncs the partition's log after every append" in fsync.durability()
    assert "1 node" in BrokerChoice.kafka(1).describe()
    assert "3 nodes, replication 3, min.insync.replicas 2" in BrokerChoice.kafka(3).describe()


@pytest.mark.parametrize("bad", [
    lambda: BrokerChoice.kafka(0), lambda: BrokerChoice(-1), lambda: BrokerChoice(True),
    lambda: BrokerChoice(0, {"log.flush.interval.messages": "1"})])
def test_a_bad_choice_is_a_config_error(bad) -> None:
    with pytest.raises(ConfigError):
        bad()


def _store(name: str, scale: float) -> StoreFigures:
    f = StoreFigures(name, version="v", command="cmd", durability="d")
    f.submit_p50_ms, f.submit_p99_ms, f.single_jobs_per_s = 2 * scale, 4 * scale, 100 / scale
    f.concurrent = {8: Concurrent(8, 100, 800 / scale, 3 * scale, 6 * scale)}
    f.batch_jobs_per_s = 10_000 / scale
    f.failover_claim_s, f.failover_s = 0.01 * scale, 0.5 * scale
    if name in JOBREG_STORES:
        f.failover_cold_s = 0.6 * scale
        f.namespace_processes = Namespaces(4, 100, 400 / scale, 5 * scale, 9 * scale,
                                           processes=True, elapsed_s=0.25 * scale,
                                           client_cpu_s=0.25 * scale, broker_cpu_s=0.125,
                                           client_rdkafka_cpu_s=0.05, partitions=4)
        f.namespaces = Namespaces(4, 100, 200 / scale, 5 * scale, 9 * scale, elapsed_s=0.5,
                                  client_cpu_s=0.5, broker_cpu_s=None, partitions=4)
    return f


def _figures(*stores: str) -> PeersFigures:
    scales = {"jobreg": 1.0, "kafka": 2.0, "kafka3": 4.0, "kafka-fsync": 8.0, "etcd": 0.5,
              "zookeeper": 1.0}
    return PeersFigures(submits=10, jobs=100, calls=100, writers=(8,), namespaces=4,
                        stores={s: _store(s, scales[s]) for s in stores})


def _cells(out: str, row: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(row))
    return re.split(r"\s{2,}", line)


def test_without_kafka_the_table_keeps_its_columns_and_inline_ratios() -> None:
    out = format_peers(_figures("jobreg", "etcd", "zookeeper"))
    assert out.splitlines()[0].split()[:6] == ["measure", "jobreg", "etcd", "ZooKeeper",
                                               "jobreg/etcd", "jobreg/ZooKeeper"]
    assert _cells(out, "one writer (10 calls): p50")[1:6] == [
        "2.00 ms", "1.00 ms", "2.00 ms", "2.00x", "1.00x"]
    assert "kafka" not in out.splitlines()[0] and "ratios from this run" not in out


def test_with_kafka_every_store_has_a_column_and_each_denominator_a_ratio_table() -> None:
    out = format_peers(_figures(*JOBREG_STORES, "etcd", "zookeeper"))
    assert out.splitlines()[0].split() == ["measure", "jobreg", "kafka", "kafka3",
                                           "kafka-fsync", "etcd", "ZooKeeper", "target",
                                           "(jobreg)"]
    assert _cells(out, "one writer (10 calls): p50")[1:7] == [
        "2.00 ms", "4.00 ms", "8.00 ms", "16.00 ms", "1.00 ms", "2.00 ms"]
    blocks = out.split("\n\n")
    over = {b.splitlines()[0]: b for b in blocks if "ratios from this run" in b}
    assert list(over) == [
        "Each store's figure over etcd's (ratios from this run):",
        "Each store's figure over ZooKeeper's (ratios from this run):",
        "Each store's figure over jobreg on the embedded broker's (ratios from this run):"]
    etcd, zk, embedded = over.values()
    assert etcd.splitlines()[1].split() == ["measure", "jobreg/etcd", "kafka/etcd",
                                            "kafka3/etcd", "kafka-fsync/etcd"]
    assert _cells(etcd, "one writer (10 calls): p50")[1:] == ["2.00x", "4.00x", "8.00x",
                                                              "16.00x"]
    assert _cells(zk, "8 writers, one leader (100 calls): jobs/s")[1:] == [
        "1.00x", "0.50x", "0.25x", "0.12x"]
    assert embedded.splitlines()[1].split() == ["measure", "kafka/jobreg", "kafka3/jobreg",
                                                "kafka-fsync/jobreg"]
    # jobreg's own row (namespaces) has ratios over the embedded broker, none over a peer.
    assert _cells(embedded, "4 namespaces")[1:] == ["0.50x", "0.25x", "0.12x"]
    assert _cells(etcd, "4 namespaces")[1:] == ["-"] * 4
    assert "Like with like" in out and "kafka-fsync vs etcd and ZooKeeper" in out


def test_kafka_alone_has_ratios_over_the_peers_that_ran_only() -> None:
    out = format_peers(_figures("kafka", "etcd"))
    assert out.splitlines()[0].split()[:5] == ["measure", "jobreg", "kafka", "etcd",
                                               "ZooKeeper"]
    titles = [b.splitlines()[0] for b in out.split("\n\n") if "ratios from this run" in b]
    assert titles == ["Each store's figure over etcd's (ratios from this run):"]


def test_the_namespaces_rows_give_both_forms_their_ratio_to_one_writer_and_the_cores_busy(
        ) -> None:
    """Issue 35 part 5: a leader process per namespace (the target's form) and the one-process
    form, each with the aggregate, its ratio to the lone writer's rate of the same store, p99,
    and the cores the clients and the broker kept busy (unknown: "-")."""
    out = format_peers(_figures("jobreg", "kafka"))
    procs = "4 namespaces, a leader process each (100 calls) (***)"
    threads = "4 namespaces, leader threads of one process (100 calls) (***)"
    cells = _cells(out, f"{procs}: jobs/s")
    assert cells[1:3] == ["400 jobs/s", "200 jobs/s"]
    assert cells[-1] == ">= 8x one writer's (100 jobs/s) (missed)"
    assert _cells(out, f"{procs}: x one writer's jobs/s")[1:3] == ["4.0x", "4.0x"]
    assert _cells(out, f"{procs}: client CPU per call")[1:3] == ["2.50 ms", "5.00 ms"]
    assert _cells(out, f"{procs}: of it librdkafka's threads")[1:3] == ["0.50 ms", "0.50 ms"]
    assert _cells(out, f"{procs}: broker CPU per call")[1:3] == ["1.25 ms", "1.25 ms"]
    cores = os.cpu_count()
    # the machine's cores over the CPU a call costs: 100 calls / (0.25 + 0.125) s per core
    assert _cells(out, f"{procs}: CPU bound on {cores} cores")[1] == \
        f"{cores * 100 / 0.375:,.0f} jobs/s"
    assert _cells(out, f"{threads}: jobs/s")[1:3] == ["200 jobs/s", "100 jobs/s"]
    assert _cells(out, f"{threads}: x one writer's jobs/s")[1:3] == ["2.0x", "2.0x"]
    assert _cells(out, f"{threads}: broker CPU per call")[1:3] == ["-", "-"]  # not read
    assert _cells(out, f"{threads}: CPU bound on {cores} cores")[1:3] == ["-", "-"]
    prose = " ".join(out.split())
    assert "namespace i on partition i % 4 (one per partition" in prose
    figures = _figures("jobreg")
    figures.stores["jobreg"].namespace_processes.jobs_per_s = 800
    assert _cells(format_peers(figures), f"{procs}: jobs/s")[-1].endswith("(met)")


@pytest.mark.parametrize(("count", "partitions"), [(16, 16), (16, 8), (3, 3), (5, 2)])
def test_the_layout_puts_namespace_i_on_partition_i_mod_the_count(count, partitions) -> None:
    layout = NamespaceLayout.spread(count, partitions)
    assert len(set(layout.names)) == count and layout.partitions == partitions
    assert [partition_for(n, partitions) for n in layout.names] == \
        [i % partitions for i in range(count)]
    assert layout.shared == -(-count // partitions)


def test_cpu_seconds_read_proc_and_say_none_for_a_process_that_is_gone() -> None:
    used = _cpu_seconds([os.getpid()])
    assert used is None or used >= 0  # None: no /proc here
    assert _cpu_seconds([2**22 + 1]) is None  # above pid_max's default limit: no such process
    assert _cpu_seconds([]) is None


def test_a_leader_process_that_fails_is_one_line_naming_its_namespace() -> None:
    """No broker answers on port 1: every leader process says why it could not connect, and
    the bench raises one PeersError naming a namespace (no process is left behind)."""
    import subprocess

    from registry.dev.bench_peers import PeersError, _namespace_processes
    from registry.log import TopicConfig

    layout = NamespaceLayout.spread(2, 2)
    with pytest.raises(PeersError) as e:
        _namespace_processes("127.0.0.1:1", "t", TopicConfig(partitions=2), layout, 10,
                             lambda: [], timeout=1.0)
    said = str(e.value)
    assert said.startswith("namespaces, a leader process each: ns-")
    assert "BrokerError: no Kafka broker answered at 127.0.0.1:1" in said
    assert "\n" not in said  # a registry error is one line
    assert any(name in said for name in layout.names)
    ps = subprocess.run(["ps", "-eo", "ppid,args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if line.split()[0] == str(os.getpid())
                and "bench_leader" in line]
