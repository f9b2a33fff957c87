"""``jobreg demo``: the incidents of the seeds, played live against an embedded broker.

Each incident runs in its own namespace with separate clients (each its own
:class:`~registry.client.Registry`, with its own consumer and producers, as
separate coordinator processes would have), with threads giving the
interleaving from the incident report. The demo checks its own guarantees by
reading the log afresh and returns one :class:`Verdict` per guarantee.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .broker import EmbeddedBroker
from .client import Registry
from .codec import encode
from .errors import Fenced, WriteRejected
from .events import InlineGraph, JobLockReleased, JobSubmitted, JobTerminated, new_event_id, now_ms
from .image import Decision
from .keys import job_key, lock_key
from .log import write_raw

__all__ = ["Verdict", "run_demo"]

Out = Callable[[str], None]


@dataclass(frozen=True)
class Verdict:
    """One guarantee the demo checked: which incident, what, and whether it held."""

    incident: str
    guarantee: str
    held: bool


def _refusals(out: Out, decisions: list[Decision]) -> None:
    for d in decisions:
        out(f"      refused  offset {d.offset:>4}  {d.event_type:<16} by {d.writer:<6} "
            f"epoch {d.epoch}: {d.reason} ({d.detail})")


def _zombie(reg: Registry, cls, key: str, epoch: int, writer: str, **payload) -> None:
    event = cls(event_id=new_event_id(), namespace=reg.namespace, epoch=epoch, writer=writer,
                created_at=now_ms(), **payload)
    write_raw(reg.bootstrap, reg.topic, reg.partition, key, encode(event))


def _play_000(bootstrap: str, out: Out) -> list[Verdict]:
    out("000  GC pause: revoke and grant ran concurrently")
    out("     Flink: the old leader's late release let the cancelled job be recovered after a "
        "restart, and its deleted blob crashed the cluster.")
    jm1 = Registry.connect(bootstrap, "incident-000")
    t1 = jm1.claim_leadership("jm-1")
    t1.submit("job-a", b"graph of job-a")
    woke = threading.Event()
    late: list[BaseException] = []

    def paused_leader() -> None:  # jm-1 in a long GC pause
        woke.wait(30)
        for op in (lambda: t1.release("job-a"), lambda: t1.terminate("job-a", "FINISHED")):
            try:
                op()
            except BaseException as e:  # noqa: B036 - reported below
                late.append(e)

    th = threading.Thread(target=paused_leader)
    th.start()
    jm2 = Registry.connect(bootstrap, "incident-000")
    t2 = jm2.claim_leadership("jm-2")
    t2.adopt("job-a")
    woke.set()  # the GC pause ends after the new grant
    th.join(60)
    t2.cancel("job-a", "user cancel")
    _zombie(jm1, JobLockReleased, lock_key(jm1.namespace, "job-a"), 1, "jm-1", job_id="job-a")
    restarted = Registry.connect(bootstrap, "incident-000")  # a restart folds from the start
    t3 = restarted.claim_leadership("jm-3")
    live = restarted.jobs()
    out(f"     jobreg: jm-2 took epoch {t2.epoch}; jm-1's late writes were refused; after a "
        f"restart jm-3 (epoch {t3.epoch}) sees live jobs {sorted(live) or 'none'}.")
    _refusals(out, restarted.rejected())
    for reg in (jm1, jm2, restarted):
        reg.close()
    return [
        Verdict("000", "late release and remove of the old term are fenced",
                len(late) == 2 and all(isinstance(e, Fenced) for e in late)),
        Verdict("000", "a cancelled job is not live after a restart", "job-a" not in live),
    ]


def _play_001(bootstrap: str, out: Out) -> list[Verdict]:
    out("001  a job finished a month ago, its graph left behind")
    out("     Flink: the new leader recovered it with the running job; both fought for slots.")
    reg = Registry.connect(bootstrap, "incident-001")
    t1 = reg.claim_leadership("jm-1")
    t1.submit_many([("job-old", b"old graph"), ("job-run", b"running graph")])
    t1.terminate("job-old", "FINISHED")
    jm2 = Registry.connect(bootstrap, "incident-001")
    t2 = jm2.claim_leadership("jm-2")
    refused_resubmit = False
    try:
        t2.submit("job-old", b"old graph")  # the left-behind graph, resubmitted
    except WriteRejected as e:
        refused_resubmit = e.reason == "terminal_job"
    _zombie(reg, JobSubmitted, job_key(reg.namespace, "job-old"), 1, "jm-1", job_id="job-old",
            graph=InlineGraph(b"old graph"))
    fresh = Registry.connect(bootstrap, "incident-001")
    live = fresh.jobs()
    out(f"     jobreg: after failover to epoch {t2.epoch} the live jobs are {sorted(live)}; "
        "resubmitting the finished id is refused.")
    _refusals(out, reg.rejected())
    for r in (reg, jm2, fresh):
        r.close()
    return [Verdict("001", "a finished job never comes back",
                    refused_resubmit and set(live) == {"job-run"})]


def _play_002(bootstrap: str, out: Out) -> list[Verdict]:
    out("002  does leadership give mutual exclusion on the job set?")
    out("     Flink: no; the old leader removed a job after the new leader had taken it over.")
    old = Registry.connect(bootstrap, "incident-002")
    t1 = old.claim_leadership("jm-old")
    t1.submit("job-x", b"graph v1")
    new = Registry.connect(bootstrap, "incident-002")
    t2 = new.claim_leadership("jm-new")
    t2.adopt("job-x")
    fenced = False
    try:
        t1.terminate("job-x", "FAILED", "old leader removes its job graph")
    except Fenced:
        fenced = True
    _zombie(old, JobTerminated, job_key(old.namespace, "job-x"), 1, "jm-old", job_id="job-x",
            state="FAILED")
    view = new.job("job-x")
    out(f"     jobreg: job-x is {view.status}, held by epoch {view.owner_epoch}; the old "
        "leader's removal was refused by epoch, not by timing.")
    _refusals(out, new.rejected())
    old.close()
    new.close()
    return [Verdict("002", "a stale leader cannot remove a job the new leader holds",
                    fenced and view.live and view.owner_epoch == t2.epoch)]


def _play_003(bootstrap: str, out: Out) -> list[Verdict]:
    out("003  one job throws during recovery")
    out("     Flink: the leader exited, every standby did the same, and the cluster never started "
        "again until the HA store was wiped by hand.")
    old = Registry.connect(bootstrap, "incident-003")
    old.claim_leadership("jm-1").submit_many(
        [(f"job-{i:02d}", f"graph {i}".encode()) for i in range(20)])

    def initialize(job) -> None:  # the user's initialize-on-master
        if job.job_id == "job-07":
            raise RuntimeError("ClassNotFoundException in the job graph")

    new = Registry.connect(bootstrap, "incident-003")
    results = new.claim_leadership("jm-2").recover(initialize)
    failed = [r for r in results if not r.ok]
    out(f"     jobreg: {sum(r.ok for r in results)} jobs adopted; "
        + ", ".join(f"{r.job_id} {r.status} ({r.error})" for r in failed)
        + "; the leader carries on.")
    again = Registry.connect(bootstrap, "incident-003")
    second = again.claim_leadership("jm-3").recover(initialize)
    for r in (old, new, again):
        r.close()
    return [
        Verdict("003", "one job's recovery failure fails that job only",
                len(results) == 20 and [r.job_id for r in failed] == ["job-07"]),
        Verdict("003", "the next failover recovers the rest and leaves the failed job be",
                len(second) == 19 and all(r.ok for r in second)),
    ]


def _play_004(bootstrap: str, out: Out) -> list[Verdict]:
    out("004  a checkpoint discarded on the first decline")
    out("     Flink: a task still writing checkpoint 5 failed after the discard, and the job "
        "restarted over a checkpoint that no longer mattered.")
    reg = Registry.connect(bootstrap, "incident-004")
    term = reg.claim_leadership("jm-1")
    term.submit("job", b"graph", max_checkpoint_failures=1)  # one failure is tolerable
    term.checkpoint_triggered("job", 4)
    term.checkpoint_completed("job", 4, "file:///checkpoints/job/4")
    term.checkpoint_triggered("job", 5)
    first = term.checkpoint_failed("job", 5, "DECLINED", task="map-1")
    term.checkpoint_discarded("job", 5, "declined by map-1")
    late = term.checkpoint_failed("job", 5, "DECLINED", task="sink-3")
    view = reg.job("job")  # had the late failure counted, 2 > 1 would fail the job
    out(f"     jobreg: the first decline counted (1 of 1 tolerable); the late failure was "
        f"ignored ({late.ignored}); over budget: {view.over_budget}.")
    term.checkpoint_triggered("job", 6)
    term.checkpoint_completed("job", 6, "file:///checkpoints/job/6")
    after = reg.job("job").checkpoints.consecutive_failures
    reg.close()
    return [Verdict("004", "a failure of a discarded checkpoint is ignored",
                    first.ignored is None and late.ignored is not None
                    and "discarded" in late.ignored and not view.over_budget
                    and view.checkpoints.consecutive_failures == 1 and after == 0)]


def run_demo(out: Out = print) -> list[Verdict]:
    """Play the incidents on a fresh embedded broker; return the verdicts (printing as it goes)."""
    started = time.monotonic()
    verdicts: list[Verdict] = []
    out("starting the embedded broker (Tansu, in memory) ...")
    with EmbeddedBroker() as broker:
        for play in (_play_000, _play_001, _play_002, _play_003, _play_004):
            out("")
            verdicts += play(broker.bootstrap, out)
    out("")
    width = max(len(v.guarantee) for v in verdicts)
    out(f"{'incident':<9}{'guarantee':<{width}}  verdict")
    for v in verdicts:
        out(f"{v.incident:<9}{v.guarantee:<{width}}  {'held' if v.held else 'BROKEN'}")
    out(f"\n{sum(v.held for v in verdicts)}/{len(verdicts)} guarantees held "
        f"in {time.monotonic() - started:.1f} s")
    return verdicts
