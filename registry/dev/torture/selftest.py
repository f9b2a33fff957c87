"""Shows the checker catches what it claims to: plants one violation per rule into a copy of
a finished run, and checks that the checker names it.

:func:`synthetic_run` builds a small clean run folder without a broker (a scripted history
of two namespaces on one partition; the library's fold supplies the verdicts and final
states a real run would have recorded). :data:`PLANTS` holds one function per rule of
:data:`~registry.dev.torture.checker.RULES`; each works on any run folder, real or synthetic,
adding the records, history lines or file changes that break its rule and nothing that a
correct registry would produce. :func:`selftest` plants each into its own copy and
reports, per rule, whether the checker's count for that rule went up.

Worker processes run several writer threads, so the synthetic run holds calls of one
process that overlap (a submit of one id by two threads at once, one accepted and one
refused, and a read overlapping the accepted one that does not show it yet: no rule
may order overlapping calls). :data:`CONCURRENT_PLANTS` plants violations made of calls of
two threads of one process, one ending before the other begins (a read that misses a
submit acknowledged to another thread, a read of an older epoch than an election
acknowledged to the process's election thread, a read showing live a job another thread
ended): the checker orders calls by real time, not by thread.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.dev.torture.checker import RULES, _Run, check
from registry.dev.torture.model import b64

__all__ = ["CONCURRENT_PLANTS", "PLANTS", "plant", "selftest", "synthetic_run"]

_T0 = 1_800_000_000.0  # seconds: the synthetic run's clock


# -- a clean run, without a broker -------------------------------------------------------------


class _Script:
    """Writes a synthetic run: records on partition 0, history lines, library answers."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.t = _T0
        self.records: list[tuple[int, int, bytes | None, bytes | None]] = []
        self.lines: dict[str, list[dict[str, Any]]] = {}
        self.ops = 0
        self.nemesis: list[dict[str, Any]] = []

    def tick(self, dt: float = 0.05) -> float:
        self.t += dt
        return self.t

    def record(self, key: str, event: Any) -> tuple[int, str]:
        from registry.wire import encode

        offset = len(self.records)
        self.records.append((offset, int(self.tick() * 1000), key.encode(), encode(event)))
        return offset, event.event_id

    def write(self, events: list[Any]) -> list[dict[str, Any]]:
        """Records of one call (``as_call`` for several); receipts of the members."""
        from registry.events import as_call
        from registry.keys import record_key

        out = []
        for e in as_call(events):
            offset, eid = self.record(record_key(e), e)
            if e.TYPE != "CallCommitted":
                out.append({"offset": offset, "epoch": e.epoch, "event_id": eid,
                            "ignored": None})
        return out

    def op(self, process: str, f: str, ns: str, *, args: dict[str, Any] | None = None,
           kind: str = "ok", value: Any = None, epoch: int | None = None,
           event_ids: list[str] | None = None, **extra: Any) -> None:
        self.ops += 1
        lines = self.lines.setdefault(process, [])
        base = {"process": process, "pid": 1000 + int(process[1:]), "incarnation": 0}
        lines.append({**base, "index": len(lines) + 1, "op": self.ops, "type": "invoke",
                      "f": f, "ns": ns, "args": args or {}, "epoch": epoch,
                      "time": self.tick(0.01)})
        lines.append({**base, "index": len(lines) + 1, "op": self.ops, "type": kind, "f": f,
                      "ns": ns, "epoch": epoch, "value": value, "event_ids": event_ids or [],
                      "time": self.tick(0.01), **extra})

    def overlap(self, process: str, calls: list[dict[str, Any]]) -> None:
        """Calls of one process's threads in flight together: every invoke line, then every
        completion line. Each call: ``thread``, ``f``, ``ns`` and optionally ``args``,
        ``kind``, ``value``, ``epoch``, ``event_ids`` and ``extra`` (more completion
        fields)."""
        lines = self.lines.setdefault(process, [])
        base = {"process": process, "pid": 1000 + int(process[1:]), "incarnation": 0}
        ops = []
        for c in calls:
            self.ops += 1
            ops.append(self.ops)
            lines.append({**base, "thread": c["thread"], "index": len(lines) + 1,
                          "op": self.ops, "type": "invoke", "f": c["f"], "ns": c["ns"],
                          "args": c.get("args") or {}, "epoch": c.get("epoch"),
                          "time": self.tick(0.01)})
        for op, c in zip(ops, calls, strict=True):
            lines.append({**base, "thread": c["thread"], "index": len(lines) + 1, "op": op,
                          "type": c.get("kind", "ok"), "f": c["f"], "ns": c["ns"],
                          "epoch": c.get("epoch"), "value": c.get("value"),
                          "event_ids": c.get("event_ids") or [], "time": self.tick(0.01),
                          **(c.get("extra") or {})})

    def note(self, process: str, **fields: Any) -> None:
        lines = self.lines.setdefault(process, [])
        lines.append({"process": process, "pid": 1000 + int(process[1:]), "incarnation": 0,
                      "index": len(lines) + 1, "time": self.tick(0.01), **fields})


