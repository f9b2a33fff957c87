"""A real Flink 2.3 cluster on jobreg's high-availability backend fails over (issue 37, point 4).

Two JobManagers (``StandaloneSessionClusterEntrypoint``) and one TaskManager, each a JVM
(:class:`registry.dev.flink.FlinkCluster`), with ``high-availability.type`` set to jobreg's
factory on the session's broker, and the streaming job of ``tests/support/flink`` (keyed
state, a checkpoint every 500 ms). One cluster serves the module; each test leaves both
JobManagers running (a killed one is started again as the standby). In order ((c) runs
last: see its docstring):

(a) the leader is SIGKILLed: the standby leads, the job runs again, and its checkpoints go on
    from the last one completed before the kill;
(b) the leader is SIGSTOPped past its lease, then resumed (seed 000's long pause): the
    standby led meanwhile; the resumed JobManager loses its leadership and deploys nothing,
    and what it still tried to write was refused;
(c) a job is cancelled and the leader SIGKILLed the moment its log says CANCELED (seed 001's
    window, where Flink's ZooKeeper backend runs the job again): the job stays cancelled;
(d) a job whose execution plan cannot be read back fails alone on the new leader (seed 003):
    RECOVERY_FAILED in the registry with its error; the other job and the cluster run on.

(e) a task of the job fails twice and Flink restarts the job each time (issue 42, finding 4);
(f) a job is cancelled while Flink waits to restart it, and the leader SIGKILLed the moment
    its log says the job is CANCELED: the job stays cancelled (seed 001 where the adaptive
    scheduler's graph was already cancelled by its restart);
(g) a bounded job FINISHES and the leader is SIGKILLed the moment its log says so, at the
    execution graph's line and at the Dispatcher's (seed 001's month-old finished job, issue
    43 item 4): the new leader does not run it again, and the registry holds it FINISHED;
(h) a job is stopped with a savepoint (with ``--drain`` and without) and the leader SIGKILLed
    as the stop is triggered, as its savepoint completes, or as the job FINISHES: the job is
    either running from a checkpoint on the new leader and live in jobreg, or stopped
    (FINISHED in both), never both and never lost.

Each scenario runs under both of Flink's schedulers for streaming jobs (the module's cluster is
parametrized: ``default``, the ``DefaultScheduler``, which keeps one execution graph for a
job's life, and ``adaptive``, the ``AdaptiveScheduler``, whose ``Restarting`` state cancels the
graph and builds a new one on every restart). After each, the registry is checked against
Flink (:func:`_agrees`): the job is live in jobreg while Flink runs it (``jobreg jobs``
lists it ACTIVE), checkpoints complete with ids above every id before the restart or the
failover, the registry's newest completed checkpoint follows them, and no record of the job was
refused ``terminal_job`` (the adaptive scheduler's restarts once ended the job in jobreg:
every checkpoint trigger then failed so, for ever). ``Registry.timeline`` of the job is printed.
The same scenarios time Flink's own ZooKeeper backend in ``jobreg bench flink-failover``.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
import shutil
import time
import urllib.error
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import main
from registry.dev.bench_flink import (
    FlinkBenchError,
    cancel_then_kill,
    completed_checkpoints,
    ensure_backend_jar,
    fatal_cause,
    finish_then_kill,
    kill_leader,
    pause_leader,
    running_since,
    stop_then_kill,
    wait_checkpoints,
)
from registry.dev.flink import FlinkCluster, granted_at

_MISSING = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(_MISSING), reason=f"Flink's failover test needs "
                       f"{', '.join(_MISSING)} (a JDK 17 and Maven) on PATH"),
]

LEASE = 3.0  # seconds: the backend's lease; (b) pauses the leader past it
RESTART_DELAY = "2 s"  # Flink's wait before a restart; (f) cancels within it
RETAINED = 3  # state.checkpoints.num-retained: a new leader recovers as many (issue 43)
RESCALE_AT_ONCE = {"jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling": "0 s",
                   "jobmanager.adaptive-scheduler.executing.resource-stabilization-timeout":
                       "1 s",
                   "jobmanager.adaptive-scheduler.rescale-trigger.max-delay": "1 s"}


@pytest.fixture(scope="module", params=["default", "adaptive"])
def flink(request, broker, tmp_path_factory) -> Iterator[FlinkCluster]:
    """Two JobManagers and a TaskManager on jobreg's backend, on the session's broker, with
    ``jobmanager.scheduler`` of the parameter: every test of the module runs once on each."""
    try:
        jar = ensure_backend_jar()
    except FlinkBenchError as e:
        pytest.fail(str(e))
    scheduler = request.param
    cluster = FlinkCluster(ha="jobreg", bootstrap=broker.bootstrap, backend_jar=jar,
                           lease=LEASE, directory=tmp_path_factory.mktemp(f"flink-{scheduler}"),
                           startup_timeout=90, scheduler=scheduler,
                           config={"restart-strategy.fixed-delay.delay": RESTART_DELAY,
                                   "state.checkpoints.num-retained": str(RETAINED),
                                   # (adaptive only) a rescale at once, not 30 s after the
                                   # job started
                                   **RESCALE_AT_ONCE})
    print(f"Flink cluster with jobmanager.scheduler {scheduler}")
    with cluster:
        yield cluster


@pytest.fixture(scope="module")
def registry(flink) -> Iterator[Registry]:
    """A reader of the cluster's namespace (the backend's cluster id)."""
    reg = Registry.connect(flink.bootstrap or "", flink.namespace)
    yield reg
    reg.close()


@pytest.fixture(autouse=True)
def _cancels_what_it_left(flink) -> Iterator[None]:
    """A test that fails before its own cancel leaves its job running on the cluster the
    module shares, holding a task slot the next test's job then waits for: cancel every job
    a test left running (one failure stays one failure)."""
    before: set[str] | None = None
    with contextlib.suppress(Exception):
        before = set(flink.jobs(flink.leader(timeout=30)))
    yield
    if before is None:  # no leader to ask before the test: touch nothing
        return
    with contextlib.suppress(Exception):
        leader = flink.leader(timeout=30)
        for job, status in flink.jobs(leader).items():
            if job not in before and status not in ("CANCELED", "FINISHED", "FAILED"):
                flink.cancel(leader, job)


def _running_job(flink: FlinkCluster, name: str) -> str:
    leader = flink.leader()
    job = flink.submit(leader, name)
    flink.wait_for(f"{name} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    wait_checkpoints(flink, leader, job, 2)
    return job


def _newest_checkpoint(flink: FlinkCluster, registry: Registry, job: str) -> int:
    """The newest completed checkpoint id of the job that the registry or any JobManager's
    log knows (-1: none)."""
    ids = [i for jm in flink.jobmanagers for _, i in completed_checkpoints(jm, job)]
    return max([registry.job(job).checkpoints.last_completed, *ids])


def _agrees(flink: FlinkCluster, registry: Registry, job: str, *, above: int) -> list[int]:
    """The registry against Flink, after a restart or a failover: the leader runs the job and
    the registry has it live (``jobreg jobs`` too); two checkpoints complete on the leader
    with ids above ``above``, increasing; the registry's newest completed checkpoint reaches
    them; no record of the job was refused ``terminal_job``. Returns the ids, printed."""
    leader = flink.leader()
    flink.wait_for(f"{job} RUNNING on {leader.name}",
                   lambda: flink.job_status(leader, job) == "RUNNING")
    view = registry.job(job)
    assert view.live, f"Flink runs {job} on {leader.name}; the registry says {view.status}"
    ids = flink.wait_for(
        f"two checkpoints of {job} above {above} on {leader.name}",
        lambda: len(c := [i for _, i in completed_checkpoints(leader, job) if i > above]) >= 2
        and c)
    assert ids == sorted(set(ids)), f"checkpoint ids not increasing: {ids}"
    newest = flink.wait_for(
        f"the registry's newest checkpoint of {job} at {ids[1]} or later",
        lambda: (n := registry.job(job).checkpoints.last_completed) >= ids[1] and n)
    view = registry.job(job)
    listed = _jobs_cli(flink)
    print(f"{flink.scheduler}: Flink runs {job} on {leader.name}, checkpoints {ids[:4]}...; "
          f"the registry: {view.status}, owner epoch {view.owner_epoch}, newest checkpoint "
          f"{newest}; jobreg jobs: {listed.get(job, {}).get('status')}")
    assert view.live and view.owner_epoch is not None, view
    assert listed.get(job, {}).get("status") == "ACTIVE", listed
    refused = [d for d in registry.rejected() if d.job_id == job and d.reason == "terminal_job"]
    assert refused == [], f"records of a job Flink runs refused as terminal: {refused[:3]}"
    return ids


def _terms(registry: Registry) -> list[str]:
    """The namespace's leadership terms (``jobreg terms``), printed: grant, and how each
    ended (revoked, superseded)."""
    terms = registry.terms()
    print("terms:")
    for t in terms:
        print(f"  epoch {t.epoch} {t.leader}: {t.started}; {t.ended} "
              f"(offsets {t.first_offset}-{t.last_offset})")
    return [t.end for t in terms]


def _story(registry: Registry, job: str) -> list[str]:
    """The job's timeline as ``event_type/outcome`` strings, printed for the log."""
    found = registry.timeline(job)
    print(f"timeline of {job}:")
    for d in found:
        print(f"  {d.offset:>6} {d.event_type:<24} epoch {d.epoch} {d.outcome} "
              f"{d.reason or ''} {d.detail}")
    return [f"{d.event_type}/{d.outcome}" for d in found]


