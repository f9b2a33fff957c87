"""``jobreg bench flink-failover``: a Flink 2.3 JobManager failover on Flink's ZooKeeper
backend and on jobreg's, the same job on the same machine in one run.

Each backend gets a :class:`~registry.dev.flink.FlinkCluster` of two JobManagers and one
TaskManager, and the test job of ``tests/support/flink`` (keyed state, a checkpoint every
500 ms). Then, ``runs`` times each:

* **kill** (:func:`kill_leader`): SIGKILL the leading JobManager once the job has completed
  checkpoints; figures from the kill to the standby's leadership, to the job RUNNING again
  on it, and to its first completed checkpoint (all read from the JobManagers' logs, whose
  lines carry epoch milliseconds); the checkpoint it restored from against the last one the
  killed leader completed. The killed JobManager is started again as the next standby.
* **cancel, then kill** (:func:`cancel_then_kill`): cancel the job and SIGKILL the leader the
  moment its log says ``switched from state CANCELLING to CANCELED`` (a
  :class:`~registry.dev.flink.LogWatcher` polling every 2 ms); a **resurrection** is the new
  leader running the cancelled job again (seed 001). Each run submits a fresh job first.

ZooKeeper is Debian's, with Flink's session timeout at 6 s (the measured control of
``shared/flink-ha.md``); jobreg runs on the embedded broker, or on Apache Kafka
(``kafka=True``), with the backend's lease (``lease``, 5 s by default).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from registry.dev.flink import FlinkCluster, FlinkProcess, LogWatcher, granted_at, revoked_at

__all__ = ["BACKEND_JAR", "CancelRun", "FailoverRun", "FlinkBenchError", "backend_jar",
           "bench_flink_failover", "cancel_then_kill", "finish_then_kill", "FINISHED_LINES", "STOP_POINTS", "stop_then_kill", "completed_checkpoints", "running_since", "ensure_backend_jar", "fatal_cause", "format_flink_failover", "kill_leader", "pause_leader", "PauseRun"]

#: Where ``mvn -f flink-jobreg/pom.xml package`` leaves jobreg's Flink backend.
BACKEND_JAR = pathlib.Path("flink-jobreg") / "target" / "flink-jobreg-0.1.0.jar"
_CANCELED = "switched from state CANCELLING to CANCELED"


class FlinkBenchError(Exception):
    """The bench cannot run (no backend jar, a cluster that does not start); one line."""


def backend_jar() -> pathlib.Path:
    """jobreg's Flink backend jar in this source tree (``$JOBREG_FLINK_BACKEND_JAR`` first)."""
    given = os.environ.get("JOBREG_FLINK_BACKEND_JAR")
    if given:
        return pathlib.Path(given)
    return pathlib.Path(__file__).resolve().parents[2] / BACKEND_JAR


def ensure_backend_jar(progress: Callable[[str], None] = lambda _line: None) -> pathlib.Path:
    """:func:`backend_jar`, built with ``mvn package -DskipTests`` first when it is missing
    or older than a source of ``flink-jobreg/``.

    :raises FlinkBenchError: no ``mvn``, or the build failed (one line).
    """
    jar = backend_jar()
    module = jar.parents[1]
    sources = [p for p in (module / "src" / "main").rglob("*") if p.is_file()]
    sources.append(module / "pom.xml")
    if jar.exists() and all(p.stat().st_mtime <= jar.stat().st_mtime for p in sources):
        return jar
    if not (module / "pom.xml").exists():
        raise FlinkBenchError(f"{module / 'pom.xml'} is missing: jobreg's Flink backend is "
                              "built from a source tree")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FlinkBenchError("mvn not found on PATH: it builds jobreg's Flink backend "
                              "(apt-get install maven)")
    progress(f"building {jar.name} (mvn package)")
    done = subprocess.run([mvn, "-q", "-B", "-f", str(module / "pom.xml"), "package",
                           "-DskipTests"], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0 or not jar.exists():
        said = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln]
        raise FlinkBenchError(f"building {jar.name} failed: "
                              f"{said[0][:300] if said else f'exit {done.returncode}'}")
    return jar


