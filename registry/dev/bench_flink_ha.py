"""``jobreg bench flink-ha``: Flink's own end-to-end HA test, in the manner of
``flink-end-to-end-tests/test-scripts/test_ha_datastream.sh``, on jobreg's backend.

Flink's script runs its DataStreamAllroundTestProgram (a sequence generator and a
semantics-checking operator, exactly-once, parallelism 4, simulated task failures) on a session
cluster with ZooKeeper HA, starts a watchdog that keeps one JobManager running (it starts a new
one whenever the running one dies), kills the leading JobManager three times, waits for the
job to run again after each, and then checks the logs: no semantic alert, checkpoints completed
and the job recovered after every kill.

Here, for each scheduler (``default`` and ``adaptive``): a :class:`~registry.dev.flink.FlinkCluster`
of two JobManagers and one TaskManager of 4 slots on jobreg (the embedded broker, or Apache
Kafka), the job ``tests/support/flink``'s ``HaVerifyJob`` (its verifier checks every key's
sequence in keyed state: no duplicate, no gap, nothing lost before a key's first number; each
violation a line of a file). Then ``kills`` times: a simulated task failure (the verifier
throws once; Flink restores the job from its last checkpoint), the job RUNNING again and a new
checkpoint; the leader SIGKILLed (:func:`~registry.dev.bench_flink.kill_leader`: the standby
leads, the job RUNNING again on it, a new checkpoint) and the killed JobManager started again as
the next standby (the watchdog). Passed: no violation, the job RUNNING at the end with
checkpoints after the last kill, and the registry's timeline of the job tells each failover
(each new leader's term has accepted records of the job).
"""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from registry.dev.bench_flink import (
    FailoverRun,
    FlinkBenchError,
    _jobreg_broker,
    _wait_standby,
    completed_checkpoints,
    ensure_backend_jar,
    kill_leader,
    running_since,
)
from registry.dev.flink import FlinkCluster
from registry.forensics import TermSummary
from registry.image import Decision

__all__ = ["HA_JOB", "HaRun", "bench_flink_ha", "format_flink_ha", "timeline_terms"]

#: The job of the test jar this bench runs.
HA_JOB = "org.jobreg.failover.HaVerifyJob"


@dataclass
class HaRun:
    """One scheduler's run."""

    scheduler: str
    backend: str
    job_id: str | None = None
    kills: list[FailoverRun] = field(default_factory=list)
    task_failures: list[float] = field(default_factory=list)
    """Seconds from each simulated task failure to the job RUNNING again."""
    violations: list[str] = field(default_factory=list)
    verified: int | None = None
    """Records the verifier checked since the job's last restore (its ``verified`` metric)."""
    checkpoints_after: int = 0
    """Checkpoints the last leader completed after the last kill."""
    final_state: str | None = None
    terms: list[str] = field(default_factory=list)
    """The registry's timeline of the job, one line per leader term that wrote for it."""
    error: str | None = None
    control: bool = False
    """The verifier of the run kept no keyed state (the control: it must find violations)."""

    @property
    def passed(self) -> bool:
        return (self.error is None and not self.violations and self.final_state == "RUNNING"
                and self.checkpoints_after > 0 and len(self.terms) >= len(self.kills) + 1)


def timeline_terms(decisions: list[Decision], terms: list[TermSummary]) -> list[str]:
    """The job's timeline (``Registry.timeline``) by leader term: for each term that wrote an
    accepted record of the job, its epoch, leader, and the record types with their counts,
    in order of first appearance."""
    leaders = {t.epoch: t.leader for t in terms}
    by_epoch: dict[int, dict[str, int]] = {}
    for d in decisions:
        if d.epoch is None or not d.accepted:
            continue
        kinds = by_epoch.setdefault(d.epoch, {})
        kind = d.event_type or "?"
        kinds[kind] = kinds.get(kind, 0) + 1
    return [f"epoch {epoch} ({leaders.get(epoch, '?')}): "
            + ", ".join(f"{kind} x{n}" for kind, n in kinds.items())
            for epoch, kinds in sorted(by_epoch.items())]


def _verified(flink: FlinkCluster, job_id: str, wait: float = 25.0) -> int | None:
    """The verifier's ``verified`` counter summed over its subtasks (Flink's REST API; a new
    leader's metric fetcher fills it within its update interval, 10 s: asked again until
    ``wait`` s passed)."""
    deadline = time.monotonic() + wait
    while True:
        got = _verified_once(flink, job_id)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(1.0)


def _verified_once(flink: FlinkCluster, job_id: str) -> int | None:
    jm = flink.leader()
    with contextlib.suppress(Exception):
        job = flink.rest(jm, f"/jobs/{job_id}")
        vertex = next(v["id"] for v in job["vertices"] if "verifier" in v["name"])
        names = flink.rest(jm, f"/jobs/{job_id}/vertices/{vertex}/subtasks/metrics")
        name = next(m["id"] for m in names if m["id"].endswith(".verified"))
        got = flink.rest(
            jm, f"/jobs/{job_id}/vertices/{vertex}/subtasks/metrics?get={name}&agg=sum")
        return int(float(got[0]["sum"]))
    return None