def test_a_killed_leader_hands_over_and_checkpoints_go_on(flink, registry) -> None:
    job = _running_job(flink, "seed-kill")
    run = kill_leader(flink, job)
    print(run)
    assert run.restored_last, (f"the new leader restored checkpoint {run.restored}; the last "
                               f"completed before the kill was {run.last_before_kill}")
    assert flink.job_status(flink.leader(), job) == "RUNNING"
    _agrees(flink, registry, job, above=run.last_before_kill)
    # num-retained: the new leader's store recovered what the killed one's held (at least
    # the two completed before the kill, at most RETAINED), and the registry keeps the newest
    # RETAINED (DefaultCompletedCheckpointStoreUtils logs "Found N checkpoints in <store>").
    new = next(jm for jm in flink.jobmanagers if jm.name == run.new_leader)
    found = [int(m.group(1)) for _, line in new.log_lines(rf"Found \d+ checkpoints in .*{job}")
             if (m := re.search(r"Found (\d+) checkpoints", line))]
    print(f"num-retained {RETAINED}: the new leader found {found} checkpoints of {job}")
    assert found and 2 <= found[-1] <= RETAINED, found
    # one reading of the job (checkpoints go on between two readings)
    state = flink.wait_for(
        f"the registry retaining {RETAINED} checkpoints of {job}",
        lambda: len((s := registry.job(job).checkpoints).retained) == RETAINED and s)
    ids = [c.checkpoint_id for c in state.retained]
    assert ids == sorted(ids) and ids[-1] == state.last_completed, (ids, state.last_completed)
    story = _story(registry, job)
    assert any(s.startswith("JobSubmitted/") for s in story)
    assert any("Checkpoint" in s and "ACCEPTED" in s for s in story)
    ends = _terms(registry)  # the killed leader's term ended, the standby's is current
    assert ends[-1] == "current" and len(ends) >= 2 and ends[-2] in ("revoked", "superseded")
    flink.cancel(flink.leader(), job)