@dataclass
class FailoverRun:
    """One SIGKILL of a leading JobManager, seconds from the kill."""

    killed: str
    new_leader: str
    to_leadership: float
    to_running: float
    to_checkpoint: float
    last_before_kill: int
    """The last checkpoint the killed leader's log says it completed."""
    in_flight: int | None
    """A checkpoint the killed leader had triggered but not logged complete, if any."""
    restored: int | None
    """The checkpoint the new leader restored the job from."""

    @property
    def restored_last(self) -> bool:
        """Whether the job went on from the last completed checkpoint (one whose pointer
        was written just before the kill, before its log line, counts too)."""
        return self.restored is not None and (
            self.restored == self.last_before_kill or self.restored == self.in_flight)


@dataclass
class CancelRun:
    """One end of a job (a cancel, or a bounded job's FINISHED), then SIGKILL of the leader at
    its log line."""

    job_id: str
    reaction_ms: float
    """From the end's line's time to the SIGKILL."""
    resurrected: bool
    """Whether the new leader ran the ended job again."""
    new_state: str | None
    """The job's state the new leader reports at the end (``None``: it does not know it)."""
    dirty_result_file: bool
    """Whether Flink's file-based JobResultStore had a result for the job at the kill
    (ZooKeeper backend): the window was missed if so."""
    crashed: bool = False
    """Whether the new leader ended (a fatal error) instead of running on."""
    crash: str | None = None
    """The first line of its fatal error's cause, if it crashed."""
    line: str | None = None
    """The log line the leader was killed at."""


@dataclass
class BackendFigures:
    """What one backend measured."""

    backend: str
    kills: list[FailoverRun] = field(default_factory=list)
    record_lag_ms: float | None = None
    """jobreg: from a plain cancel's CANCELED log line to the backend's log line saying the
    job's end is recorded in jobreg (the width of the cancel-then-kill window it leaves)."""
    cancels: list[CancelRun] = field(default_factory=list)
    error: str | None = None


def _completed(jm: FlinkProcess, job_id: str) -> list[tuple[float, int]]:
    return [(t, int(m.group(1))) for t, line in jm.log_lines(
        rf"Completed checkpoint \d+ for job {job_id}")
        if (m := re.search(r"Completed checkpoint (\d+)", line))]


def completed_checkpoints(jm: FlinkProcess, job_id: str) -> list[tuple[float, int]]:
    """``(epoch seconds, checkpoint id)`` of every checkpoint of the job that ``jm``'s log
    says completed, in log order."""
    return _completed(jm, job_id)


def running_since(jm: FlinkProcess, job_id: str, since: float) -> list[float]:
    """When ``jm``'s log says the job's execution graph switched to RUNNING at ``since`` or
    later (a restart under either scheduler, or a recovery, ends so)."""
    return [t for t in _running_lines(jm, job_id) if t >= since]


def _triggered(jm: FlinkProcess, job_id: str) -> list[int]:
    return [int(m.group(1)) for _, line in jm.log_lines(
        rf"Triggering checkpoint \d+ .* for job {job_id[:16]}")
        if (m := re.search(r"Triggering checkpoint (\d+)", line))]


def _running_lines(jm: FlinkProcess, job_id: str) -> list[float]:
    return [t for t, _ in jm.log_lines(rf"Job .* \({job_id}\) switched from state \w+ to RUNNING")]


def wait_checkpoints(flink: FlinkCluster, jm: FlinkProcess, job_id: str, count: int,
                     timeout: float = 120.0) -> None:
    """Wait until ``jm``'s log shows ``count`` completed checkpoints of the job."""
    flink.wait_for(f"{count} checkpoints of {job_id} on {jm.name}",
                   lambda: len(_completed(jm, job_id)) >= count, timeout)


def kill_leader(flink: FlinkCluster, job_id: str, *, timeout: float = 180.0,
                restart: bool = True) -> FailoverRun:
    """SIGKILL the leading JobManager and time the standby's takeover of ``job_id``.

    The job must be running on the leader; waits for two checkpoints of it first. With
    ``restart``, the killed JobManager is started again afterwards (the next standby).
    """
    leader = flink.leader()
    before = len(_completed(leader, job_id))
    wait_checkpoints(flink, leader, job_id, before + 2, timeout)
    others = [jm for jm in flink.jobmanagers if jm is not leader and jm.is_running()]
    granted_before = {jm.name: granted_at(jm) for jm in others}
    killed_at = flink.kill(leader)
    completed = _completed(leader, job_id)
    last = completed[-1][1]
    triggered = [c for c in _triggered(leader, job_id) if c > last]
    new = flink.leader(timeout=timeout, among=others)
    grant = granted_at(new)
    assert grant is not None
    if granted_before.get(new.name) == grant:
        raise FlinkBenchError(f"{new.name} led before the kill")
    running = flink.wait_for(f"{job_id} RUNNING on {new.name}",
                             lambda: [t for t in _running_lines(new, job_id) if t >= grant],
                             timeout)
    first = flink.wait_for(f"a checkpoint of {job_id} on {new.name}",
                           lambda: [t for t, _ in _completed(new, job_id) if t >= grant],
                           timeout)
    restored = None
    for _, line in new.log_lines(rf"Restoring job {job_id} from Checkpoint \d+"):
        m = re.search(r"from Checkpoint (\d+)", line)
        if m:
            restored = int(m.group(1))
    run = FailoverRun(leader.name, new.name, grant - killed_at, running[0] - killed_at,
                      first[0] - killed_at, last, triggered[0] if triggered else None, restored)
    if restart:
        flink.restart(leader)
    return run


