"""``jobreg bench peers`` through its real entry point: a tiny run when etcd and ZooKeeper are
installed, and the one-line skip message (package and install command) when they are not.

The benchmark's figures are not tested (no test times anything); these check that it runs the
three stores, prints them side by side with the ratios and the durability note, stops its
servers and says plainly what it skipped; and that jobreg on Apache Kafka gets its column, its
ratios and its durability line in the same run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from registry.dev.bench_peers import missing_peers

JOBREG = [sys.executable, "-m", "registry.cli"]
MISSING = missing_peers()

needs_peers = pytest.mark.skipif(
    bool(MISSING), reason="; ".join(MISSING.values()) or "etcd and ZooKeeper are installed")


def _children_of(pid: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if line.split()[1] == str(pid)]


@pytest.mark.integration
@pytest.mark.embedded_only("`jobreg bench peers` starts its own embedded broker for jobreg's side")
@needs_peers
def test_a_tiny_run_prints_the_three_stores_side_by_side(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([*JOBREG, "bench", "peers", "--submits", "20", "--jobs", "200",
                             "--calls", "40", "--writers", "2,4", "--namespaces", "3",
                             "--only", "jobreg,etcd,zookeeper"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    header = out.splitlines()[0].split()
    assert header[:6] == ["measure", "jobreg", "etcd", "ZooKeeper", "jobreg/etcd",
                          "jobreg/ZooKeeper"]
    rows = ["one writer (20 calls): p50", "one writer (20 calls): p99",
            "one writer (20 calls): jobs/s", "native batch of 1,000 jobs, one atomic call",
            "failover, 200 live jobs, hot standby: claim -> all taken over"]
    rows += [f"{w} writers, one leader (40 calls): {what}" for w in (2, 4)
             for what in ("jobs/s", "p50", "p99")]
    for row in rows:  # the same workload on every store
        line = next(line for line in out.splitlines() if line.startswith(row))
        cells = re.split(r"\s{2,}", line)
        assert "-" not in cells[1:4], line  # a figure for every store
        assert cells[4].endswith("x") and cells[5].endswith("x"), line  # both ratios
    for form in ("a leader process each", "leader threads of one process"):
        for what in ("jobs/s", "p99"):  # jobreg's own rows: a figure, no peer's
            line = next(line for line in out.splitlines()
                        if line.startswith(f"3 namespaces, {form} (40 calls)")
                        and line.split(": ")[1].startswith(what))
            cells = re.split(r"\s{2,}", line)
            assert cells[1] != "-" and cells[2:4] == ["-", "-"], line
    prose = " ".join(out.split())  # the notes are wrapped at 100 columns
    assert "never fsynced" in prose and "fsyncs its WAL" in prose and "forceSync=yes" in prose
    assert "skipped" not in out and "FAILED" not in out
    assert os.listdir(tmp_path) == []  # the servers' data directories are gone
    assert _children_of(proc.pid) == []


@pytest.mark.integration
@pytest.mark.kafka
def test_a_tiny_run_on_kafka_puts_it_next_to_the_embedded_broker(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([*JOBREG, "bench", "peers", "--submits", "10", "--jobs", "100",
                             "--calls", "20", "--writers", "2", "--namespaces", "2",
                             "--only", "kafka,jobreg"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, err[-3000:]
    assert out.splitlines()[0].split()[:3] == ["measure", "jobreg", "kafka"]
    rows = ["one writer (10 calls): p99", "2 writers, one leader (20 calls): jobs/s",
            "native batch of 1,000 jobs, one atomic call",
            "failover, 100 live jobs, hot standby: claim -> all taken over",
            "failover, 100 live jobs, hot standby: claim -> every job to the hook",
            "failover, 100 live jobs, cold standby",
            "failover, 100 live jobs, elected (2 s lease): last write -> first write",
            "failover, 100 live jobs, elected (2 s lease): claim -> first write",
            "2 namespaces, a leader process each (20 calls) (***): jobs/s",
            "2 namespaces, a leader process each (20 calls) (***): broker CPU per call",
            "2 namespaces, leader threads of one process (20 calls) (***): jobs/s"]
    ratios = out[out.index("over jobreg on the embedded broker's"):]
    assert ratios.splitlines()[1].split() == ["measure", "kafka/jobreg"]
    for row in rows:  # the same workload, failover included, on both brokers
        cells = re.split(r"\s{2,}", next(line for line in out.splitlines()
                                         if line.startswith(row)))
        assert "-" not in cells[1:3], cells
        ratio = next(line for line in ratios.splitlines() if line.startswith(row))
        # CPU is counted in clock ticks (10 ms): 20 calls may cost a broker 0 ticks, and a
        # ratio over 0 is "-"; every other ratio exists.
        assert ratio.endswith("x") or row.endswith("CPU per call"), ratio
    prose = " ".join(out.split())  # the notes are wrapped at 100 columns
    assert "Apache Kafka 4.4.0: acks=all on one node" in prose
    assert "never fsync on the write path" in prose and "never fsynced" in prose
    assert "skipped" not in out and "FAILED" not in out
    assert os.listdir(tmp_path) == []  # the nodes' data directories are gone
    assert _children_of(proc.pid) == []


@pytest.mark.integration
@pytest.mark.embedded_only("`jobreg bench peers` starts its own embedded broker for jobreg's side")
def test_the_namespaces_rows_run_a_leader_process_each_and_then_one_process(tmp_path) -> None:
    """Issue 35 part 5, cheaply: 3 namespaces, each leader a process of its own (python -m registry.dev.bench_leader),
    then the three as threads of one process, both on a topic of 3 partitions, one namespace
    each; every leader process is gone at the end."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([*JOBREG, "bench", "peers", "--submits", "10", "--jobs", "10",
                             "--calls", "30", "--writers", "1", "--namespaces", "3",
                             "--only", "jobreg"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert "3 namespaces on 3 partitions, a leader process each" in err
    for form in ("a leader process each", "leader threads of one process"):
        name = f"3 namespaces, {form} (30 calls) (***)"
        for what in ("jobs/s", "x one writer's jobs/s", "p99", "client CPU per call",
                     "of it librdkafka's threads", "broker CPU per call", "CPU bound on"):
            cells = re.split(r"\s{2,}", next(line for line in out.splitlines()
                                              if line.startswith(f"{name}: {what}")))
            assert cells[1] != "-", cells  # measured (a CPU figure from /proc)
    target = next(line for line in out.splitlines()
                  if line.startswith("3 namespaces, a leader process each (30 calls) (***): "
                                     "jobs/s"))
    assert ">= 8x one writer's" in target
    assert "FAILED" not in out and "Traceback" not in err
    assert _children_of(proc.pid) == []