def test_a_paused_leader_is_refused_and_deploys_nothing(flink, registry) -> None:
    job = _running_job(flink, "seed-000-pause")
    before = _newest_checkpoint(flink, registry, job)
    run = pause_leader(flink, job)
    print(run)
    assert run.standby_led_after >= LEASE * 0.5, "the standby led before the lease could end"
    assert run.revoked_after_resume is not None or run.exited
    assert run.deployed_after_resume == [], "the resumed JobManager acted as leader"
    paused = next(jm for jm in flink.jobmanagers if jm.name == run.paused)
    ended = paused.log_lines(r"jobreg revoked leadership|Leadership of epoch \d+ ends here")
    print("the resumed JobManager's own account:", *[line for _, line in ended], sep="\n  ")
    assert ended, "the resumed JobManager's log does not say its term ended"
    rejected = [d for d in registry.rejected() if d.reason == "stale_epoch"]
    print("refusals in the resumed JobManager's log:", *run.refusals, sep="\n  ")
    print("records the fold refused:", *rejected, sep="\n  ")
    for jm in flink.jobmanagers:
        if not jm.is_running():
            flink.restart(jm)
    assert flink.job_status(flink.leader(), job) == "RUNNING"
    # In the log: once the standby's term wrote for the job, no record of an older term
    # about the job was accepted (the resumed JobManager wrote nothing that stuck).
    found = registry.timeline(job)
    _story(registry, job)
    newest = max(d.epoch for d in found if d.epoch is not None)
    first_new = min(d.offset for d in found if d.epoch == newest)
    stale = [d for d in found if d.offset > first_new and d.epoch is not None
             and d.epoch < newest and d.accepted]
    assert stale == [], stale
    ends = _terms(registry)  # the paused leader's term ended before the standby's began
    assert ends[-1] == "current" and ends[-2] in ("revoked", "superseded")
    # The job usually restarts once on the new leader after the resume (a TaskManager
    # disconnect queued during the pause): the adaptive scheduler's restart once ended it in
    # jobreg ("no live jobs; 1 ended" while Flink ran it).
    _agrees(flink, registry, job, above=before)
    flink.cancel(flink.leader(), job)