def _task_failure(flink: FlinkCluster, job_id: str, fail_file: pathlib.Path) -> float:
    """A simulated task failure; seconds until the job ran again and completed a checkpoint."""
    leader = flink.leader()
    at = flink.fail_task(fail_file)
    running = flink.wait_for(f"{job_id} RUNNING after the task failure",
                             lambda: running_since(leader, job_id, at), 120)
    flink.wait_for(f"a checkpoint of {job_id} after the task failure",
                   lambda: [t for t, _ in completed_checkpoints(leader, job_id) if t > running[0]],
                   120)
    return float(running[0]) - at


def _one(flink: FlinkCluster, run: HaRun, kills: int, bootstrap: str,
         progress: Callable[[str], None], control: bool) -> None:
    fail_file = flink.fail_file("ha")
    violations = flink.root / "violations.txt"
    leader = flink.leader()
    job = run.job_id = flink.submit(leader, "ha-datastream", fail_file=fail_file,
                                    main=HA_JOB, args=(str(violations),
                                                       *(("forgetful",) if control else ())))
    flink.wait_for(f"{job} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    flink.wait_for(f"3 checkpoints of {job}",
                   lambda: len(completed_checkpoints(leader, job)) >= 3, 120)
    for i in range(kills):
        took = _task_failure(flink, job, fail_file)
        run.task_failures.append(took)
        progress(f"{run.scheduler}: task failure {i + 1}/{kills}: RUNNING again after "
                 f"{took:.2f} s")
        k = kill_leader(flink, job)  # the watchdog: the killed JobManager starts again
        run.kills.append(k)
        progress(f"{run.scheduler}: kill {i + 1}/{kills} of {k.killed}: {k.new_leader} leads "
                 f"after {k.to_leadership:.2f} s, RUNNING after {k.to_running:.2f} s, a "
                 f"checkpoint after {k.to_checkpoint:.2f} s (restored {k.restored}, last "
                 f"before the kill {k.last_before_kill})")
        _wait_standby(flink)
    leader = flink.leader()
    since = time.time()
    flink.wait_for(f"3 checkpoints of {job} after the last kill", lambda: len(
        [t for t, _ in completed_checkpoints(leader, job) if t >= since]) >= 3, 120)
    run.checkpoints_after = len(completed_checkpoints(leader, job))
    run.final_state = flink.job_status(leader, job)
    run.verified = _verified(flink, job)
    if violations.exists():
        run.violations = [ln for ln in violations.read_text().splitlines() if ln.strip()]
    from registry import Registry

    reg = Registry.connect(bootstrap, flink.namespace)
    try:
        run.terms = timeline_terms(reg.timeline(job), reg.terms())
    finally:
        reg.close()


def bench_flink_ha(*, kills: int = 3, kafka: bool = False, lease: float = 5.0,
                   schedulers: tuple[str, ...] = ("default", "adaptive"),
                   control: bool = False,
                   progress: Callable[[str], None] = lambda _line: None) -> list[HaRun]:
    """The test once per scheduler, each on a fresh cluster, one broker for all (see the
    module docstring). ``control``: the verifier keeps what it saw in a field, not in keyed
    state, so its checks must fail after the first restore (each run is then expected to
    fail: the checks bite)."""
    jar = ensure_backend_jar(progress)
    out: list[HaRun] = []
    with tempfile.TemporaryDirectory(prefix="jobreg-flink-ha-") as work, \
            _jobreg_broker(kafka, progress) as bootstrap:
        for scheduler in schedulers:
            run = HaRun(scheduler, "jobreg (Kafka)" if kafka else "jobreg (embedded)",
                        control=control)
            out.append(run)
            try:
                with FlinkCluster(ha="jobreg", bootstrap=bootstrap, backend_jar=jar,
                                  lease=lease, slots=4, scheduler=scheduler,
                                  directory=pathlib.Path(work) / scheduler,
                                  progress=progress) as flink:
                    _one(flink, run, kills, bootstrap, progress, control)
            except (TimeoutError, FlinkBenchError) as e:
                run.error = str(e)
                progress(f"{scheduler}: stopped: {e}")
    return out


def format_flink_ha(runs: list[HaRun]) -> str:
    """The bench's report: a table of the runs, then each run's timeline by term."""
    head = ("scheduler", "backend", "kills", "to leader s", "to RUNNING s", "to checkpoint s",
            "task failures", "violations", "verified", "final", "passed")
    rows = [head]
    for r in runs:
        k = r.kills

        def span(values: list[float]) -> str:
            return f"{min(values):.1f}-{max(values):.1f}" if values else "-"

        rows.append((r.scheduler + (" (control)" if r.control else ""), r.backend, str(len(k)), span([x.to_leadership for x in k]),
                     span([x.to_running for x in k]), span([x.to_checkpoint for x in k]),
                     str(len(r.task_failures)), str(len(r.violations)),
                     "-" if r.verified is None else str(r.verified), r.final_state or "-",
                     "yes" if r.passed else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", "Flink 2.3.0, 2 JobManagers + 1 TaskManager (4 slots), HaVerifyJob at "
              "parallelism 4, a checkpoint every second; each kill a SIGKILL of the leader, "
              "the killed JobManager started again as the standby; seconds from the kill."]
    for r in runs:
        lines.append(f"{r.scheduler}: job {r.job_id}; the registry's timeline by term:")
        lines += [f"  {t}" for t in r.terms] or ["  (none read)"]
        lines += [f"  {v}" for v in r.violations[:10]]
        if r.error:
            lines.append(f"  stopped early: {r.error}")
    return "\n".join(lines)
