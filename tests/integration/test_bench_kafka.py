"""``jobreg bench soak`` and ``bench audit`` on Apache Kafka (``--kafka``, ``--kafka-nodes N``):
the broker is started for the run (``registry/dev/brokers.py``), the output is the same and
says which broker it was; ``--kafka`` with a broker named by ``--bootstrap`` is a usage error.
No test times anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

JOBREG = [sys.executable, "-m", "registry.cli"]


def _run(*args: str, env: dict[str, str] | None = None,
         timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOBREG, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.mark.integration
@pytest.mark.kafka
def test_a_tiny_soak_on_one_kafka_node(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("JOBREG_BOOTSTRAP", None)
    result = _run("bench", "soak", "--kafka", "--writes", "60", "--window", "30", "--jobs", "10",
                  env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on Apache Kafka 4.4.0, 1 node;" in result.stdout
    for row in ("writes/s", "p99 ms", "60 of 60", "start-up from a snapshot",
                "same image as from scratch"):
        assert row in result.stdout
    assert "STOPPED" not in result.stdout
    assert os.listdir(tmp_path) == []  # the node's directory is gone


def test_kafka_and_a_named_broker_are_a_usage_error() -> None:
    result = _run("--bootstrap", "127.0.0.1:9", "bench", "soak", "--kafka-nodes", "3")
    assert result.returncode == 2
    assert "--kafka starts a broker for the run and --bootstrap" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["soak", "audit"])
def test_kafka_nodes_out_of_range_is_a_usage_error(command: str) -> None:
    result = _run("bench", command, "--kafka-nodes", "0")
    assert result.returncode == 2 and "--kafka-nodes" in result.stderr
    assert "Traceback" not in result.stderr
