"""The CLI through its real entry point (a subprocess), end to end."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import BrokerError, Registry

JOBREG = [sys.executable, "-m", "registry.cli"]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOBREG, *args], capture_output=True, text=True, timeout=timeout)


REPO = Path(__file__).resolve().parents[2]
SPARK_LINES = ("Using incubator modules", "Setting default log level",
               "setLogLevel(newLevel)", "For SparkR")


def _without_this_environment() -> dict[str, str]:
    """The environment of a shell after `make demo`: the virtualenv's bin is not on the PATH."""
    bin_dir = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(path)
    return env


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`jobreg demo` run once from the checkout, as a newcomer runs it after `make demo`
    (jobreg not on the PATH): its output directory and what it printed."""
    out = tmp_path_factory.mktemp("demo")
    result = subprocess.run([*JOBREG, "demo", "--out", str(out)], capture_output=True,
                            text=True, timeout=900, cwd=REPO, env=_without_this_environment())
    return out, result


def _incident(stdout: str, name: str) -> str:
    """The lines an incident printed (from its title to the next step)."""
    return stdout.split(f"\n{name}  ", 1)[1].split("\n[", 1)[0]


@pytest.mark.embedded_only("`jobreg demo` starts its own embedded broker")
@pytest.mark.integration
def test_demo_plays_the_incidents_and_every_guarantee_holds(demo) -> None:
    tmp_path, result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    assert "10/10 guarantees held" in result.stdout
    assert "BROKEN" not in result.stdout
    for question in ("Which writes were refused", "How often did leadership change",
                     "Did any job come back", "Which checkpoint failures were ignored"):
        assert question in result.stdout
    assert "stale_epoch" in result.stdout and "terminal_job" in result.stdout
    # Read as a newcomer would (issue 15 item 17): sentences, not values.
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


@pytest.mark.embedded_only("`jobreg demo` starts its own embedded broker")
@pytest.mark.integration
def test_demo_says_what_became_of_each_write_it_tells_of(demo) -> None:
    """Issue 29 §2: each incident's sentence says what happened to each write, from the
    fold's verdicts and the client's answers: no write is called refused by the fold unless
    its record is among the refused ones printed under it, and every refused record printed
    is told of. In incident 000 jm-1's late terminate never left its client; its in-flight
    release is the one record the fold refused."""
    _, result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("000", "001", "002", "003", "004"):
        block = _incident(result.stdout, name)
        said = block.split("jobreg: ", 1)[1].split("\n      refused", 1)[0]
        claimed = sorted(int(n) for n in re.findall(r"refused by the fold at offset (\d+)", said))
        printed = sorted(int(n) for n in re.findall(r"refused  offset +(\d+)", block))
        assert claimed == printed, (name, said, printed)
    said = _incident(result.stdout, "000")
    assert "were both refused" not in said
    assert "jm-1's late terminate was refused by its own client before sending (stale_epoch): " \
        "it never reached the log" in said, said
    release = re.search(r"jm-1's late release was (.*?); jm-1's late terminate", said)
    assert release is not None, said
    assert release.group(1).startswith(("sent, but the log never held it (its client answered "
                                        "Fenced: stale_epoch)",
                                        "refused by its own client before sending",
                                        "refused by the fold at offset")), release.group(1)
    assert re.search(r"a release jm-1 had in flight, written past its client, was refused by "
                     r"the fold at offset \d+ \(stale_epoch\)", said), said
    said = _incident(result.stdout, "001")
    assert re.search(r"resubmitting job-old was refused by the fold at offset \d+ "
                     r"\(terminal_job\)", said), said
    said = _incident(result.stdout, "002")
    assert re.search(r"the removal it had in flight, written past its client, was refused by the "
                     r"fold at offset \d+ \(stale_epoch\): refused by epoch", said), said
    said = _incident(result.stdout, "003")
    assert "jm-2 (epoch 2) adopted 19 jobs and marked job-07 RECOVERY_FAILED" in said
    assert "jm-3 (epoch 3) adopted 19 jobs, and did not try job-07 again." in said


@pytest.mark.embedded_only("`jobreg demo` starts its own embedded broker")
@pytest.mark.integration
def test_demo_prints_sentences_and_no_spark_lines(demo) -> None:
    """Issue 29 §2: no Python value in a sentence (a list, a bool), and none of Spark's own
    start-up lines (the JVM's incubator notice, the log-level banner) on either stream."""
    _, result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    said = [line for line in result.stdout.splitlines() if "jobreg: " in line]
    assert len(said) == 5, said
    for line in said:
        for value in ("['", "{'", "True", "False", "None"):
            assert value not in line, (value, line)
    assert "recovered job-new and job-run;" in said[1], said[1]
    assert "the job is within its checkpoint failure budget" in said[4], said[4]
    assert "starting Spark" in result.stdout  # Spark did run
    for line in SPARK_LINES:
        assert line not in result.stdout and line not in result.stderr, (line, result.stderr)


@pytest.mark.embedded_only("`jobreg demo` starts its own embedded broker")
@pytest.mark.integration
def test_demo_tells_how_to_run_jobreg_when_it_is_not_on_the_path(demo) -> None:
    """Issue 29 §2: after `make demo` jobreg is in .venv, not on the PATH: the demo's hint
    names a command that works as printed, from where the demo ran, and how to activate."""
    out, result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    hint = re.search(r"read one with `([^`]+)` \(or run `\. ([^`]+)` once, then `jobreg \.\.\.`\)",
                     result.stdout)
    assert hint is not None, result.stdout[-1500:]
    command, activate = shlex.split(hint.group(1)), hint.group(2)
    assert command[0] != "jobreg" and command[0].endswith("/jobreg"), command
    assert (REPO / activate).is_file(), activate
    env = _without_this_environment()
    assert shutil.which("jobreg", path=env["PATH"]) is None or \
        Path(shutil.which("jobreg", path=env["PATH"])).resolve() != (REPO / command[0]).resolve()
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "job 'job-a' is CANCELLED" in ran.stdout, ran.stdout
    activated = subprocess.run(["bash", "-c", f". {shlex.quote(activate)} && jobreg --version"],
                               capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert activated.returncode == 0 and activated.stdout.strip(), activated.stderr


@pytest.mark.embedded_only("`jobreg bench core` starts its own embedded broker")
@pytest.mark.integration
def test_bench_core_prints_its_table() -> None:
    result = run("bench", "core", "--submits", "20", "--jobs", "2000")
    assert result.returncode == 0, result.stderr
    for row in ("fenced submit p99", "batched submit", "fold replay", "raw limit", "replay / raw"):
        assert row in result.stdout


@pytest.mark.embedded_only("`jobreg bench soak` without --bootstrap starts its own embedded broker")
@pytest.mark.integration
def test_bench_soak_prints_its_windows_and_targets() -> None:
    result = run("bench", "soak", "--writes", "200", "--window", "100", "--jobs", "20")
    assert result.returncode == 0, result.stderr
    for row in ("writes/s", "p99 ms", "B/live job", "last window's rate / first's",
                "image per live job", "start-up from a snapshot", "same image as from scratch"):
        assert row in result.stdout


@pytest.mark.embedded_only("`jobreg bench soak` without --bootstrap starts its own embedded broker")
@pytest.mark.integration
def test_bench_soak_with_concurrent_writers_on_one_term() -> None:
    result = run("bench", "soak", "--writes", "200", "--window", "100", "--jobs", "20",
                 "--writers", "4")
    assert result.returncode == 0, result.stderr
    assert "4 writer threads at once on one Term" in result.stdout
    assert "200 of 200" in result.stdout and "STOPPED" not in result.stdout
    for row in ("writes/s", "p50 ms", "p99 ms"):
        assert row in result.stdout
    bad = run("bench", "soak", "--writers", "0")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


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