@dataclass
class PauseRun:
    """One SIGSTOP of the leading JobManager past its lease, then SIGCONT."""

    paused: str
    standby: str
    standby_led_after: float
    """Seconds from the SIGSTOP to the standby's grant."""
    paused_for: float
    revoked_after_resume: float | None
    """Seconds from the SIGCONT to the resumed JobManager's revocation (``None``: its log
    shows none; see :attr:`exited`)."""
    exited: bool
    """Whether the resumed JobManager ended (a fatal error on lost leadership)."""
    deployed_after_resume: list[str]
    """Log lines of the resumed JobManager after the SIGCONT that deploy, run or complete a
    checkpoint (there should be none)."""
    refusals: list[str]
    """Log lines of the resumed JobManager after the SIGCONT where a write was refused."""


_DEPLOYS = (r"Deploying |switched from state \w+ to RUNNING|Completed checkpoint \d+|"
            r"was granted leadership")
_REFUSED = r"Fenced|NotLeader|not the leader|stale.epoch"


def pause_leader(flink: FlinkCluster, job_id: str, *, timeout: float = 180.0) -> PauseRun:
    """SIGSTOP the leading JobManager until the standby leads and has completed a checkpoint
    of ``job_id``, then SIGCONT it and wait until it has lost leadership (or ended) and the
    new leader has completed two more checkpoints."""
    leader = flink.leader()
    wait_checkpoints(flink, leader, job_id, len(_completed(leader, job_id)) + 1, timeout)
    others = [jm for jm in flink.jobmanagers if jm is not leader and jm.is_running()]
    paused_at = flink.pause(leader)
    try:
        new = flink.leader(timeout=timeout, among=others)
        grant = granted_at(new)
        assert grant is not None
        flink.wait_for(f"a checkpoint of {job_id} on {new.name}",
                       lambda: [t for t, _ in _completed(new, job_id) if t >= grant], timeout)
    finally:
        resumed_at = flink.resume(leader)
    flink.wait_for(f"{leader.name} losing leadership after SIGCONT",
                   lambda: not leader.is_running() or
                   (revoked_at(leader) or 0.0) >= paused_at, timeout)
    done = len(_completed(new, job_id)) + 2
    wait_checkpoints(flink, new, job_id, done, timeout)
    revoked = revoked_at(leader)
    after = [(t, line) for t, line in leader.log_lines(".") if t >= resumed_at]
    return PauseRun(
        leader.name, new.name, grant - paused_at, resumed_at - paused_at,
        (revoked - resumed_at) if revoked is not None and revoked >= paused_at else None,
        not leader.is_running(),
        [line for _, line in after if re.search(_DEPLOYS, line)],
        [line for _, line in after if re.search(_REFUSED, line)])


def _job_result_file(flink: FlinkCluster, job_id: str) -> bool:
    store = flink.storage_dir / "job-result-store"
    return store.exists() and any(job_id in p.name for p in store.rglob("*"))


def cancel_then_kill(flink: FlinkCluster, job_id: str, *, settle: float = 8.0,
                     delay_ms: float = 0.0, timeout: float = 180.0,
                     restart: bool = True) -> CancelRun:
    """Cancel ``job_id`` on the leader and SIGKILL the leader the moment its log says the
    job is CANCELED (``delay_ms`` after the watcher sees the line); then watch the new leader
    for ``settle`` s after it recovered its jobs: a resurrection is the job running there
    again."""
    leader = flink.leader()
    wait_checkpoints(flink, leader, job_id, len(_completed(leader, job_id)) + 1, timeout)
    return _kill_at_end(flink, leader, job_id, rf"\({job_id}\) {_CANCELED}",
                        lambda: flink.cancel(leader, job_id), "CANCELED", settle=settle,
                        delay_ms=delay_ms, timeout=timeout, restart=restart)


