"""``jobreg demo``: the incidents of the seeds, played live against an embedded broker.

Each incident runs in its own namespace with real coordinator processes
(:mod:`registry.dev.coordinator`: each its own Python process with its own
:class:`~registry.client.Registry`), frozen with SIGSTOP for a GC pause or a
network blip and killed for a crash, in the interleaving of the incident
report. Then the audit stream (Spark, local mode) materializes the SQL views
into a SQLite file and the demo asks them the audit questions, writes one HTML
incident report per incident, and checks its own guarantees; it returns one
:class:`Verdict` per guarantee.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.client import Registry
from registry.dev.broker import EmbeddedBroker
from registry.dev.coordinator import CoordinatorProcess
from registry.image import Decision, Outcome

__all__ = ["Verdict", "fate", "jobreg_command", "run_demo"]

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


def _coordinators(bootstrap: str, namespace: str, *names: str,
                  registry_timeout: float = 10.0) -> list[CoordinatorProcess]:
    """Start one coordinator process per name, all at once (each starts in about a second)."""
    out: list[CoordinatorProcess | None] = [None] * len(names)
    errors: list[BaseException] = []

    def start(i: int, name: str) -> None:
        try:
            out[i] = CoordinatorProcess(bootstrap, namespace, name,
                                        registry_timeout=registry_timeout)
        except BaseException as e:  # noqa: B036 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(i, n)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for c in out:
            if c is not None:
                c.close()
        raise errors[0]
    return [c for c in out if c is not None]


def _decisions(bootstrap: str, namespace: str) -> list[Decision]:
    """Every verdict of the namespace's log, in log order (what a sentence is checked against)."""
    with Registry.connect(bootstrap, namespace) as reg:
        return reg.forensics().scan().decisions


def _verdict(d: Decision) -> str:
    if d.outcome == Outcome.REJECTED:
        return f"refused by the fold at offset {d.offset} ({d.reason})"
    if d.outcome == Outcome.IGNORED:
        return f"ignored by the fold at offset {d.offset} ({d.detail})"
    return f"{d.outcome.lower()} at offset {d.offset}"


def fate(reply: dict[str, Any], decisions: Sequence[Decision]) -> str:
    """What became of one write, said from what happened, to follow "was": the fold's verdict
    on its record in the log (found by offset or event id among ``decisions``, every verdict
    of the namespace) or, for a write the log does not hold, whether anything was sent and
    the client's answer. ``reply`` is a coordinator's (:mod:`registry.dev.coordinator`).

    >>> fate({"ok": False, "error": "Fenced", "reason": "stale_epoch", "event_ids": []}, [])
    'refused by its own client before sending (stale_epoch): it never reached the log'
    """
    by_offset = {d.offset: d for d in decisions}
    by_id = {d.event_id: d for d in decisions if d.event_id}
    if reply.get("ok"):
        d = by_offset.get(reply.get("offset", -1))
        return _verdict(d) if d is not None else f"accepted at offset {reply.get('offset')}"
    why = reply.get("reason") or reply.get("error")
    landed = [by_id[i] for i in reply.get("event_ids") or () if i in by_id]
    if reply.get("offset") in by_offset:
        landed = [by_offset[reply["offset"]]]
    if landed:
        said = "; ".join(_verdict(d) for d in landed)
        if any(d.outcome != Outcome.REJECTED for d in landed):
            said += f" (its client answered {reply.get('error')})"
        return said
    if reply.get("event_ids"):
        return f"sent, but the log never held it (its client answered {reply.get('error')}: {why})"
    return f"refused by its own client before sending ({why}): it never reached the log"


def _failures(reply: dict[str, Any]) -> str:
    n = reply.get("consecutive_failures")
    return f"{n} consecutive failure" + ("" if n == 1 else "s")


