"""Apache Kafka from Maven Central's jars (``registry/dev/kafka.py``, ``jobreg broker --kafka``):
it starts, answers, replicates, stops what it started by pid, and says in one line what is
missing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, ConfigResource

from registry import Registry
from registry.cli import main
from registry.dev.kafka import CACHE_ENV, KafkaCluster, kafka_classpath
from registry.errors import BrokerStartError, ConfigError
from registry.log import TopicConfig

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _gone(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A child of ours that exited but is not reaped yet is a zombie: gone all the same.
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_one_node_takes_a_claim_and_a_write_that_a_fresh_client_reads(kafka, topic) -> None:
    reg = Registry.connect(kafka.bootstrap, "ns", topic=topic)
    try:
        term = reg.claim_leadership("jm-1")
        term.submit("job-a", graph=b"g")
        fresh = Registry.connect(kafka.bootstrap, "ns", topic=topic)
        try:
            assert set(fresh.jobs()) == {"job-a"}
            assert fresh.leader().contender == "jm-1"
        finally:
            fresh.close()
    finally:
        reg.close()
    assert kafka.nodes[0].is_running()


def test_a_cluster_it_started_is_gone_after_stop() -> None:
    cluster = KafkaCluster(nodes=1).start()
    pid = cluster.nodes[0].pid
    directory = cluster.nodes[0].directory
    assert pid is not None and directory.exists()
    cluster.stop()
    assert _gone(pid) and not directory.exists()
    cluster.stop()  # idempotent


def test_three_nodes_replicate_with_two_in_sync_and_no_unclean_election(kafka3, topic) -> None:
    admin = AdminClient({"bootstrap.servers": kafka3.bootstrap, "log_level": 0})
    meta = admin.list_topics(timeout=10)
    assert sorted(meta.brokers) == [1, 2, 3]
    node = ConfigResource("broker", "1")
    configs = next(iter(admin.describe_configs([node]).values())).result(10)
    assert configs["min.insync.replicas"].value == "2"
    assert configs["unclean.leader.election.enable"].value == "false"
    assert configs["default.replication.factor"].value == "3"
    reg = Registry.connect(kafka3.bootstrap, "ns", topic=topic,
                           topic_config=TopicConfig(replication_factor=3))
    try:
        reg.claim_leadership("jm-1").submit("job-a", graph=b"g")
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions[reg.partition]
        assert sorted(partition.replicas) == [1, 2, 3]
        assert sorted(partition.isrs) == [1, 2, 3]
    finally:
        reg.close()


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="nodes must be a positive int"):
        KafkaCluster(nodes=0)
    with pytest.raises(ConfigError, match="2 ports given for 1 node"):
        KafkaCluster(nodes=1, ports=[1, 2])


def test_a_taken_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerStartError, match=f"port {port} on 127.0.0.1 is taken"):
            KafkaCluster(nodes=1, ports=[port]).start()
        result = CliRunner().invoke(main, ["broker", "--kafka", "--port", str(port)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: port {port} on 127.0.0.1 is taken: choose another or leave the ports to jobreg"]


def test_no_java_and_no_maven_are_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # neither java nor mvn
    with pytest.raises(BrokerStartError, match="^java not found on PATH: Apache Kafka needs "
                                               "Java 17 or newer"):
        KafkaCluster(nodes=1).start()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    with pytest.raises(BrokerStartError, match="^mvn not found on PATH: Apache Kafka needs "
                                               "Maven"):
        kafka_classpath()


def test_a_failed_format_is_one_line() -> None:
    bad = KafkaCluster(nodes=1, config={"process.roles": "nonsense"})
    with pytest.raises(BrokerStartError) as raised:
        bad.start()
    message = str(raised.value)
    assert message.startswith("formatting Kafka node 1 failed: ") and "\n" not in message
    assert not any(n.is_running() for n in bad.nodes)


def test_cli_options_that_need_kafka_are_refused() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["broker", "--nodes", "3"])
    assert result.exit_code == 2 and "--nodes needs --kafka" in result.output
    result = runner.invoke(main, ["broker", "--kafka", "--log-file", "x.log"])
    assert result.exit_code == 2 and "--log-file is for the embedded broker" in result.output


def test_the_nodes_die_with_the_process_that_started_them(tmp_path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from registry.dev.kafka import KafkaCluster
        cluster = KafkaCluster(nodes=1).start()
        print(cluster.nodes[0].pid, flush=True)
        time.sleep(600)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        os.kill(owner.pid, signal.SIGKILL)  # no atexit, no finally: only the kernel's signal
        owner.wait()
        assert _gone(pid), f"Kafka pid {pid} outlived its owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