FINISHED_LINES = {
    "graph": "switched from state RUNNING to FINISHED",
    "dispatcher": "reached terminal state FINISHED",
}
"""The two lines a job's FINISHED is logged at: the execution graph's transition (the first,
on the JobMaster's thread) and the Dispatcher's, after the JobMaster's result (where Flink
writes its job result)."""


def finish_then_kill(flink: FlinkCluster, job_id: str, *, at: str = "graph",
                     settle: float = 8.0, timeout: float = 180.0,
                     restart: bool = True) -> CancelRun:
    """SIGKILL the leader the moment its log says the bounded job ``job_id`` FINISHED (``at``
    names the line: a key of :data:`FINISHED_LINES`); then watch the new leader for
    ``settle`` s after it recovered its jobs: a resurrection is the job running there again
    (seed 001's month-old finished job)."""
    leader = flink.leader()
    pattern = (rf"\({job_id}\) {FINISHED_LINES[at]}" if at == "graph"
               else rf"Job {job_id} {FINISHED_LINES[at]}")
    return _kill_at_end(flink, leader, job_id, pattern, lambda: None, "FINISHED",
                        settle=settle, timeout=timeout, restart=restart)


STOP_POINTS = ("triggered", "savepoint", "finished")
"""Where :func:`stop_then_kill` kills the leader: at the Dispatcher's "Triggering
stop-with-savepoint" line, at the savepoint's "Completed checkpoint" line (the savepoint is on
disk, the job not yet ended), at the Dispatcher's "reached terminal state FINISHED" line."""


def stop_then_kill(flink: FlinkCluster, job_id: str, *, drain: bool, at: str,
                   settle: float = 8.0, timeout: float = 180.0,
                   restart: bool = True) -> CancelRun:
    """Stop ``job_id`` with a savepoint (``drain``: ``flink stop --drain``) and SIGKILL the
    leader the moment its log reaches ``at`` (one of :data:`STOP_POINTS`); then watch the
    new leader for ``settle`` s after it recovered its jobs (:attr:`CancelRun.resurrected`:
    the job runs there)."""
    leader = flink.leader()
    wait_checkpoints(flink, leader, job_id, len(_completed(leader, job_id)) + 1, timeout)
    then = None
    if at == "triggered":
        pattern = rf"Triggering stop-with-savepoint for job {job_id}"
    elif at == "savepoint":
        pattern = (rf"Triggering checkpoint (\d+) \(type=SavepointType\{{name='"
                   rf"(?:Suspend|Terminate) Savepoint'.* for job {job_id}")

        def then(line: str) -> str:
            m = re.search(r"Triggering checkpoint (\d+)", line)
            assert m is not None
            return rf"Completed checkpoint {m.group(1)} for job {job_id}"
    elif at == "finished":
        pattern = rf"Job {job_id} {FINISHED_LINES['dispatcher']}"
    else:
        raise ValueError(f"at: one of {', '.join(STOP_POINTS)}, not {at!r}")
    def start() -> None:
        # The kill can come before the answer (the trigger line is logged while the request
        # is served): no answer is then what the test expects.
        with contextlib.suppress(OSError, http.client.HTTPException):
            flink.stop_with_savepoint(leader, job_id, drain=drain)

    return _kill_at_end(flink, leader, job_id, pattern, start, f"stop ({at})",
                        settle=settle, timeout=timeout, restart=restart, then=then)


