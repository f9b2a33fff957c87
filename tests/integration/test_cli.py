"""The CLI through its real entry point (a subprocess), end to end."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from registry import BrokerError, Registry

JOBREG = [sys.executable, "-m", "registry.cli"]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOBREG, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.embedded_only
@pytest.mark.integration
def test_demo_plays_the_incidents_and_every_guarantee_holds(tmp_path) -> None:
    result = run("demo", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10/10 guarantees held" in result.stdout
    assert "BROKEN" not in result.stdout
    for question in ("Which writes were refused", "How often did leadership change",
                     "Did any job come back", "Which checkpoint failures were ignored"):
        assert question in result.stdout
    assert "stale_epoch" in result.stdout and "terminal_job" in result.stdout
    # Read as a newcomer would (issue 15 item 17): sentences, not values.
    assert "late release and terminate were both refused (stale_epoch)" in result.stdout
    assert "cancelled job-a" in result.stdout and "sees no live job." in result.stdout
    assert "the standby did not take over. " in result.stdout
    for awkward in ("live jobs none", "(True)", "(False)", "stale_epoch, stale_epoch"):
        assert awkward not in result.stdout
    reports = sorted(p.name for p in tmp_path.glob("report-incident-*.html"))
    assert reports == [f"report-incident-00{n}.html" for n in range(5)]
    assert (tmp_path / "audit.db").stat().st_size > 0
    # the broker is gone; the dumps it left answer forensics and the audit check (item 16)
    dumps = tmp_path / "dumps"
    assert sorted(p.name for p in dumps.glob("*.avro")) == [
        f"incident-00{n}.avro" for n in range(5)]
    check = run("audit", "check", "--db", f"sqlite:///{tmp_path / 'audit.db'}",
                "--from-file", str(dumps))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "agrees with the fold of 5 dump(s)" in check.stdout
    explain = run("--from-file", str(dumps / "incident-000.avro"), "explain", "job-a")
    assert explain.returncode == 0 and "cancelled" in explain.stdout, explain.stderr
    # it leaves nothing running: no coordinator, broker or Spark process of ours survives
    leftovers = subprocess.run(["pgrep", "-f", f"registry.dev.coordinator|{tmp_path}"],
                               capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


@pytest.mark.embedded_only
@pytest.mark.integration
def test_bench_core_prints_its_table() -> None:
    result = run("bench", "core", "--submits", "20", "--jobs", "2000")
    assert result.returncode == 0, result.stderr
    for row in ("fenced submit p99", "batched submit", "fold replay", "raw limit", "replay / raw"):
        assert row in result.stdout


@pytest.mark.embedded_only
@pytest.mark.integration
def test_bench_soak_prints_its_windows_and_targets() -> None:
    result = run("bench", "soak", "--writes", "200", "--window", "100", "--jobs", "20")
    assert result.returncode == 0, result.stderr
    for row in ("writes/s", "p99 ms", "B/live job", "last window's rate / first's",
                "image per live job", "start-up from a snapshot", "same image as from scratch"):
        assert row in result.stdout


def test_bad_arguments_give_usage_and_exit_2() -> None:
    result = run("bench", "core", "--submits", "zero")
    assert result.returncode == 2 and "Usage" in result.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_broker_is_a_clear_error_within_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(BrokerError, match="no Kafka broker answered"):
        Registry.connect(f"127.0.0.1:{_closed_port()}", "prod", timeout=2)
    assert time.monotonic() - start < 10
