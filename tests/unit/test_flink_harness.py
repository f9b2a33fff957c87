"""Pure parts of the Flink failover harness (registry/dev/flink.py, bench_flink.py): the log
watcher that fires a kill on a log line, log-line times, the TaskManager's JVM limits, and
the bench's table."""

from __future__ import annotations

import threading

import pytest

from registry.dev.bench_flink import BackendFigures, CancelRun, FailoverRun, format_flink_failover
from registry.dev.flink import (
    TASKMANAGER_MEMORY,
    FlinkCluster,
    FlinkProcess,
    LogWatcher,
    _line_time,
    _tm_jvm_opts,
)
from registry.errors import ConfigError


def test_the_watcher_fires_once_on_the_first_matching_line_written_after_it_started(
        tmp_path) -> None:
    log = tmp_path / "flink.log"
    log.write_text("1 old - Job x (j1) switched from state CANCELLING to CANCELED.\n")
    fired: list[str] = []
    done = threading.Event()
    watcher = LogWatcher(log, r"\(j1\) switched from state CANCELLING to CANCELED",
                         lambda line: (fired.append(line), done.set()))
    with log.open("a") as f:
        f.write("2 new - something else\n3 new - Job x (j1) switched from state CANCELLING")
        f.flush()
        f.write(" to CANCELED.\n4 new - Job x (j1) switched from state CANCELLING to CANCELED.\n")
    assert watcher.wait(10)
    watcher.stop()
    assert fired == ["3 new - Job x (j1) switched from state CANCELLING to CANCELED."]
    assert watcher.fired_at is not None


def test_a_second_watcher_reads_on_from_just_past_the_first_ones_line(tmp_path) -> None:
    """stop_then_kill's two steps: the savepoint's trigger line names its id, and the
    completion of that id can be in the same chunk the first watcher read; the second
    watcher starts at :attr:`LogWatcher.end`, so it still sees it."""
    log = tmp_path / "flink.log"
    log.write_text("1 old - Completed checkpoint 7 for job j1\n")
    second: list[LogWatcher] = []
    fired: list[str] = []

    def arm(line: str) -> None:
        cp = line.split("checkpoint ")[1].split(" ")[0]
        second.append(LogWatcher(log, rf"Completed checkpoint {cp} for job j1", fired.append,
                                 offset=first.end))

    first = LogWatcher(log, r"Triggering checkpoint \d+ .*Savepoint", arm)
    with log.open("a") as f:  # one write: one chunk holds both lines
        f.write("2 new - Triggering checkpoint 7 (type=Savepoint) for job j1\n"
                "3 new - Completed checkpoint 7 for job j1\n")
    assert first.wait(10)
    assert second and second[0].wait(10)
    for w in (first, *second):
        w.stop()
    assert fired == ["3 new - Completed checkpoint 7 for job j1"]
    assert first.end == len(log.read_bytes().split(b"3 new")[0])


def test_a_log_line_carries_its_time_in_epoch_milliseconds() -> None:
    assert _line_time("1795879663597 15:27:43,597 INFO x") == pytest.approx(1795879663.597)
    assert _line_time("at java.base/...") != _line_time("at java.base/...")  # NaN


def test_the_taskmanager_jvm_limits_follow_its_memory_settings() -> None:
    assert _tm_jvm_opts(TASKMANAGER_MEMORY) == [
        "-Xmx256m", "-Xms256m", "-XX:MaxDirectMemorySize=96m", "-XX:MaxMetaspaceSize=192m"]
    with pytest.raises(ConfigError):
        _tm_jvm_opts({**TASKMANAGER_MEMORY, "taskmanager.memory.task.heap.size": "1g"})


def test_each_jobmanager_gets_the_scheduler_asked_for(tmp_path) -> None:
    jar = tmp_path / "flink-jobreg.jar"
    jar.write_bytes(b"")
    for scheduler, value in (("default", "Default"), ("adaptive", "Adaptive")):
        cluster = FlinkCluster(ha="jobreg", bootstrap="127.0.0.1:9", backend_jar=jar,
                               scheduler=scheduler)
        cluster.root = tmp_path
        cluster.jobmanagers = [FlinkProcess("jm1", "jobmanager", tmp_path, 1, 2)]
        assert cluster._settings(cluster.jobmanagers[0], set())["jobmanager.scheduler"] == value
    with pytest.raises(ConfigError, match="scheduler must be one of default, adaptive"):
        FlinkCluster(scheduler="reactive")


def test_a_fail_file_is_named_after_its_job(tmp_path) -> None:
    cluster = FlinkCluster()
    cluster.root = tmp_path
    assert cluster.fail_file("task failure/1") == tmp_path / "fail-task-failure-1"


def test_the_table_counts_restores_and_resurrections() -> None:
    zk = BackendFigures("zookeeper", kills=[FailoverRun("jm1", "jm2", 6.3, 6.7, 6.9, 2, None, 2),
                                            FailoverRun("jm2", "jm1", 6.5, 6.9, 7.1, 9, 10, 10)],
                        cancels=[CancelRun("j", 1.8, True, "RUNNING", False)])
    jobreg = BackendFigures("jobreg (embedded)",
                            kills=[FailoverRun("jm1", "jm2", 3.1, 3.4, 3.6, 4, None, 3)],
                            cancels=[CancelRun("k", 2.0, False, "CANCELED", False)])
    table = format_flink_failover([zk, jobreg], lease=3).splitlines()
    assert table[2].split() == ["zookeeper", "2", "6.3-6.5", "6.7-6.9", "6.9-7.1", "2/2", "1",
                                "1.8", "1/1", "0/1"]
    assert table[3].split()[-6:] == ["3.6", "0/1", "1", "2.0", "0/1", "0/1"]