def _kill_at_end(flink: FlinkCluster, leader: FlinkProcess, job_id: str, pattern: str,
                 start: Callable[[], object], end: str, *, settle: float, timeout: float,
                 restart: bool, delay_ms: float = 0.0,
                 then: Callable[[str], str] | None = None) -> CancelRun:
    """Run ``start`` and SIGKILL ``leader`` the moment its log has a line matching
    ``pattern`` (the job's ``end``; with ``then``, the first line matching the pattern
    ``then`` makes of that line), then watch the new leader for ``settle`` s after it
    recovered its jobs."""
    others = [jm for jm in flink.jobmanagers if jm is not leader and jm.is_running()]

    def kill(_line: str) -> None:
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)
        flink.kill(leader)

    second: list[LogWatcher] = []

    def arm(line: str) -> None:  # the second watcher reads on from just past the line
        assert then is not None
        second.append(flink.watch(leader, then(line), kill, offset=first.end))

    first = flink.watch(leader, pattern, kill if then is None else arm)
    try:
        start()
        if not first.wait(timeout) or (second and not second[0].wait(timeout)):
            raise FlinkBenchError(f"{leader.name} never logged {job_id} {end}")
    finally:
        for w in (first, *second):
            w.stop()
    watcher = second[0] if second else first
    assert watcher.line is not None and watcher.fired_at is not None
    line_at = float(watcher.line.split(" ", 1)[0]) / 1000.0
    dirty = _job_result_file(flink, job_id)
    new = flink.leader(timeout=timeout, among=others)
    grant = granted_at(new)
    assert grant is not None
    flink.wait_for(f"{new.name} recovering its jobs",
                   lambda: not new.is_running() or [t for t, _ in new.log_lines(
                       r"Successfully recovered \d+ persisted job graphs") if t >= grant],
                   timeout)
    deadline = time.monotonic() + settle
    while new.is_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    resurrected = bool([t for t in _running_lines(new, job_id) if t >= grant])
    state = flink.job_status(new, job_id) if new.is_running() else None
    run = CancelRun(job_id, (watcher.fired_at - line_at) * 1000.0 + delay_ms,
                    resurrected or state in ("RUNNING", "RESTARTING", "CREATED",
                                             "INITIALIZING"),
                    state, dirty, crashed=not new.is_running(), crash=fatal_cause(new),
                    line=watcher.line)
    if restart:
        flink.restart(leader)
    return run


def fatal_cause(jm: FlinkProcess) -> str | None:
    """The fatal error in ``jm``'s log and its deepest cause with a place, if any."""
    text = jm.log_text()
    at = text.find("Fatal error occurred in the cluster entrypoint")
    if at < 0:
        return None
    lines = text[at:].splitlines()
    head = lines[1].strip() if len(lines) > 1 else ""
    causes = [i for i, ln in enumerate(lines) if ln.startswith("Caused by:")]
    if causes:
        last = causes[-1]
        where = next((ln.strip() for ln in lines[last + 1:last + 4]
                      if ln.strip().startswith("at org.apache.flink")
                      and "Preconditions" not in ln), "")
        head = f"{lines[last].strip()} {where}".strip()
    return head[:300]


# -- the bench -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _jobreg_broker(kafka: bool, progress: Callable[[str], None]) -> Iterator[str]:
    if kafka:
        from registry.dev.kafka import KafkaCluster

        with KafkaCluster(progress=progress) as cluster:
            yield cluster.bootstrap
    else:
        from registry import EmbeddedBroker

        with EmbeddedBroker() as broker:
            yield broker.bootstrap