def _plan_files(flink: FlinkCluster, name: str) -> list[pathlib.Path]:
    """The execution-plan files in storageDir that hold the job called ``name``."""
    needle = name.encode()
    return [p for p in flink.storage_dir.rglob("*") if p.is_file()
            and "completedCheckpoint" not in p.name and "/blob/" not in p.as_posix()
            and needle in p.read_bytes()]


def _jobs_cli(flink: FlinkCluster) -> dict[str, dict]:
    """``jobreg jobs --json`` of the cluster's namespace, by job id."""
    result = CliRunner().invoke(main, ["jobs", "--bootstrap", flink.bootstrap or "",
                                       "--namespace", flink.namespace, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return {j["job_id"]: j for j in json.loads(result.stdout)["jobs"]}


def test_a_job_whose_plan_cannot_be_read_fails_alone(flink, registry) -> None:
    """Seed 003: the new leader cannot deserialize one job's plan. flink-jobreg's
    JobregExecutionPlanStore records the job RECOVERY_FAILED with the error (``plan_failed``)
    and hands Flink's Dispatcher no plan for it, so the new leader recovers the other job
    and lives (on Flink's ZooKeeper backend the same plan ends every new leader)."""
    healthy = _running_job(flink, "seed-003-healthy")
    broken = _running_job(flink, "seed-003-broken")
    files = _plan_files(flink, "seed-003-broken")
    assert files, "no execution-plan file of the broken job in storageDir"
    for path in files:
        path.write_bytes(b"not a serialized execution plan")
    leader = flink.leader()
    others = [jm for jm in flink.jobmanagers if jm is not leader]
    flink.kill(leader)
    new = flink.leader(among=others)
    grant = granted_at(new)
    assert grant is not None
    flink.wait_for("the healthy job RUNNING on the new leader, or the new leader ended",
                   lambda: not new.is_running() or flink.job_status(new, healthy) == "RUNNING")
    if not new.is_running():
        flink.restart(leader)  # leave the module's cluster with a JobManager
        pytest.fail(f"the new leader {new.name} ended: {fatal_cause(new)}")
    wait_checkpoints(flink, new, healthy, 1)
    view = flink.wait_for("the broken job RECOVERY_FAILED in the registry",
                          lambda: (v := registry.job(broken)).status == "RECOVERY_FAILED"
                          and v)
    print(f"broken job: {view.status}: {view.error}")
    assert "ExecutionPlan" in (view.error or ""), view.error
    assert view.owner_epoch is None
    listed = _jobs_cli(flink)  # jobreg jobs
    assert listed[broken]["status"] == "RECOVERY_FAILED" and listed[broken]["error"]
    assert listed[healthy]["status"] == "ACTIVE"
    skipped = new.log_lines(rf"Execution plan of job {broken} cannot be recovered")
    print("the new leader's account:", *[line for _, line in skipped], sep="\n  ")
    assert skipped, "the new leader's log does not say it skipped the broken job"
    time.sleep(2.0)  # a fatal error would end the new leader within this
    assert new.is_running() and fatal_cause(new) is None, (
        f"the new leader went down with the broken job: {fatal_cause(new)}")
    assert flink.job_status(new, broken) is None  # Flink never ran it again
    flink.restart(leader)
    assert flink.job_status(new, healthy) == "RUNNING"
    _agrees(flink, registry, healthy, above=-1)
    story = _story(registry, broken)
    assert story[-1] == "JobRecoveryFailed/ACCEPTED", story
    flink.cancel(new, healthy)


def test_a_task_failure_restarts_the_job_and_the_registry_keeps_it(flink, registry) -> None:
    """Issue 42, finding 4: a task fails, twice, and Flink restarts the job each time on the
    same leader. The default scheduler keeps its execution graph (RUNNING, RESTARTING,
    RUNNING); the adaptive scheduler cancels it (RUNNING, CANCELLING, CANCELED) and runs a new
    one. Either way the job stays live in jobreg and checkpoints go on with higher ids."""
    name = "task-failure"
    fail = flink.fail_file(name)
    leader = flink.leader()
    job = flink.submit(leader, name, fail_file=fail)
    flink.wait_for(f"{name} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    wait_checkpoints(flink, leader, job, 2)
    for restart in (1, 2):
        above = _newest_checkpoint(flink, registry, job)
        failed_at = flink.fail_task(fail)
        flink.wait_for(f"{job} running again after task failure {restart}",
                       lambda: running_since(leader, job, failed_at))  # noqa: B023
        how = [line.split(" - ", 1)[-1] for t, line in leader.log_lines(
            rf"\({job}\) switched from state RUNNING to (RESTARTING|CANCELLING)")
            if t >= failed_at]
        print(f"{flink.scheduler}, task failure {restart}: {how}")
        assert how, f"{leader.name}'s log shows no restart of {job}"
        if flink.scheduler == "adaptive":  # the graph was replaced: what once ended the job
            assert "CANCELLING" in how[0], how
        _agrees(flink, registry, job, above=above)
    assert flink.leader() is leader
    _story(registry, job)
    flink.cancel(leader, job)
    flink.wait_for(f"{job} CANCELED", lambda: flink.job_status(leader, job) == "CANCELED")
    flink.wait_for(f"{job} ended in the registry", lambda: not registry.job(job).live)
    assert registry.job(job).status == "CANCELLED", registry.job(job)


def test_a_cancel_during_a_restart_survives_a_kill_at_the_canceled_line(flink, registry
                                                                     ) -> None:
    """A task fails; while Flink waits out the restart delay the job is cancelled, and the
    leader is SIGKILLed the moment its log says the job is CANCELED. The default scheduler's
    graph is RESTARTING and enters CANCELLING from the cancel (the graph's listener records
    it). The adaptive scheduler's graph was already cancelled by its ``Restarting`` state: the
    cancel moves the scheduler to ``Canceling`` with no graph transition, and its "reached
    terminal state CANCELED" line comes a main-thread task later; jobreg's event reporter
    records the cancel at the scheduler's CANCELLING, before it. Without the reporter the new
    leader ran the job again, 3 of 3 times."""
    name = "cancel-in-restart"
    fail = flink.fail_file(name)
    leader = flink.leader()
    job = flink.submit(leader, name, fail_file=fail)
    flink.wait_for(f"{name} RUNNING", lambda: flink.job_status(leader, job) == "RUNNING")
    wait_checkpoints(flink, leader, job, 2)
    others = [jm for jm in flink.jobmanagers if jm is not leader]
    restart_line = (rf"\({job}\) switched from state CANCELLING to CANCELED"
                    if flink.scheduler == "adaptive"
                    else rf"\({job}\) switched from state RUNNING to RESTARTING")
    end_line = (rf"Job {job} reached terminal state CANCELED|"
                rf"\({job}\) switched from state CANCELLING to CANCELED")
    killer: list = []

    def cancel(_line: str) -> None:  # the restart began: cancel within its delay
        killer.append(flink.watch(leader, end_line, lambda _l: flink.kill(leader)))
        with contextlib.suppress(OSError):  # the kill may beat the answer
            flink.cancel(leader, job)

    canceller = flink.watch(leader, restart_line, cancel)
    failed_at = flink.fail_task(fail)
    try:
        assert canceller.wait(60), f"{leader.name} never logged the restart of {job}"
        assert killer and killer[0].wait(60), f"{leader.name} never logged {job} CANCELED"
    finally:
        canceller.stop()
        for watcher in killer:
            watcher.stop()
    ran_again = running_since(leader, job, failed_at)
    print(f"{flink.scheduler}: cancelled during the restart (ran again before the kill: "
          f"{bool(ran_again)}); killed at: {killer[0].line.split(' - ', 1)[-1] if killer[0].line else None}")
    assert not ran_again, "the cancel came after the restart: not the case under test"
    new = flink.leader(among=others)
    grant = granted_at(new)
    assert grant is not None
    flink.wait_for(f"{new.name} recovering its jobs",
                   lambda: not new.is_running() or [t for t, _ in new.log_lines(
                       r"Successfully recovered \d+ persisted job graphs") if t >= grant])
    time.sleep(5.0)
    resurrected = running_since(new, job, grant)
    state = flink.job_status(new, job) if new.is_running() else None
    if resurrected:  # free its slot for the next test before failing
        flink.cancel(new, job)
        flink.wait_for("the resurrected job cancelled",
                       lambda: flink.job_status(new, job) == "CANCELED")
    flink.restart(leader)
    assert not resurrected, f"the new leader ran the cancelled job again ({state})"
    assert new.is_running() and fatal_cause(new) is None, fatal_cause(new)
    view = registry.job(job)
    _story(registry, job)
    assert not view.live and view.status == "CANCELLED", view


def _epoch(registry: Registry) -> int:
    return max(t.epoch for t in registry.terms())


def _finished_epochs(registry: Registry, job: str) -> list[int]:
    return [d.epoch for d in registry.timeline(job)
            if d.event_type == "JobTerminated" and d.accepted]


def test_a_finished_job_survives_a_kill_at_the_dispatchers_finished_line(flink,
                                                                          registry) -> None:
    """(g) Seed 001's month-old finished job: a bounded job (120 records, 6 s) FINISHES and
    the leader is SIGKILLed the moment the Dispatcher logs "reached terminal state FINISHED"
    (after which Flink writes its job result). flink-jobreg's listener records the end
    synchronously on the JobMaster's thread as the execution graph reaches FINISHED, before the
    graph's termination future completes, so before that line: the new leader finds the job
    ended and never runs it again."""
    leader = flink.leader()
    job = flink.submit(leader, "seed-001-bounded-dispatcher", records=120)
    run = finish_then_kill(flink, job, at="dispatcher", settle=5.0)
    print(run)
    assert not run.resurrected, f"the new leader ran the finished job again ({run.new_state})"
    assert run.new_state in (None, "FINISHED"), run
    _story(registry, job)
    ends = _finished_epochs(registry, job)
    assert len(ends) == 1 and ends[0] < _epoch(registry), ends  # the killed leader's record
    view = registry.job(job)
    assert not view.live and view.status == "FINISHED", view
    assert run.crash is None and not run.crashed, f"the new leader ended: {run.crash}"


def test_a_finished_job_killed_at_the_graphs_finished_line_is_never_lost(flink,
                                                                          registry) -> None:
    """(g) The same kill at the execution graph's own "switched from state RUNNING to
    FINISHED" line, the first that says it. Flink 2.3 logs that line before it tells any
    listener (``DefaultExecutionGraph.transitionState``: ``LOG.info`` at bytecode offset 88,
    ``notifyJobStatusChange`` at 109), so the end's record lands a bridge round trip after
    it, and a kill inside that window leaves a live job: the new leader runs it again from
    its last completed checkpoint, where a bounded job finishes at once, as Flink's own
    recovery would. Either way the job is recorded FINISHED exactly once, and once recorded
    it never runs again; which way it went is printed."""
    leader = flink.leader()
    job = flink.submit(leader, "seed-001-bounded-graph", records=120)
    run = finish_then_kill(flink, job, at="graph", settle=5.0, restart=False)
    last = [n for _, n in completed_checkpoints(leader, job)]  # the killed leader's log
    flink.restart(leader)
    print(run)
    _story(registry, job)
    new = flink.leader()
    ends = _finished_epochs(registry, job)
    if run.resurrected:
        flink.wait_for(f"{job} FINISHED again", lambda: flink.job_status(new, job) == "FINISHED")
        restored = [int(m.group(1)) for _, line in new.log_lines(
            rf"Restoring job {job} from Checkpoint \d+")
            for m in [re.search(r"from Checkpoint (\d+)", line)] if m]
        print(f"killed before the end's record landed: run again from checkpoint {restored} "
              f"(the last completed before the kill: {max(last, default=None)})")
        assert restored and last and restored[-1] >= max(last), (restored, last)
        ends = flink.wait_for("the end recorded", lambda: _finished_epochs(registry, job))
        assert len(ends) == 1 and ends[0] == _epoch(registry), ends  # the new leader's
    else:
        print("the end's record landed before the kill: not run again")
        assert len(ends) == 1 and ends[0] < _epoch(registry), ends  # the killed leader's
    view = registry.job(job)
    assert not view.live and view.status == "FINISHED", view
    assert run.crash is None and not run.crashed, f"the new leader ended: {run.crash}"


@pytest.mark.parametrize(("at", "drain"), [("triggered", False), ("savepoint", True),
                                           ("finished", False)])
def test_a_stop_with_savepoint_killed_midway_is_stopped_or_running(flink, registry, at,
                                                                   drain) -> None:
    """(h) ``flink stop [--drain]`` (``POST /jobs/<id>/stop``) and a SIGKILL of the leader at
    ``at``: as the Dispatcher triggers the stop, as the savepoint's completion is logged (the
    savepoint on disk, the job not ended), or at the Dispatcher's FINISHED line. Until the
    execution graph ends, the stop has not happened: the new leader runs the job again from
    its last completed checkpoint (Flink's store never holds a savepoint:
    ``CheckpointCoordinator`` adds only checkpoints), and jobreg holds it live; once it
    ended, it is FINISHED in both and never runs again. Never both, never lost."""
    job = _running_job(flink, f"stop-{at}-{'drain' if drain else 'plain'}")
    run = stop_then_kill(flink, job, drain=drain, at=at, settle=5.0)
    print(run)
    _story(registry, job)
    view = registry.job(job)
    new = flink.leader()
    assert run.crash is None and not run.crashed, f"the new leader ended: {run.crash}"
    if at == "finished" or (at == "savepoint" and not view.live):
        # (at the savepoint's line the end may have landed before the kill, which came after
        # the line: then the stop happened)
        assert not run.resurrected, f"the new leader ran the stopped job again ({run.new_state})"
        assert run.new_state in (None, "FINISHED"), run
        assert not view.live and view.status == "FINISHED", view
        assert any(flink.savepoint_dir.rglob("_metadata")), "no savepoint written"
        return
    assert run.resurrected, f"the job neither stopped nor runs again ({run.new_state})"
    flink.wait_for(f"{job} RUNNING on {new.name}",
                   lambda: flink.job_status(new, job) == "RUNNING")
    assert view.live and view.status == "ACTIVE", view
    restored = [int(m.group(1)) for _, line in new.log_lines(rf"Restoring job {job} from "
                                                             rf"Checkpoint \d+")
                for m in [re.search(r"from Checkpoint (\d+)", line)] if m]
    print(f"killed at {at}: runs again, restored from checkpoint {restored}")
    assert restored, "the job ran again from no checkpoint"
    if at == "savepoint":
        m = re.search(r"Completed checkpoint (\d+)", run.line or "")
        assert m is not None, run.line
        assert restored[-1] < int(m.group(1)), (restored, run.line)
    _agrees(flink, registry, job, above=restored[-1])


def _parallelism(flink: FlinkCluster, jm, job: str) -> dict[str, int]:
    """``{vertex name: parallelism}`` of the job's running graph on ``jm``."""
    return {v["name"]: v["parallelism"] for v in flink.rest(jm, f"/jobs/{job}")["vertices"]}


def test_a_rescale_through_rest_survives_a_leader_kill(flink, registry) -> None:
    """Issue 43 item 1: ``PUT /jobs/<id>/resource-requirements`` (FLIP-291, what the Kubernetes
    operator's autoscaler sends) under the adaptive scheduler rescales the keyed vertex from 1
    to 2; jobreg records it as a ``JobRescaled``, not a replace of the plan; the leader is
    killed, and the new leader runs the job at 2 with the same requirements, checkpointing on.
    Under the default scheduler Flink's JobMaster refuses the request, after the Dispatcher
    stored the requirements (in jobreg as in Flink's own store); the job runs on at 1."""
    job = _running_job(flink, "rescale")
    leader = flink.leader()
    names = {v["id"]: v["name"] for v in flink.rest(leader, f"/jobs/{job}")["vertices"]}
    keyed = next(v for v, name in names.items() if "Source" not in name)
    if flink.scheduler != "adaptive":  # Flink answers neither a GET nor a PUT
        wanted = {v: {"parallelism": {"lowerBound": 1, "upperBound": 2 if v == keyed else 1}}
                  for v in names}
        for method, body in (("GET", None), ("PUT", wanted)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                flink.rest(leader, f"/jobs/{job}/resource-requirements", method=method,
                           body=body)
            print(f"default scheduler: Flink answers {method} with {refused.value.code}")
        # Flink's Dispatcher validated and stored the requirements before its JobMaster
        # refused them (2.3.0's Dispatcher.updateJobResourceRequirements: the store's
        # putJobResourceRequirements, then the JobMaster's update): jobreg holds what Flink's
        # own store would, and the default scheduler reads none of it.
        assert "JobRescaled/ACCEPTED" in _story(registry, job)
        assert _parallelism(flink, leader, job)[names[keyed]] == 1
        flink.cancel(leader, job)
        return
    wanted = flink.rest(leader, f"/jobs/{job}/resource-requirements")
    wanted[keyed] = {"parallelism": {"lowerBound": 1, "upperBound": 2}}
    flink.rest(leader, f"/jobs/{job}/resource-requirements", method="PUT", body=wanted)
    flink.wait_for(f"{job} at parallelism 2 on {leader.name}",
                   lambda: _parallelism(flink, leader, job)[names[keyed]] == 2
                   and flink.job_status(leader, job) == "RUNNING", timeout=90)
    recorded = {r.vertex_id: (r.lower_bound, r.upper_bound)
                for r in registry.job(job).checkpoints.requirements}
    assert recorded[keyed] == (1, 2), recorded
    story = _story(registry, job)
    assert "JobRescaled/ACCEPTED" in story, story
    before = _newest_checkpoint(flink, registry, job)
    run = kill_leader(flink, job)
    print(run)
    new = flink.leader()
    assert flink.rest(new, f"/jobs/{job}/resource-requirements") == wanted
    flink.wait_for(f"{job} at parallelism 2 on {new.name}",
                   lambda: _parallelism(flink, new, job)[names[keyed]] == 2
                   and flink.job_status(new, job) == "RUNNING", timeout=90)
    print(f"after the kill: {new.name} runs {job} at {_parallelism(flink, new, job)}")
    _agrees(flink, registry, job, above=before)
    assert registry.job(job).checkpoints.requirements == \
        tuple(sorted(registry.job(job).checkpoints.requirements, key=lambda r: r.vertex_id))
    flink.cancel(new, job)


def test_a_cancel_survives_a_kill_at_the_canceled_line(flink, registry) -> None:
    """Seed 001: flink-jobreg records the cancel when the execution graph enters CANCELLING,
    synchronously on the JobMaster's thread, so the record is in the log before the CANCELED
    line is written, and a leader killed at that line leaves a cancelled job.

    The module's last test: while the new leader ends (the expected failure below), the
    job's dirty result stays, and every later leader ends on it the same way."""
    job = _running_job(flink, "seed-001-cancel")
    run = cancel_then_kill(flink, job, settle=5.0)
    print(run)
    if run.resurrected:  # free its slot for the next test before failing
        leader = flink.leader()
        flink.cancel(leader, job)
        flink.wait_for("the resurrected job cancelled",
                       lambda: flink.job_status(leader, job) == "CANCELED")
    assert not run.resurrected, f"the new leader ran the cancelled job again ({run.new_state})"
    assert run.new_state in (None, "CANCELED")
    _terms(registry)
    story = _story(registry, job)
    assert any(s.startswith("JobCancelled/ACCEPTED") for s in story), story
    assert not registry.job(job).live, registry.job(job)
    assert not run.crashed, f"the new leader ended: {run.crash}"
    # The fatal error is logged before the JVM has exited: ``crash``, not ``crashed``. Flink
    # 2.3's Dispatcher.onStart ends a leader that recovers a dirty job result belonging to no
    # recovered application and no dirty application result, which is what jobreg's early
    # record of the cancel leaves; JobregApplicationResultStore supplies the latter.
    assert run.crash is None, f"the cancel held, but the new leader ended: {run.crash}"


def test_the_audit_views_tell_the_story(flink, registry, tmp_path) -> None:
    """After the failovers above, the SQL audit views of the cluster's namespace tell them:
    every term and how it ended, every job's records, and no resurrection (the view the fold
    keeps empty for every correct log)."""
    import sqlalchemy as sa

    from consumers.audit_job import materialize

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    run = materialize(url, flink.bootstrap or "", registry.topic, engine="plain", mode="once")
    assert run.records > 0, run
    engine = sa.create_engine(url)
    ns = {"ns": flink.namespace}
    with engine.connect() as db:
        terms = db.execute(sa.text(
            "SELECT epoch, leader, ended_by FROM leadership_terms WHERE namespace = :ns "
            "ORDER BY epoch"), ns).all()
        jobs = db.execute(sa.text(
            "SELECT job_id, COUNT(*) FROM job_history WHERE namespace = :ns GROUP BY job_id"),
            ns).all()
        resurrections = db.execute(sa.text(
            "SELECT job_id FROM resurrections WHERE namespace = :ns"), ns).all()
    engine.dispose()
    print("terms:", terms)
    print("jobs:", jobs)
    # (a), (b), (d) and (c) each took the leadership from its holder at least once.
    assert len(terms) >= 5, terms
    assert all(t.ended_by in ("REVOKED", "SUPERSEDED") for t in terms[:-1]), terms
    assert terms[-1].ended_by is None, terms
    assert len(jobs) >= 5 and all(count >= 2 for _, count in jobs), jobs
    assert resurrections == [], resurrections