def _joined(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _play_000(bootstrap: str, out: Out) -> list[Verdict]:
    out("000  GC pause: revoke and grant ran concurrently")
    out("     Flink: the old leader's late release let the cancelled job be recovered after a "
        "restart, and its deleted blob crashed the cluster.")
    ns = "incident-000"
    jm1, jm2, jm3 = _coordinators(bootstrap, ns, "jm-1", "jm-2", "jm-3")
    try:
        jm1.send("claim")
        jm1.send("submit", job="job-a")
        jm1.pause()  # a long GC pause: the process is frozen
        epoch2 = jm2.send("claim")["epoch"]
        jm2.send("adopt", jobs=["job-a"])
        jm1.resume()  # the pause ends after the new grant; jm-1 goes on where it was
        late = {"release": jm1.send("release", job="job-a"),
                "terminate": jm1.send("terminate", job="job-a", state="FINISHED")}
        cancel = jm2.send("cancel", job="job-a", reason="user cancel")
        # a release jm-1 sent before the pause, still in flight: it bypasses the client
        zombie = jm1.send("zombie", type="JobLockReleased", job="job-a", epoch=1)
        epoch3 = jm3.send("claim")["epoch"]  # the restart: a new process folds the log
        live = jm3.send("jobs")["live"]
    finally:
        for c in (jm1, jm2, jm3):
            c.close()
    log = _decisions(bootstrap, ns)
    fates = {what: fate(reply, log) for what, reply in late.items()}
    if len(set(fates.values())) == 1:
        said = f"jm-1's late release and terminate were both {fates['release']}"
    else:
        said = "; ".join(f"jm-1's late {what} was {how}" for what, how in fates.items())
    cancelled = ("and cancelled job-a" if cancel.get("ok")
                 else f"and its cancel of job-a was {fate(cancel, log)}")
    out(f"     jobreg: jm-2 took epoch {epoch2} while jm-1 was frozen {cancelled}. {said}; "
        f"a release jm-1 had in flight, written past its client, was {fate(zombie, log)}. "
        f"After a restart jm-3 (epoch {epoch3}) sees "
        + (f"live jobs {_joined(live)}." if live else "no live job."))
    _refusals(out, [d for d in log if d.outcome == Outcome.REJECTED])
    by_id = {d.event_id: d for d in log}
    landed = [by_id[i] for r in late.values() for i in r.get("event_ids", []) if i in by_id]
    in_flight = next((d for d in log if d.offset == zombie.get("offset")), None)
    return [
        Verdict("000", "late release and remove of the old term are fenced",
                all(r.get("error") == "Fenced" for r in late.values())
                and not any(d.accepted for d in landed)
                and in_flight is not None and in_flight.outcome == Outcome.REJECTED),
        Verdict("000", "a cancelled job is not live after a restart", "job-a" not in live),
    ]


def _play_001(bootstrap: str, out: Out, lease: float = 6.0, blip: float = 1.5) -> list[Verdict]:
    out("001  a transient disconnect, and a job finished a month ago")
    out("     Flink: the leader gave up leadership on a ZooKeeper SUSPENDED; the new leader "
        "recovered the running job and the finished one too; both fought for slots.")
    ns = "incident-001"
    jm1, jm2 = _coordinators(bootstrap, ns, "jm-1", "jm-2", registry_timeout=lease / 2)
    try:
        first = jm1.send("elect", lease=lease, timeout=30)
        jm1.send("submit_many", jobs=["job-old", "job-run"])
        jm1.send("terminate", job="job-old", state="FINISHED")
        standby: list[dict[str, Any]] = []
        watching = threading.Thread(target=lambda: standby.append(
            jm2.send("elect", lease=lease, timeout=lease + 2)))
        watching.start()
        time.sleep(lease / 4)
        jm1.pause()  # the blip: jm-1 can neither renew nor be heard
        time.sleep(blip)
        jm1.resume()
        watching.join(60)
        after_blip = jm1.send("submit", job="job-new")
        jm1.proc.kill()  # now a real crash: the standby must take over
        jm1.proc.wait()
        second = jm2.send("elect", lease=lease, timeout=30)
        recovered = jm2.send("recover")
        resubmit = jm2.send("submit", job="job-old", graph="the left-behind graph")
        live = jm2.send("jobs")["live"]
    finally:
        for c in (jm1, jm2):
            c.close()
    no_failover = (bool(standby) and standby[0].get("elected") is False
                   and bool(after_blip.get("ok")))
    log = _decisions(bootstrap, ns)
    back = sorted(recovered.get("recovered", []))
    out(f"     jobreg: jm-1 (epoch {first.get('epoch')}, lease {lease:g} s) froze for {blip:g} s "
        + ("and kept its term: the standby did not take over. " if no_failover else
           "and the standby took over (a needless failover). ")
        + f"After jm-1 "
        f"crashed, jm-2 took epoch {second.get('epoch')} and recovered "
        + (_joined(back) if back else "no job")
        + (f" ({_joined(sorted(recovered['failed']))} failed recovery)"
           if recovered.get("failed") else "")
        + f"; resubmitting job-old was {fate(resubmit, log)}.")
    _refusals(out, [d for d in log if d.outcome == Outcome.REJECTED])
    return [
        Verdict("001", f"a {blip:g} s disconnect within the {lease:g} s lease causes no failover",
                no_failover),
        Verdict("001", "a finished job never comes back",
                sorted(recovered.get("recovered", [])) == ["job-new", "job-run"]
                and resubmit.get("reason") == "terminal_job" and "job-old" not in live),
    ]


def _play_002(bootstrap: str, out: Out) -> list[Verdict]:
    out("002  does leadership give mutual exclusion on the job set?")
    out("     Flink: no; the old leader removed a job after the new leader had taken it over.")
    ns = "incident-002"
    old, new = _coordinators(bootstrap, ns, "jm-old", "jm-new")
    try:
        old.send("claim")
        old.send("submit", job="job-x", graph="graph v1")
        epoch2 = new.send("claim")["epoch"]
        new.send("adopt", jobs=["job-x"])  # the new leader takes the job over
        removal = old.send("terminate", job="job-x", state="FAILED",
                           reason="old leader removes its job graph")
        zombie = old.send("zombie", type="JobTerminated", job="job-x", epoch=1,
                          payload={"state": "FAILED"})
        jobs = new.send("jobs")["jobs"]
    finally:
        old.close()
        new.close()
    log = _decisions(bootstrap, ns)
    by_offset = {d.offset: d for d in log}
    refusals = [removal.get("reason")] + [
        by_offset[z["offset"]].reason for z in (zombie,) if z.get("offset") in by_offset]
    out(f"     jobreg: job-x is {jobs.get('job-x')} under epoch {epoch2}. The old leader's "
        f"removal was {fate(removal, log)}; the removal it had in flight, written past its "
        f"client, was {fate(zombie, log)}"
        + (": refused by epoch, not by timing." if set(refusals) == {"stale_epoch"} else "."))
    _refusals(out, [d for d in log if d.outcome == Outcome.REJECTED])
    return [Verdict("002", "a stale leader cannot remove a job the new leader holds",
                    removal.get("error") == "Fenced" and jobs.get("job-x") == "ACTIVE")]


def _play_003(bootstrap: str, out: Out) -> list[Verdict]:
    out("003  one job throws during recovery")
    out("     Flink: the leader exited, every standby did the same, and the cluster never started "
        "again until the HA store was wiped by hand.")
    ns = "incident-003"
    jm1, jm2, jm3 = _coordinators(bootstrap, ns, "jm-1", "jm-2", "jm-3")
    try:
        jm1.send("claim")
        jm1.send("submit_many", jobs=[f"job-{i:02d}" for i in range(20)])
        epoch2 = jm2.send("claim")["epoch"]
        first = jm2.send("recover", fail=["job-07"])
        epoch3 = jm3.send("claim")["epoch"]
        second = jm3.send("recover", fail=["job-07"])
    finally:
        for c in (jm1, jm2, jm3):
            c.close()

    def recovery(who: str, epoch: int, result: dict[str, Any]) -> str:
        failed = result.get("failed", {})
        return (f"{who} (epoch {epoch}) adopted {len(result['recovered'])} jobs"
                + ("" if not failed else
                   " and marked " + _joined([f"{j} RECOVERY_FAILED ({e})"
                                             for j, e in failed.items()])))

    again = [j for j in first["failed"] if j in second["failed"] or j in second["recovered"]]
    out(f"     jobreg: {recovery('jm-2', epoch2, first)}, and carried on; "
        f"{recovery('jm-3', epoch3, second)}"
        + (f", and did not try {_joined(list(first['failed']))} again."
           if first["failed"] and not again else "."))
    return [
        Verdict("003", "one job's recovery failure fails that job only",
                len(first["recovered"]) == 19 and list(first["failed"]) == ["job-07"]),
        Verdict("003", "the next failover recovers the rest and leaves the failed job be",
                len(second["recovered"]) == 19 and not second["failed"]),
    ]


def _play_004(bootstrap: str, out: Out) -> list[Verdict]:
    out("004  a checkpoint discarded on the first decline")
    out("     Flink: a task still writing checkpoint 5 failed after the discard, and the job "
        "restarted over a checkpoint that no longer mattered.")
    (jm,) = _coordinators(bootstrap, "incident-004", "jm-1")
    budget = 1  # one failure is tolerable
    try:
        jm.send("claim")
        jm.send("submit", job="job", budget=budget)
        for kind, cid in (("triggered", 4), ("completed", 4), ("triggered", 5)):
            jm.send("checkpoint", kind=kind, job="job", id=cid,
                    location=f"file:///checkpoints/job/{cid}")
        first = jm.send("checkpoint", kind="failed", job="job", id=5, reason="DECLINED",
                        task="map-1")
        jm.send("checkpoint", kind="discarded", job="job", id=5, reason="declined by map-1")
        late = jm.send("checkpoint", kind="failed", job="job", id=5, reason="DECLINED",
                       task="sink-3")
        jm.send("checkpoint", kind="triggered", job="job", id=6)
        done = jm.send("checkpoint", kind="completed", job="job", id=6,
                       location="file:///checkpoints/job/6")
    finally:
        jm.close()
    counted = first.get("ignored") is None
    out("     jobreg: the first decline "
        + (f"counted ({_failures(first)}, {budget} tolerable)" if counted
           else f"was ignored ({first.get('ignored')})")
        + "; the late failure was "
        + (f"ignored ({late['ignored']})" if late.get("ignored") else
           f"counted ({_failures(late)})")
        + "; the job is " + ("over" if late.get("over_budget") else "within")
        + " its checkpoint failure budget"
        + (f"; checkpoint 6 completed and the count went back to "
           f"{done.get('consecutive_failures')}." if done.get("ok") else
           f"; checkpoint 6 did not complete ({done.get('detail')}).")
        )
    return [Verdict("004", "a failure of a discarded checkpoint is ignored",
                    first.get("ignored") is None and late.get("ignored") is not None
                    and "discarded" in late["ignored"] and not late.get("over_budget")
                    and late.get("consecutive_failures") == 1
                    and done.get("consecutive_failures") == 0)]


AUDIT_QUESTIONS = [
    ("Which writes were refused, from whom, and why?",
     "SELECT namespace, writer, event_type, reason, count(*) AS n FROM refused_writes "
     "GROUP BY namespace, writer, event_type, reason ORDER BY namespace"),
    ("How often did leadership change?",
     "SELECT namespace, count(*) AS terms, max(epoch) AS last_epoch FROM leadership_terms "
     "GROUP BY namespace ORDER BY namespace"),
    ("Did any job come back after it was cancelled or finished?",
     "SELECT count(*) AS resurrections FROM resurrections"),
    ("Which checkpoint failures were ignored, and why?",
     "SELECT namespace, job_id, \"offset\", detail FROM checkpoint_failures "
     "WHERE outcome = 'IGNORED'"),
]


def _audit(bootstrap: str, out_dir: Path, out: Out, engine: str) -> list[Verdict]:
    from consumers.audit_job import materialize
    from registry.audit.db import query
    from registry.audit.writer import check
    from registry.log import DEFAULT_TOPIC
    from registry.render import table

    db = out_dir / "audit.db"
    db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    started = time.monotonic()
    if engine == "spark":
        out("     starting Spark (local[2]) and the audit stream ...")
    run = materialize(url, bootstrap, DEFAULT_TOPIC, engine="spark" if engine == "spark"
                      else "plain", on_batch=lambda i, n: out(f"     batch {i}: {n} records"))
    records = run.records
    out(f"     {records} records into {db} ({engine}, {time.monotonic() - started:.1f} s)")
    for question, sql in AUDIT_QUESTIONS:
        columns, rows = query(url, sql)
        out(f"\n     {question}\n     {sql}")
        out("\n".join("     " + line for line in table(columns, rows).splitlines()))
    diffs = check(url, bootstrap, DEFAULT_TOPIC)
    for d in diffs:
        out(f"     DIFFERENCE: {d}")
    resurrections = query(url, "SELECT count(*) FROM resurrections")[1][0][0]
    return [Verdict("audit", "every record exactly once; the views agree with the fold",
                    records > 0 and not diffs),
            Verdict("audit", "the resurrections view is empty", resurrections == 0)]


def _reports(bootstrap: str, out_dir: Path, out: Out) -> list[Path]:
    """The incident reports, and a dump of every incident's namespace beside them (so that
    forensics and ``jobreg audit check --from-file`` still work once the broker is gone)."""
    from registry.forensics import BrokerSource, Forensics
    from registry.keys import partition_for
    from registry.log import DEFAULT_TOPIC, topic_partitions
    from registry.report import write_report

    partitions = topic_partitions(bootstrap, DEFAULT_TOPIC)
    paths = []
    dumps = out_dir / "dumps"
    dumps.mkdir(exist_ok=True)
    for n in range(5):
        ns = f"incident-00{n}"
        f = Forensics(BrokerSource(bootstrap, DEFAULT_TOPIC, partition_for(ns, partitions)), ns)
        paths.append(write_report(f, out_dir / f"report-{ns}.html",
                                  title=f"jobreg demo: incident 00{n}"))
        f.dump(dumps / f"{ns}.avro", topic=DEFAULT_TOPIC)
    out(f"     wrote {', '.join(str(p) for p in paths)}")
    command, activate = jobreg_command()
    out(f"     and a dump of each incident's log in {dumps}/; read one with "
        f"`{command} --from-file {dumps}/incident-000.avro explain job-a`"
        + (f" (or run `. {activate}` once, then `jobreg ...`)" if activate else ""))
    return paths


def _shown(path: Path) -> str:
    """``path`` as a person types it here: relative to the current directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def jobreg_command() -> tuple[str, str]:
    """How to run this installation's ``jobreg`` from the current directory, and how to put it
    on the PATH: ``("jobreg", "")`` when the PATH already finds it; else the script beside this
    interpreter (``.venv/bin/jobreg`` after ``make demo``) and its environment's ``activate``
    script (``""`` if it has none)."""
    script = Path(sys.executable).parent / "jobreg"  # a venv's bin: not resolved, on purpose
    if not script.exists():
        return "jobreg", ""
    found = shutil.which("jobreg")
    if found is not None and Path(found).resolve() == script.resolve():
        return "jobreg", ""
    activate = script.parent / "activate"
    return _shown(script), _shown(activate) if activate.exists() else ""


def run_demo(out: Out = print, *, out_dir: str | os.PathLike[str] = "jobreg-demo",
             audit: str = "spark") -> list[Verdict]:
    """Play the incidents on a fresh embedded broker with coordinator processes, materialize
    the audit views (``audit``: ``spark``, ``plain`` or ``none``), write the incident reports
    into ``out_dir``; return the verdicts (printing as it goes)."""
    started = time.monotonic()
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    verdicts: list[Verdict] = []
    steps = 5 + (audit != "none") + 1
    out("starting the embedded broker (Tansu, in memory) ...")
    with EmbeddedBroker() as broker:
        for i, play in enumerate((_play_000, _play_001, _play_002, _play_003, _play_004), 1):
            out(f"\n[{i}/{steps}] {time.monotonic() - started:5.1f} s")
            verdicts += play(broker.bootstrap, out)
        if audit != "none":
            out(f"\n[6/{steps}] {time.monotonic() - started:5.1f} s  the audit views (SQL)")
            verdicts += _audit(broker.bootstrap, directory, out, audit)
        out(f"\n[{steps}/{steps}] {time.monotonic() - started:5.1f} s  incident reports (HTML)")
        _reports(broker.bootstrap, directory, out)
    out("")
    width = max(len(v.guarantee) for v in verdicts)
    out(f"{'incident':<9}{'guarantee':<{width}}  verdict")
    for v in verdicts:
        out(f"{v.incident:<9}{v.guarantee:<{width}}  {'held' if v.held else 'BROKEN'}")
    out(f"\n{sum(v.held for v in verdicts)}/{len(verdicts)} guarantees held "
        f"in {time.monotonic() - started:.1f} s")
    return verdicts