def test_a_missing_peer_is_named_with_its_package_and_skipped() -> None:
    env = {**os.environ, "JOBREG_ETCD_BIN": "/nonexistent/etcd",
           "JOBREG_ZOOKEEPER_JAR": "/nonexistent/zookeeper.jar"}
    proc = subprocess.run([*JOBREG, "bench", "peers", "--only", "etcd,zookeeper"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1  # nothing could run
    assert ("etcd skipped: the etcd server is not installed (Debian package etcd-server: "
            "apt-get install etcd-server" in proc.stderr)
    assert ("ZooKeeper skipped: the ZooKeeper server is not installed (Debian package "
            "zookeeper: apt-get install zookeeper" in proc.stderr)
    assert "Traceback" not in proc.stderr


def test_kafka_without_java_is_skipped_with_its_package() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = "/nonexistent"  # no java (JOBREG is run by its absolute path)
    proc = subprocess.run([*JOBREG, "bench", "peers", "--only", "kafka,kafka3"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1  # nothing could run
    for store in ("kafka", "kafka3"):
        assert (f"{store} skipped: java is not installed (Apache Kafka needs Java 17 or newer: "
                "apt-get install openjdk-17-jre-headless)") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unknown_store_is_a_usage_error() -> None:
    proc = subprocess.run([*JOBREG, "bench", "peers", "--only", "etcd,consul"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "consul" in proc.stderr


@pytest.mark.parametrize("writers", ["8,x", "0", "", "8,1000"])
def test_bad_writer_levels_are_a_usage_error(writers: str) -> None:
    proc = subprocess.run([*JOBREG, "bench", "peers", "--writers", writers],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "writer counts from 1 to 256" in proc.stderr and "Traceback" not in proc.stderr