def _measure_kills(flink: FlinkCluster, runs: int, figures: BackendFigures,
                   progress: Callable[[str], None]) -> None:
    leader = flink.leader()
    job = flink.submit(leader, "failover")
    flink.wait_for(f"{job} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    for i in range(runs):
        run = kill_leader(flink, job)
        figures.kills.append(run)
        progress(f"{figures.backend}: kill {i + 1}/{runs}: leader after "
                 f"{run.to_leadership:.2f} s, RUNNING after {run.to_running:.2f} s, "
                 f"checkpoint after {run.to_checkpoint:.2f} s (restored {run.restored}, "
                 f"last before the kill {run.last_before_kill})")
        _wait_standby(flink)
    if flink.ha == "jobreg":
        leader = flink.leader()
        flink.cancel(leader, job)
        canceled = flink.wait_for("the CANCELED line", lambda: leader.log_lines(
            rf"\({job}\) {_CANCELED}"))
        try:
            recorded = flink.wait_for("jobreg's record of the end", lambda: leader.log_lines(
                rf"Recorded in jobreg that job {job}"), timeout=30)
        except TimeoutError:
            progress(f"{figures.backend}: the backend's log never said the end was recorded")
            return
        figures.record_lag_ms = (recorded[0][0] - canceled[0][0]) * 1000.0
        progress(f"{figures.backend}: a plain cancel is recorded in jobreg "
                 f"{figures.record_lag_ms:.0f} ms after the CANCELED line")


def _measure_cancel(flink: FlinkCluster, i: int, cancels: int, figures: BackendFigures,
                    progress: Callable[[str], None], delay_ms: float) -> None:
    leader = flink.leader()
    job = flink.submit(leader, f"cancel-{i + 1}")
    flink.wait_for(f"{job} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    c = cancel_then_kill(flink, job, restart=False, delay_ms=delay_ms)
    figures.cancels.append(c)
    outcome = ("the new leader CRASHED: " + (c.crash or "?") if c.crashed else
               "RESURRECTED" if c.resurrected else "stayed cancelled")
    progress(f"{figures.backend}: cancel-then-kill {i + 1}/{cancels}: killed "
             f"{c.reaction_ms:.1f} ms after CANCELED (dirty JobResult file at the kill: "
             f"{'yes' if c.dirty_result_file else 'no'}), {outcome} "
             f"(state on the new leader: {c.new_state})")


def _wait_standby(flink: FlinkCluster) -> None:
    """Wait until every JobManager answers REST again (a restarted one is a standby)."""
    for jm in flink.jobmanagers:
        flink.wait_for(f"{jm.name} answering", lambda j=jm:  # type: ignore[misc]
                       flink.rest(j, "/config", timeout=2), 120)


def bench_flink_failover(*, runs: int = 3, cancels: int | None = None, kafka: bool = False,
                         lease: float = 5.0, backends: tuple[str, ...] = ("zookeeper", "jobreg"),
                         kill_delay_ms: float = 0.0,
                         progress: Callable[[str], None] = lambda _line: None
                         ) -> list[BackendFigures]:
    """Run the kill ``runs`` times on one cluster of each backend, then each cancel-then-kill
    (``cancels``, default ``runs``) on a fresh cluster of that backend (see the module
    docstring): a run that takes the cluster down does not spoil the next."""
    jar = ensure_backend_jar(progress) if "jobreg" in backends else backend_jar()
    out = []
    with tempfile.TemporaryDirectory(prefix="jobreg-flink-bench-") as work, \
            contextlib.ExitStack() as brokers:
        bootstrap = (brokers.enter_context(_jobreg_broker(kafka, progress))
                     if "jobreg" in backends else None)
        for backend in backends:
            figures = BackendFigures(backend if backend == "zookeeper" else
                                     ("jobreg (Kafka)" if kafka else "jobreg (embedded)"))
            out.append(figures)
            options: dict[str, object] = {"ha": backend, "progress": progress}
            if backend == "jobreg":
                options.update(bootstrap=bootstrap, backend_jar=jar, lease=lease)
            count = runs if cancels is None else cancels
            # step -1: the kills on one cluster; step i >= 0: cancel run i on a fresh one
            for n in range(-1, count):
                directory = pathlib.Path(work) / f"{backend}-{n + 1}"
                try:
                    with FlinkCluster(directory=directory, **options) as flink:  # type: ignore[arg-type]
                        if n < 0:
                            _measure_kills(flink, runs, figures, progress)
                        else:
                            _measure_cancel(flink, n, count, figures, progress, kill_delay_ms)
                except (TimeoutError, FlinkBenchError) as e:
                    figures.error = str(e)
                    progress(f"{figures.backend}: stopped: {e}")
                    break
    return out


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"


def format_flink_failover(figures: list[BackendFigures], *, lease: float) -> str:
    """The bench's table: one row per backend."""
    head = ("backend", "kills", "to leader s", "to RUNNING s", "to checkpoint s",
            "restored last", "cancel+kill", "killed after ms", "resurrected", "leader crashed")
    rows = [head]
    for f in figures:
        k = f.kills
        rows.append((f.backend, str(len(k)), _span([r.to_leadership for r in k]),
                     _span([r.to_running for r in k]), _span([r.to_checkpoint for r in k]),
                     f"{sum(r.restored_last for r in k)}/{len(k)}", str(len(f.cancels)),
                     _span([c.reaction_ms for c in f.cancels]),
                     f"{sum(c.resurrected for c in f.cancels)}/{len(f.cancels)}",
                     f"{sum(c.crashed for c in f.cancels)}/{len(f.cancels)}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"Flink 2.3.0, 2 JobManagers + 1 TaskManager, checkpoint every 500 ms; "
             f"ZooKeeper session timeout 6 s, jobreg lease {lease:g} s."]
    for f in figures:
        if f.record_lag_ms is not None:
            notes.append(f"{f.backend}: a plain cancel's end is recorded in jobreg "
                         f"{f.record_lag_ms:.0f} ms after the CANCELED log line.")
        for c in f.cancels:
            if c.crashed:
                notes.append(f"{f.backend}: after cancel-then-kill the new leader crashed: "
                             f"{c.crash}")
        if f.error:
            notes.append(f"{f.backend}: stopped early: {f.error}")
    return "\n".join(lines + [""] + notes)