def synthetic_run(run_dir: str | Path) -> Path:
    """Write a small clean run folder (no broker) and return it; see the module docstring."""
    from registry.blobs import FileBlobStore
    from registry.events import (
        CheckpointCompleted,
        CheckpointState,
        CheckpointTriggered,
        CompletedCheckpoint,
        InlineGraph,
        JobAdopted,
        JobCancelled,
        JobCleanedUp,
        JobSubmitted,
        JobTerminated,
        LeaderInformationPublished,
        LeadershipGranted,
        LeaseRenewed,
        new_event_id,
        now_ms,
    )

    run_dir = Path(run_dir)
    for sub in ("history", "final", "decisions", "blobs", "snapshots", "logs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    s = _Script(run_dir)
    topic = "torture-synthetic"
    names = ["ns-c", "ns-h"]
    store = FileBlobStore(run_dir / "blobs")

    def env(ns: str, epoch: int, writer: str) -> dict[str, Any]:
        return {"event_id": new_event_id(), "namespace": ns, "epoch": epoch, "writer": writer,
                "created_at": now_ms()}

    def blob(ns: str, data: bytes) -> Any:
        scoped = store.scoped(topic, ns) if hasattr(store, "scoped") else store
        return scoped.put(data)

    # ns-c: w1 leads epoch 1; ns-h: w3 leads epoch 1 (both namespaces on partition 0)
    s.record("ns-c/term/1/g1", LeadershipGranted(**{**env("ns-c", 1, "w1.0"),
                                                     "event_id": "g1"}, prev_epoch=0,
                                                  lease_ms=2000))
    s.op("w1", "elect", "ns-c", value={"epoch": 1, "contender": "w1.0"}, epoch=1)
    s.record("ns-h/term/1/g2", LeadershipGranted(**{**env("ns-h", 1, "w3.0"),
                                                     "event_id": "g2"}, prev_epoch=0))
    s.op("w3", "elect", "ns-h", value={"epoch": 1, "contender": "w3.0"}, epoch=1)

    def submit(process: str, ns: str, epoch: int, writer: str, job: str, graph: Any) -> None:
        r = s.write([JobSubmitted(**env(ns, epoch, writer), job_id=job, graph=graph)])
        s.op(process, "submit", ns, args={"job": job}, epoch=epoch,
             value={"receipts": r}, event_ids=[x["event_id"] for x in r])

    submit("w1", "ns-c", 1, "w1.0", "a", InlineGraph(b"graph a"))
    submit("w1", "ns-c", 1, "w1.0", "b", blob("ns-c", b"B" * 2000))
    submit("w3", "ns-h", 1, "w3.0", "x", blob("ns-h", b"X" * 3000))
    submit("w3", "ns-h", 1, "w3.0", "y", InlineGraph(b"graph y"))
    r = s.write([JobSubmitted(**env("ns-c", 1, "w1.0"), job_id=j, graph=InlineGraph(b"g"))
                 for j in ("c", "d")])
    s.op("w1", "submit_many", "ns-c", args={"jobs": ["c", "d"]}, epoch=1,
         value={"receipts": r}, event_ids=[x["event_id"] for x in r])
    st1 = CheckpointState(seq=1, pending=(1,))
    st2 = CheckpointState(seq=2, last_completed=1, retained=(CompletedCheckpoint(1, "m://1"),))
    for kind, st, f in ((CheckpointTriggered, st1, "checkpoint_triggered"),
                        (CheckpointCompleted, st2, "checkpoint_completed")):
        extra: dict[str, Any] = {"location": "m://1"} if kind is CheckpointCompleted else {}
        r = s.write([kind(**env("ns-c", 1, "w1.0"), job_id="b", checkpoint_id=1, state=st,
                          **extra)])
        s.op("w1", f, "ns-c", args={"job": "b", "id": 1}, epoch=1, value={"receipts": r},
             event_ids=[r[0]["event_id"]])
    r = s.write([JobCancelled(**env("ns-c", 1, "w1.0"), job_id="a", reason="done")])
    s.op("w1", "cancel", "ns-c", args={"job": "a"}, epoch=1, value={"receipts": r},
         event_ids=[r[0]["event_id"]])
    r = s.write([JobTerminated(**env("ns-h", 1, "w3.0"), job_id="y", state="FINISHED")])
    s.op("w3", "terminate", "ns-h", args={"job": "y", "state": "FINISHED"}, epoch=1,
         value={"receipts": r}, event_ids=[r[0]["event_id"]])
    # z fails and its result stays dirty (its blob held for a cleanup); a's is cleaned up
    zref = blob("ns-h", b"Z" * 2500)
    submit("w3", "ns-h", 1, "w3.0", "z", zref)
    r = s.write([JobTerminated(**env("ns-h", 1, "w3.0"), job_id="z", state="FAILED",
                               reason="boom", graph=zref)])
    s.op("w3", "terminate", "ns-h", args={"job": "z", "state": "FAILED"}, epoch=1,
         value={"receipts": r}, event_ids=[r[0]["event_id"]])
    r = s.write([JobCleanedUp(**env("ns-c", 1, "w1.0"), job_id="a", status="CANCELLED",
                              reason="done")])
    s.op("w1", "clean", "ns-c", args={"job": "a"}, epoch=1, value={"receipts": r},
         event_ids=[r[0]["event_id"]])
    s.write([LeaseRenewed(**env("ns-c", 1, "w1.0"))])
    s.write([LeaderInformationPublished(**env("ns-c", 1, "w1.0"), component="dispatcher",
                                        session="s-1", address="w1:6123")])
    # a zombie of no term, refused
    z = JobCancelled(**env("ns-c", 0, "zombie"), job_id="b", reason="zombie")
    off, _ = s.record("ns-c/job/b", z)
    s.nemesis.append({"time": s.t, "kind": "zombie", "sub": "stale_epoch", "ns": "ns-c",
                      "offset": off, "partition": 0, "event_id": z.event_id})
    s.op("w1", "read", "ns-c", value={"jobs": {"a": "CANCELLED", "b": "ACTIVE",
                                               "c": "ACTIVE", "d": "ACTIVE"}})
    # w2 takes ns-c over: epoch 2; w1 learns it
    s.record("ns-c/term/2/g3", LeadershipGranted(**{**env("ns-c", 2, "w2.0"),
                                                     "event_id": "g3"}, prev_epoch=1))
    s.op("w2", "elect", "ns-c", value={"epoch": 2, "contender": "w2.0"}, epoch=2)
    s.note("w1", type="info", f="revoked", ns="ns-c", epoch=1)
    # w1's leader information, late: refused (stale_epoch)
    late = LeaderInformationPublished(**env("ns-c", 1, "w1.0"), component="dispatcher",
                                      session="s-1", address="w1:6123")
    off, _ = s.record("ns-c/leader/1/w1.0/dispatcher", late)
    s.nemesis.append({"time": s.t, "kind": "zombie", "sub": "stale_epoch", "ns": "ns-c",
                      "offset": off, "partition": 0, "event_id": late.event_id})
    r = s.write([JobAdopted(**env("ns-c", 2, "w2.0"), job_id=j) for j in ("b", "c")])
    s.op("w2", "adopt", "ns-c", args={"jobs": ["b", "c"]}, epoch=2, value={"receipts": r},
         event_ids=[x["event_id"] for x in r])
    s.op("w1", "cancel", "ns-c", args={"job": "c"}, epoch=1, kind="fail", error="LeaseExpired",
         event_ids=[new_event_id()], stale=True)
    # a call that a known id sinks: nothing of it takes effect
    sunk = [JobSubmitted(**env("ns-c", 2, "w2.0"), job_id=j, graph=InlineGraph(b"g"))
            for j in ("e", "b")]
    s.write(sunk)
    s.op("w2", "submit_many", "ns-c", args={"jobs": ["e", "b"], "existing": ["b"]}, epoch=2,
         kind="fail", error="WriteRejected", reason="job_exists",
         event_ids=[e.event_id for e in sunk])
    s.op("w2", "leader", "ns-c", value={"epoch": 2, "leader": "w2.0", "revoked": False})
    s.op("w2", "gc", "ns-c", args={"grace": 20.0}, value={"deleted": [], "kept_referenced": 1,
                                                          "kept_young": 0, "errors": []})
    s.op("w3", "read", "ns-h", value={"jobs": {"x": "ACTIVE", "y": "FINISHED", "z": "FAILED"}})
    # Three threads of w3 at once: two submit job t (one accepted, one refused as a known
    # id), a read overlapping both shows neither (it may: it is not after either).
    first = JobSubmitted(**env("ns-h", 1, "w3.0"), job_id="t", graph=InlineGraph(b"t1"))
    second = JobSubmitted(**env("ns-h", 1, "w3.0"), job_id="t", graph=InlineGraph(b"t2"))
    r1, _r2 = s.write([first]), s.write([second])
    s.overlap("w3", [
        {"thread": "writer-1", "f": "submit", "ns": "ns-h", "args": {"job": "t", "twin": True},
         "epoch": 1, "value": {"receipts": r1}, "event_ids": [first.event_id]},
        {"thread": "writer-2", "f": "submit", "ns": "ns-h", "args": {"job": "t", "twin": True},
         "epoch": 1, "kind": "fail", "event_ids": [second.event_id],
         "extra": {"error": "WriteRejected", "reason": "job_exists"}},
        {"thread": "writer-3", "f": "read", "ns": "ns-h",
         "value": {"jobs": {"x": "ACTIVE", "y": "FINISHED", "z": "FAILED"}}}])
    _finish(s, topic, names)
    return run_dir


def _finish(s: _Script, topic: str, names: list[str]) -> None:
    from registry.fold import fold_batches
    from registry.image import Image, LogRecord
    from registry.render import decision_json, state_json

    d = s.dir
    cfg = {"seed": 0, "run": 0, "bootstrap": "synthetic", "embedded": True, "proxy": False,
           "topic": topic, "namespaces": names, "partitions": dict.fromkeys(names, 0),
           "processes": 3, "lease": 2.0, "timeout": 1.0, "inline_limit": 1024,
           "gc_grace": 20.0, "blob_dir": str((d / "blobs").resolve()), "seconds": 2,
           "started": _T0, "deadline": s.t + 1, "synthetic": True}
    (d / "run.json").write_text(json.dumps(cfg, indent=2))
    with (d / "log.jsonl").open("w") as f:
        for offset, ts, key, value in s.records:
            f.write(json.dumps({"p": 0, "o": offset, "t": ts, "k": b64(key), "v": b64(value)})
                    + "\n")
    for process, lines in s.lines.items():
        with (d / "history" / f"{process}.jsonl").open("w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    with (d / "nemesis.jsonl").open("w") as f:
        for line in s.nemesis:
            f.write(json.dumps(line) + "\n")
    (d / "procs.jsonl").write_text("")
    records = [LogRecord(o, k, v, t, 0) for o, t, k, v in s.records]
    for ns in names:
        decisions: list[Any] = []
        image = fold_batches([records], Image.empty(ns), None, decisions.append)
        with (d / "decisions" / f"{ns}.jsonl").open("w") as f:
            for dec in decisions:
                if dec.outcome != "SKIPPED":
                    f.write(json.dumps(decision_json(dec), default=str) + "\n")
        state = state_json(image)
        (d / "final" / f"{ns}.json").write_text(json.dumps({
            "namespace": ns, "fresh": state, "snapshots": [
                {"path": f"{ns}.synthetic.snap", "started_from": "snapshot (synthetic)",
                 "state": state}]}, indent=1))


# -- planting ----------------------------------------------------------------------------------


class _Plot:
    """A run folder being changed: append records (with the library's verdict), history lines."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.run = _Run(run_dir)
        self.cfg = self.run.cfg
        times = [o.t1 or o.t0 for o in self.run.ops] + [n["time"] for n in self.run.notes]
        stamps = [r[1] or 0 for recs in self.run.records.values() for r in recs]
        self.t = max(times + [max(stamps, default=0) / 1000, 0.0]) + 1.0

    def ns(self) -> str:
        """The namespace with the most accepted records."""
        return max(self.run.models, key=lambda n: sum(v.accepted for v in
                                                      self.run.models[n].verdicts))

    def append(self, ns: str, key: str, event: Any, outcome: str, reason: str | None = None
               ) -> int:
        from registry.wire import encode

        part = int(self.cfg["partitions"][ns])
        recs = self.run.records.setdefault(part, [])
        offset = max((r[0] for r in recs), default=-1) + 1
        self.t += 0.1
        value = encode(event)
        recs.append((offset, int(self.t * 1000), key.encode(), value))
        with (self.dir / "log.jsonl").open("a") as f:
            f.write(json.dumps({"p": part, "o": offset, "t": int(self.t * 1000),
                                "k": b64(key.encode()), "v": b64(value)}) + "\n")
        with (self.dir / "decisions" / f"{ns}.jsonl").open("a") as f:
            f.write(json.dumps({"offset": offset, "outcome": outcome, "reason": reason,
                                "accepted": outcome in ("ACCEPTED", "IGNORED"),
                                "event_id": event.event_id, "event_type": event.TYPE,
                                "epoch": event.epoch, "writer": event.writer,
                                "job_id": getattr(event, "job_id", None)}) + "\n")
        return offset

    def op(self, process: str, f: str, ns: str | None, *, kind: str = "ok",
           args: dict[str, Any] | None = None, value: Any = None, epoch: int | None = None,
           event_ids: list[str] | None = None, dt: float = 0.1, thread: str | None = None,
           incarnation: int = 0, **extra: Any) -> None:
        base = {"process": process, "pid": 99999, "incarnation": incarnation, "op": 10**6 + int(
            self.t * 1000) % 10**6}
        if thread is not None:
            base["thread"] = thread
        self.t += dt
        lines = [{**base, "index": 1, "type": "invoke", "f": f, "ns": ns, "args": args or {},
                  "epoch": epoch, "time": self.t}]
        self.t += dt
        lines.append({**base, "index": 2, "type": kind, "f": f, "ns": ns, "epoch": epoch,
                      "value": value, "event_ids": event_ids or [], "time": self.t, **extra})
        with (self.dir / "history" / f"{process}.jsonl").open("a") as fh:
            for line in lines:
                fh.write(json.dumps(line) + "\n")

    def env(self, ns: str, epoch: int, writer: str) -> dict[str, Any]:
        from registry.events import new_event_id, now_ms

        return {"event_id": new_event_id(), "namespace": ns, "epoch": epoch, "writer": writer,
                "created_at": now_ms()}

    def accepted(self, ns: str, etype: str) -> list[Any]:
        return [v for v in self.run.models[ns].verdicts if v.accepted and v.etype == etype]


def _leader_per_epoch(p: _Plot) -> str:
    op = next(o for o in p.run.ops if o.f == "elect" and o.type == "ok")
    epoch = int(op.reply["epoch"])
    p.op("planted", "elect", op.ns, value={"epoch": epoch, "contender": "planted.0"},
         epoch=epoch)
    return f"a second process leading epoch {epoch} of {op.ns}"


def _grant_not_cas(p: _Plot) -> str:
    from registry.events import LeadershipGranted

    ns = p.ns()
    epoch = p.run.models[ns].epoch
    e = LeadershipGranted(**p.env(ns, epoch, "planted"), prev_epoch=epoch - 1)
    off = p.append(ns, f"{ns}/term/{epoch}/{e.event_id}", e, "ACCEPTED")
    return f"the fold accepting a grant of epoch {epoch} over epoch {epoch} at offset {off}"


def _stale_write_accepted(p: _Plot) -> str:
    from registry.events import JobCancelled

    ns = p.ns()
    m = p.run.models[ns]
    job = next(iter(sorted(m.jobs)), "planted-job")
    e = JobCancelled(**p.env(ns, max(0, m.epoch - 1), "planted-zombie"), job_id=job)
    off = p.append(ns, f"{ns}/job/{job}", e, "ACCEPTED")
    return f"the fold accepting a stale zombie cancel at offset {off}"


def _ok_write_missing(p: _Plot) -> str:
    ns = p.ns()
    p.op("planted", "submit", ns, args={"job": "planted-missing"}, value={"receipts": [
        {"offset": 10**7, "epoch": 1, "event_id": str(uuid.uuid4()), "ignored": None}]})
    return "a receipt for a record that is not in the log"


def _refused_submit(p: _Plot, ns: str, job: str) -> tuple[int, str]:
    from registry.events import InlineGraph, JobSubmitted

    m = p.run.models[ns]
    e = JobSubmitted(**p.env(ns, m.epoch, "planted-zombie"), job_id=job,
                     graph=InlineGraph(b"planted"))
    reason = "no_leader" if m.leader is None else "not_leader"
    return p.append(ns, f"{ns}/job/{job}", e, "REJECTED", reason), e.event_id


def _ok_write_not_accepted(p: _Plot) -> str:
    ns = p.ns()
    off, eid = _refused_submit(p, ns, "planted-refused")
    p.op("planted", "submit", ns, args={"job": "planted-refused"}, value={"receipts": [
        {"offset": off, "epoch": 1, "event_id": eid, "ignored": None}]}, event_ids=[eid])
    return f"a receipt for the refused record at offset {off}"


def _live_submit(p: _Plot) -> tuple[str, Any]:
    for ns, m in p.run.models.items():
        for v in m.verdicts:
            if v.accepted and v.etype == "JobSubmitted" and v.job is not None \
                    and m.jobs.get(v.job) is not None and m.jobs[v.job].live:
                return ns, v
    raise LookupError("no live job")


def _acked_write_lost(p: _Plot) -> str:
    ns, v = _live_submit(p)
    m = p.run.models[ns]
    p.op("planted", "submit", ns, args={"job": v.job}, value={"receipts": [
        {"offset": v.offset, "epoch": v.epoch, "event_id": v.event_id, "ignored": None}]},
        event_ids=[v.event_id])
    jobs = {j: job.status for j, job in m.jobs.items() if j != v.job}
    p.op("planted", "read", ns, value={"jobs": jobs})
    return f"a read after the acknowledged submit of {v.job!r} that does not show it"


def _resurrection(p: _Plot) -> str:
    from registry.events import InlineGraph, JobSubmitted

    for ns, m in p.run.models.items():
        dead = sorted(j for j, job in m.jobs.items() if not job.live)
        if dead:
            e = JobSubmitted(**p.env(ns, m.epoch, m.leader or "planted"), job_id=dead[0],
                             graph=InlineGraph(b"again"))
            off = p.append(ns, f"{ns}/job/{dead[0]}", e, "ACCEPTED")
            return f"the fold accepting a resubmit of terminal job {dead[0]!r} at offset {off}"
    raise LookupError("no terminal job")


def _failed_call_had_effect(p: _Plot) -> str:
    op = next(o for o in p.run.ops if o.type == "ok" and (o.value or {}).get("receipts"))
    eid = op.value["receipts"][0]["event_id"]
    p.op("planted", op.f, op.ns, kind="fail", args=op.args, error="Fenced",
         reason="stale_epoch", event_ids=[eid])
    return f"a failed {op.f} naming an accepted record"


def _call_not_atomic(p: _Plot) -> str:
    ns, v = _live_submit(p)
    off, eid = _refused_submit(p, ns, v.job)  # refused: a second submit of a known job
    # The planted call's two records must read as one call: the refused one is a lone
    # record (no call id), so the accepted one must be a lone record too, not a member of a
    # real submit_many (the checker groups a call's records by their call id).
    lone = [x for x in p.accepted(ns, "JobSubmitted") if getattr(x.event, "call_id", None) is None]
    other = next((x for x in lone if x.job != v.job), lone[0] if lone else None)
    if other is None:
        raise LookupError("no accepted submit outside a call")
    p.op("planted", "submit_many", ns, kind="info", args={"jobs": [other.job, v.job]},
         error="OutcomeUnknown", event_ids=[other.event_id, eid])
    return f"an unknown submit_many with one record accepted and one refused (offset {off})"


def _edit_final(p: _Plot, snapshot: bool) -> str:
    ns = p.ns()
    path = p.dir / "final" / f"{ns}.json"
    final = json.loads(path.read_text())
    if snapshot:
        if not final.get("snapshots"):
            final["snapshots"] = [{"path": "planted.snap", "started_from": "snapshot planted",
                                   "state": json.loads(json.dumps(final["fresh"]))}]
        state = final["snapshots"][0]["state"]
    else:
        state = final["fresh"]
    if state["jobs"]:
        state["jobs"].pop(0)
    else:
        state["epoch"] = int(state["epoch"]) + 5
    path.write_text(json.dumps(final))
    return f"a {'snapshot start' if snapshot else 'fresh client'} missing a job"


def _held_blobs(p: _Plot) -> list[tuple[str, str, Any]]:
    """(namespace, job, model job) of every blob a job holds at the end: dirty results first
    (the newer rule: a result's graph stays until its cleanup is done), then live jobs."""
    held = [(ns, job, j) for ns, m in p.run.models.items() for job, j in sorted(m.jobs.items())
            if j.referenced and j.graph is not None and j.graph[0] == "blob"]
    return sorted(held, key=lambda h: h[2].live)


def _graph_lost(p: _Plot) -> str:
    from registry.dev.torture.checker import _blob_path

    for _ns, job, j in _held_blobs(p):
        path = _blob_path(p.run, j.graph[1])
        if path.exists():
            path.unlink()
            return f"the blob of {'live job' if j.live else 'dirty result'} {job!r} deleted"
    raise LookupError("no live job or dirty result with a blob")


def _gc_deleted_live_blob(p: _Plot) -> str:
    for ns, job, j in _held_blobs(p):
        p.op("planted", "gc", ns, args={"grace": 1.0}, dt=2.5,
             value={"deleted": [j.graph[1]], "kept_referenced": 0, "kept_young": 0,
                    "errors": []})
        return (f"a collection reporting the blob of {'live job' if j.live else 'dirty result'}"
                f" {job!r} deleted")
    raise LookupError("no live job or dirty result with a blob")


def _stale_read(p: _Plot) -> str:
    op = max((o for o in p.run.ops if o.f == "elect" and o.type == "ok"),
             key=lambda o: int(o.reply["epoch"]))
    epoch = int(op.reply["epoch"])
    p.op("planted", "leader", op.ns, value={"epoch": epoch - 1, "leader": None,
                                            "revoked": False})
    return f"a read of epoch {epoch - 1} after epoch {epoch} was acknowledged"


def _loss_not_learned(p: _Plot) -> str:
    from registry.events import LeadershipGranted

    ns = p.ns()
    m = p.run.models[ns]
    epoch = m.epoch
    for i, who in enumerate(("planted-p.0", "planted-q.0")):
        e = LeadershipGranted(**p.env(ns, epoch + 1 + i, who), prev_epoch=epoch + i)
        p.append(ns, f"{ns}/term/{e.epoch}/{e.event_id}", e, "ACCEPTED")
        if i == 0:
            p.op("planted-p", "elect", ns, value={"epoch": epoch + 1,
                                                  "contender": "planted-p.0"}, epoch=epoch + 1)
    bound = float(p.cfg["lease"]) + 4 * (2 * float(p.cfg["timeout"]) + 0.25) + 2
    for _ in range(int(bound) + 6):
        p.op("planted-p", "submit", ns, kind="fail", args={"job": "late"}, error="Fenced",
             reason="stale_epoch", epoch=epoch + 1, dt=0.5)
    return f"a leader of epoch {epoch + 1} still writing {bound + 6:.0f} s after losing"


def _two_leaders(p: _Plot) -> str:
    from registry.events import LeadershipGranted

    ns = p.ns()
    m = p.run.models[ns]
    epoch = m.epoch
    e = LeadershipGranted(**p.env(ns, epoch + 1, "planted-q.0"), prev_epoch=epoch)
    p.append(ns, f"{ns}/term/{e.epoch}/{e.event_id}", e, "ACCEPTED")
    landed = p.t
    note = {"process": "planted-p", "pid": 99999, "incarnation": 0, "thread": "contend",
            "index": 1, "type": "info", "f": "certain", "ns": ns, "epoch": epoch,
            "time": landed - 0.5, "until": landed + 1.0}
    with (p.dir / "history" / "planted-p.jsonl").open("a") as fh:
        fh.write(json.dumps(note) + "\n")
    return (f"a leader of epoch {epoch} certain of its lease 1.0 s past the grant of epoch "
            f"{epoch + 1}")


def _unexpected_error(p: _Plot) -> str:
    p.op("planted", "read", p.ns(), kind="info", error="KeyError", unexpected=True,
         trace="KeyError: 'planted'")
    return "a read that raised KeyError"


def _fold_disagrees(p: _Plot) -> str:
    ns = p.ns()
    m = p.run.models[ns]
    # Not a record of a call: a call half-refused is reported as call_not_atomic instead.
    target = next(v for v in m.verdicts if v.accepted and v.etype in (
        "LeaseRenewed", "CheckpointTriggered", "JobSubmitted", "JobCancelled")
        and getattr(v.event, "call_id", None) is None)
    path = p.dir / "decisions" / f"{ns}.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for d in lines:
        if d["offset"] == target.offset:
            d.update(outcome="REJECTED", reason="planted", accepted=False)
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return f"the fold refusing offset {target.offset} ({target.etype}), which the rules accept"


PLANTS: dict[str, Callable[[_Plot], str]] = {
    "leader_per_epoch": _leader_per_epoch,
    "grant_not_cas": _grant_not_cas,
    "stale_write_accepted": _stale_write_accepted,
    "ok_write_missing": _ok_write_missing,
    "ok_write_not_accepted": _ok_write_not_accepted,
    "acked_write_lost": _acked_write_lost,
    "resurrection": _resurrection,
    "failed_call_had_effect": _failed_call_had_effect,
    "call_not_atomic": _call_not_atomic,
    "fresh_client_disagrees": lambda p: _edit_final(p, False),
    "snapshot_start_disagrees": lambda p: _edit_final(p, True),
    "graph_lost": _graph_lost,
    "gc_deleted_live_blob": _gc_deleted_live_blob,
    "stale_read": _stale_read,
    "loss_not_learned": _loss_not_learned,
    "two_leaders": _two_leaders,
    "unexpected_error": _unexpected_error,
    "fold_disagrees": _fold_disagrees,
}
"""One planting per rule; each returns what it planted (or raises ``LookupError`` when the
run has nothing to plant it on, e.g. no live job with a blob)."""

assert set(PLANTS) == set(RULES), "every rule has a planting"


def _concurrent_acked_write_lost(p: _Plot) -> str:
    ns, v = _live_submit(p)
    m = p.run.models[ns]
    p.op("planted", "submit", ns, args={"job": v.job}, thread="writer-1", value={"receipts": [
        {"offset": v.offset, "epoch": v.epoch, "event_id": v.event_id, "ignored": None}]},
        event_ids=[v.event_id])
    jobs = {j: job.status for j, job in m.jobs.items() if j != v.job}
    p.op("planted", "read", ns, value={"jobs": jobs}, thread="writer-2")
    return (f"a read by one thread, after another thread of its process was acknowledged the "
            f"submit of {v.job!r}, that does not show it")


def _concurrent_stale_read(p: _Plot) -> str:
    op = max((o for o in p.run.ops if o.f == "elect" and o.type == "ok"),
             key=lambda o: int(o.reply["epoch"]))
    epoch = int(op.reply["epoch"])
    process, incarnation = op.who
    p.op(process, "leader", op.ns, thread="writer-1", incarnation=incarnation,
         value={"epoch": epoch - 1, "leader": None, "revoked": False})
    return (f"a writer thread of {process} reading epoch {epoch - 1} after its process's "
            f"election thread was acknowledged epoch {epoch}")


def _concurrent_resurrection(p: _Plot) -> str:
    for ns, m in p.run.models.items():
        for v in m.verdicts:
            if v.accepted and v.etype == "JobCancelled" and v.job is not None \
                    and v.event_id is not None and not m.jobs[v.job].live:
                p.op("planted", "cancel", ns, args={"job": v.job}, thread="writer-1",
                     value={"receipts": [{"offset": v.offset, "epoch": v.epoch,
                                          "event_id": v.event_id, "ignored": None}]},
                     event_ids=[v.event_id])
                jobs = {j: job.status for j, job in m.jobs.items()}
                jobs[v.job] = "ACTIVE"
                p.op("planted", "read", ns, value={"jobs": jobs}, thread="writer-2")
                return (f"a read by one thread showing {v.job!r} live after another thread of "
                        "its process was acknowledged its cancel")
    raise LookupError("no accepted cancel")


CONCURRENT_PLANTS: dict[str, Callable[[_Plot], str]] = {
    "acked_write_lost": _concurrent_acked_write_lost,
    "stale_read": _concurrent_stale_read,
    "resurrection": _concurrent_resurrection,
}
"""Plantings made of calls of two threads of one process (see the module docstring), by the
rule each breaks."""


def plant(run_dir: str | Path, rule: str, into: str | Path, *, concurrent: bool = False
          ) -> tuple[Path, str]:
    """Copy ``run_dir`` to ``into`` and plant one violation of ``rule`` there (with
    ``concurrent``, the planting of :data:`CONCURRENT_PLANTS`)."""
    into = Path(into)
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(run_dir, into, ignore=shutil.ignore_patterns("dump", "snapshots", "logs"))
    what = (CONCURRENT_PLANTS if concurrent else PLANTS)[rule](_Plot(into))
    return into, what


def selftest(run_dir: str | Path | None, work: str | Path) -> list[dict[str, Any]]:
    """Plant every rule's violation into copies of ``run_dir`` (a synthetic run if ``None``)
    under ``work``; one row per rule: ``rule``, ``caught``, ``planted``, ``before``,
    ``after``, and the checker's first new ``detail``."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    base = Path(run_dir) if run_dir is not None else synthetic_run(work / "base")
    before = _counts(check(base))
    rows = []
    plantings = [(rule, False) for rule in PLANTS] + [(rule, True) for rule in CONCURRENT_PLANTS]
    for rule, concurrent in plantings:
        label = f"{rule} (concurrent)" if concurrent else rule
        try:
            copy, what = plant(base, rule, work / f"planted-{rule}"
                               f"{'-concurrent' if concurrent else ''}", concurrent=concurrent)
        except (LookupError, StopIteration) as e:
            rows.append({"rule": label, "caught": None, "planted": f"not plantable here: {e}",
                         "before": before.get(rule, 0), "after": None, "detail": ""})
            continue
        report = check(copy)
        after = _counts(report)
        new = [v.detail for v in report.violations if v.rule == rule]
        rows.append({"rule": label, "caught": after.get(rule, 0) > before.get(rule, 0),
                     "planted": what, "before": before.get(rule, 0),
                     "after": after.get(rule, 0), "detail": new[-1] if new else ""})
    return rows


def _counts(report: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in report.violations:
        out[v.rule] = out.get(v.rule, 0) + 1
    return out
