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


def run_demo(out: Out = print) -> list[Verdict]:
    """Play the incidents on a fresh embedded broker; return the verdicts (printing as it goes)."""
    started = time.monotonic()
    verdicts: list[Verdict] = []
    out("starting the embedded broker (Tansu, in memory) ...")
    with EmbeddedBroker() as broker:
        for play in (_play_000, _play_001, _play_002):
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
