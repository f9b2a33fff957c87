"""Judges a finished run from its folder: the histories, the raw log, and what the library said.

Pure: it reads files only. Records are decoded with :mod:`registry.wire`; what the
records mean comes from :mod:`registry.dev.torture.model`, the checker's own model of the
documented rules, never from :mod:`registry.rules`. The library's answers that a run
records (each record's verdict from a fresh client, the final state from a fresh client
and from snapshots) are observations to judge, like the histories.

Each rule (:data:`RULES`) is reported with the offending history lines and log offsets.

A worker process runs several writer threads (``writers`` in ``run.json``) whose calls
overlap: no rule orders the calls of a process by their lines or their ``op`` numbers. Each
call is judged on its own lines (its event ids, receipts, outcome), and what the rules
compare across calls (a read against the acknowledgements before it) is ordered by real
time only: a completion line written before another call's invoke line, whichever thread
or process wrote them. Calls whose intervals overlap are unordered. The statistics count
how many write calls overlapped another of the same term in their process
(``concurrency``), so a run shows that calls met.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from registry.dev.torture.model import (
    FENCING_REASONS,
    TERMINAL,
    NamespaceModel,
    Verdict,
    unb64,
)

__all__ = ["RULES", "Op", "Report", "Violation", "check", "load_ops"]

RULES: dict[str, str] = {
    "leader_per_epoch": "at most one contender leads an epoch of a namespace, and it is the "
                        "one the log's accepted grant names",
    "grant_not_cas": "every grant the fold accepted is a compare-and-set on the epoch before",
    "stale_write_accepted": "no accepted write whose epoch or writer is not the current, "
                            "unrevoked term at its position (zombies included)",
    "ok_write_missing": "every acknowledged write is in the log where its receipt says",
    "ok_write_not_accepted": "every acknowledged write is accepted by the documented rules",
    "acked_write_lost": "an acknowledged submit is seen by every later read and by fresh "
                        "clients (live, or ended by an accepted write)",
    "resurrection": "no job is live after it became terminal, in any prefix of the log, in "
                    "any later read, or in any fresh client",
    "failed_call_had_effect": "a call that raised 'not accepted' has no record accepted",
    "call_not_atomic": "a multi-record call is all or nothing (ok: all; fail: none; "
                       "unknown: all or none)",
    "fresh_client_disagrees": "a fresh client after the run agrees with the model (jobs, "
                              "epoch, leader, revoked)",
    "snapshot_start_disagrees": "a client started from a snapshot agrees with the model",
    "graph_lost": "every live job's and dirty result's graph is present and verifies; no "
                  "recovery fails for a missing or corrupt blob",
    "gc_deleted_live_blob": "garbage collection never deletes a blob that a live job or a "
                            "result not yet cleaned up, of any namespace, references",
    "stale_read": "a read never shows an epoch older than one already acknowledged",
    "loss_not_learned": "a leader whose term is over learns it (on_revoked) within a bound "
                        "of running time",
    "two_leaders": "no process believes it certainly leads (Election.valid_for, what the "
                   "Flink bridge hands to hasLeadership) past the moment a newer grant of its "
                   "namespace landed",
    "unexpected_error": "calls raise only the documented errors; workers do not crash",
    "fold_disagrees": "the fold's verdict on each record is the documented rules' verdict",
}
"""Every rule the checker reports, with what it means."""

WRITES = frozenset({"submit", "submit_many", "cancel", "terminate", "adopt", "release",
                    "clean", "checkpoint_triggered", "checkpoint_completed", "checkpoint_failed",
                    "checkpoint_discarded", "checkpoint_trigger_failed", "checkpoint_restarted",
                    "revoke"})
MULTI = frozenset({"submit_many", "adopt"})
HOOK_FAILURE = "planted hook failure"  # the worker's recovery hook (not a lost graph)
_CAP = 25  # fold_disagrees reported per namespace


@dataclass
class Violation:
    """One broken rule: what, where in the log, which history lines."""

    rule: str
    detail: str
    ns: str | None = None
    offsets: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    """The checker's answer: violations, statistics, and what it could not judge."""

    violations: list[Violation]
    stats: dict[str, Any]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = defaultdict(int)
        for v in self.violations:
            counts[v.rule] += 1
        return {"ok": not self.violations, "counts": dict(sorted(counts.items())),
                "violations": [asdict(v) for v in self.violations], "stats": self.stats,
                "notes": self.notes}


@dataclass
class Op:
    """One call of a worker: its invoke line and its completion line (``None``: cut off)."""

    invoke: dict[str, Any]
    done: dict[str, Any] | None = None

    @property
    def f(self) -> str:
        return str(self.invoke["f"])

    @property
    def reply(self) -> dict[str, Any]:
        """The completion line of a call that finished (ValueError for one cut off)."""
        if self.done is None:
            raise ValueError(f"{self.f} was cut off: it has no completion line")
        return self.done

    @property
    def finished_at(self) -> float:
        """When a call that finished finished (ValueError for one cut off)."""
        return float(self.reply["time"])

    @property
    def ns(self) -> str | None:
        return self.invoke.get("ns")

    @property
    def type(self) -> str:
        return self.done["type"] if self.done is not None else "unfinished"

    @property
    def t0(self) -> float:
        return float(self.invoke["time"])

    @property
    def t1(self) -> float | None:
        return float(self.done["time"]) if self.done is not None else None

    @property
    def who(self) -> tuple[str, int]:
        return self.invoke["process"], int(self.invoke["incarnation"])

    @property
    def thread(self) -> str | None:
        """The worker thread that made the call (``None`` in histories before threads)."""
        return self.invoke.get("thread")

    @property
    def args(self) -> dict[str, Any]:
        return self.invoke.get("args") or {}

    @property
    def value(self) -> Any:
        return (self.done or {}).get("value")

    @property
    def event_ids(self) -> list[str]:
        return list((self.done or {}).get("event_ids") or [])

    def lines(self) -> list[dict[str, Any]]:
        out = [_short(self.invoke)]
        if self.done is not None:
            out.append(_short(self.done))
        return out


def _short(line: dict[str, Any]) -> dict[str, Any]:
    keep = ("process", "incarnation", "thread", "index", "op", "type", "f", "ns", "args",
            "epoch",
            "error", "reason", "detail", "time", "stale")
    out = {k: line[k] for k in keep if line.get(k) is not None}
    value = line.get("value")
    if value is not None:
        text = json.dumps(value, default=str)
        out["value"] = value if len(text) < 600 else text[:600] + "..."
    if line.get("event_ids"):
        out["event_ids"] = line["event_ids"][:8]
    return out


def _jsonl(path: Path, bad: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                bad.append(f"{path.name}:{n}")  # a line cut by a SIGKILL
    return out


def load_ops(run_dir: Path, bad: list[str] | None = None
             ) -> tuple[list[Op], list[dict[str, Any]]]:
    """The calls of every history file, and the notification lines (start, revoked, ...)."""
    bad = [] if bad is None else bad
    ops: dict[tuple[str, int, int], Op] = {}
    notes: list[dict[str, Any]] = []
    for path in sorted((run_dir / "history").glob("*.jsonl")):
        for line in _jsonl(path, bad):
            if line.get("op") is None:
                notes.append(line)
                continue
            key = (line["process"], int(line["incarnation"]), int(line["op"]))
            if line["type"] == "invoke":
                ops[key] = Op(line)
            elif key in ops:
                ops[key].done = line
    return sorted(ops.values(), key=lambda o: o.t0), notes


class _Run:
    """Everything a run folder holds, loaded once."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.cfg = json.loads((run_dir / "run.json").read_text())
        self.bad_lines: list[str] = []
        self.ops, self.notes = load_ops(run_dir, self.bad_lines)
        self.nemesis = _jsonl(run_dir / "nemesis.jsonl", self.bad_lines)
        self.procs = _jsonl(run_dir / "procs.jsonl", self.bad_lines)
        self.records: dict[int, list[tuple[int, int | None, bytes | None, bytes | None]]] = \
            defaultdict(list)
        for r in _jsonl(run_dir / "log.jsonl", self.bad_lines):
            self.records[int(r["p"])].append((int(r["o"]), r.get("t"), unb64(r.get("k")),
                                              unb64(r.get("v"))))
        for recs in self.records.values():
            recs.sort(key=lambda r: r[0])
        self.models: dict[str, NamespaceModel] = {}
        for ns in self.cfg["namespaces"]:
            m = NamespaceModel(ns)
            for offset, ts, key, value in self.records.get(int(self.cfg["partitions"][ns]), []):
                m.apply(offset, key, value, ts)
            self.models[ns] = m
        self.decisions: dict[str, list[dict[str, Any]] | None] = {}
        self.finals: dict[str, dict[str, Any] | None] = {}
        for ns in self.cfg["namespaces"]:
            path = run_dir / "decisions" / f"{ns}.jsonl"
            self.decisions[ns] = _jsonl(path, self.bad_lines) if path.exists() else None
            final = run_dir / "final" / f"{ns}.json"
            self.finals[ns] = json.loads(final.read_text()) if final.exists() else None
        self.zombies = {n["event_id"]: n for n in self.nemesis
                        if n.get("kind") == "zombie" and "event_id" in n}
        self.deposed = _deposed_windows(self.cfg, self.nemesis)
        self.deposed_pairs = 0  # read/acknowledgement pairs _reads left uncompared


_DEPOSING = ("node_cut", "leader_pause", "coordinator_pause")


def _deposed_windows(cfg: dict[str, Any], nemesis: list[dict[str, Any]]
                     ) -> dict[int, list[tuple[float, float]]]:
    """On Kafka's nodes: per partition, the times during which a deposed leader may have
    served its stale log to readers.

    A leader cut off from the other nodes, or paused, longer than the broker session
    timeout loses its partitions to a follower; clients whose metadata still names it keep
    fetching from it, and it answers from its own log (its high watermark stops where its
    term did) until it learns from the controller that it leads no more. Kafka serves reads
    from the leader it believes in, with no quorum check: a read is linearizable only
    while one node leads. A window runs from the fault's start to the moment the node named
    the same leaders as the others (``learned_at`` in the fault's end line; the end of the
    run if it never did); a fault after which every partition the node led kept its leader
    epoch (``deposed`` false: shorter than the session timeout) makes none. The embedded
    broker is one node: no windows.
    """
    if cfg.get("broker") != "kafka":
        return {}
    windows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    open_: dict[tuple[str, int], dict[str, Any]] = {}
    for n in nemesis:
        kind = n.get("kind")
        if kind not in _DEPOSING:
            continue
        if n.get("phase") == "start":
            open_[(kind, n["node"])] = n
            continue
        start = open_.pop((kind, n["node"]), None)
        if start is None or n.get("deposed") is False:  # no partition it led changed hands
            continue
        end = n.get("learned_at") or float(cfg.get("deadline") or 0) + 3600
        for role in start.get("roles") or []:
            if role.startswith("leader:"):
                windows[int(role.split(":")[1])].append((float(start["time"]), float(end)))
    for (_kind, _node), start in open_.items():  # a fault the run's end cut short
        for role in start.get("roles") or []:
            if role.startswith("leader:"):
                windows[int(role.split(":")[1])].append(
                    (float(start["time"]), float(cfg.get("deadline") or 0) + 3600))
    return dict(windows)


def check(run_dir: str | Path) -> Report:
    """Judge the run in ``run_dir`` (see :data:`RULES`)."""
    run = _Run(Path(run_dir))
    out: list[Violation] = []
    notes: list[str] = []
    if run.bad_lines:
        notes.append(f"{len(run.bad_lines)} unreadable line(s) (cut by a kill): "
                     f"{', '.join(run.bad_lines[:5])}")
    for rule in (_leaders, _library_track, _acknowledged, _failed_and_atomic, _reads, _finals,
                 _graphs, _gc, _loss, _certainty, _errors):
        try:
            rule(run, out, notes)
        except Exception as e:  # a bug of the checker: say so, judge the rest
            notes.append(f"CHECKER ERROR in {rule.__name__}: {type(e).__name__}: {e}")
    return Report(out, _stats(run), notes)


# -- rules -----------------------------------------------------------------------------------


def _leaders(run: _Run, out: list[Violation], notes: list[str]) -> None:
    leads: dict[tuple[str, int], list[Op]] = defaultdict(list)
    for op in run.ops:
        if op.f == "elect" and op.type == "ok" and op.ns is not None:
            leads[(op.ns, int(op.reply["epoch"]))].append(op)
    for (ns, epoch), ops in sorted(leads.items()):
        who = {o.who for o in ops}
        if len(who) > 1:
            out.append(Violation("leader_per_epoch", f"{len(who)} processes lead epoch {epoch}"
                                 f" of {ns}: {sorted(who)}", ns,
                                 history=[line for o in ops for line in o.lines()]))
        grant = run.models[ns].grants.get(epoch)
        for o in ops:
            contender = (o.value or {}).get("contender")
            if grant is None:
                out.append(Violation("leader_per_epoch", f"{contender} leads epoch {epoch} of "
                                     f"{ns}, but the log has no accepted grant of it", ns,
                                     history=o.lines()))
            elif contender is not None and grant[0] != contender:
                out.append(Violation("leader_per_epoch", f"{contender} leads epoch {epoch} of "
                                     f"{ns}, but the log granted it to {grant[0]}", ns,
                                     [grant[1]], o.lines()))


def _library_track(run: _Run, out: list[Violation], notes: list[str]) -> None:
    """The fold's own verdicts (from a fresh client), judged record by record."""
    for ns, decisions in run.decisions.items():
        if decisions is None:
            notes.append(f"{ns}: no decisions file; the fold's verdicts were not judged")
            continue
        m = run.models[ns]
        # A call's records are reported when they arrive (PENDING) and again when their
        # commit decides them: the last verdict per offset is the fold's answer.
        decisions = sorted({d["offset"]: d for d in decisions}.values(),
                           key=lambda d: d["offset"])
        epoch, leader, revoked = 0, None, False
        granted: dict[int, int] = {}
        terminal: dict[str, int] = {}
        reported: set[int] = set()
        for d in decisions:
            v = m.by_offset.get(d["offset"])
            if not d.get("accepted"):
                continue
            ev = v.event if v is not None else None
            if ev is None:
                out.append(Violation("fold_disagrees", f"the fold accepted offset {d['offset']}"
                                     ", which does not decode or is not in the log", ns,
                                     [d["offset"]]))
                reported.add(d["offset"])
                continue
            zombie = " (a nemesis zombie)" if ev.event_id in run.zombies else ""
            t = ev.TYPE
            if t == "LeadershipGranted":
                if ev.prev_epoch != epoch or ev.epoch != ev.prev_epoch + 1:
                    out.append(Violation("grant_not_cas", f"the fold accepted a grant of epoch "
                                         f"{ev.epoch} to {ev.writer!r} with prev_epoch "
                                         f"{ev.prev_epoch} while epoch {epoch} was current"
                                         f"{zombie}", ns, [d["offset"]]))
                    reported.add(d["offset"])
                if ev.epoch in granted:
                    out.append(Violation("leader_per_epoch", f"the fold accepted two grants of "
                                         f"epoch {ev.epoch}", ns,
                                         [granted[ev.epoch], d["offset"]]))
                    reported.add(d["offset"])
                granted[ev.epoch] = d["offset"]
                epoch, leader, revoked = ev.epoch, ev.writer, False
                continue
            why = ("no_leader" if leader is None else "stale_epoch" if ev.epoch < epoch
                   else "future_epoch" if ev.epoch > epoch else "not_leader"
                   if ev.writer != leader else "term_revoked" if revoked else None)
            if why is not None:
                out.append(Violation("stale_write_accepted", f"the fold accepted {t} of "
                                     f"{ev.writer!r} at epoch {ev.epoch} ({why}: epoch {epoch} "
                                     f"of {leader!r}{', revoked' if revoked else ''} was "
                                     f"current){zombie}", ns, [d["offset"]]))
                reported.add(d["offset"])
            if t == "LeadershipRevoked":
                revoked = True
            job = getattr(ev, "job_id", None)
            if job is None:
                continue
            # Records that leave (or keep) the job terminal: its end, a terminal
            # restatement, and the cleanup of its result. (An ABSENT reassertion the fold
            # accepts after the end is the leader's removal of a refused record, planned
            # while the job was live, under a key that holds neither its birth nor its end:
            # it has no effect, and a terminal id is never made unknown.)
            ends = t in ("JobCancelled", "JobTerminated", "JobCleanedUp") or (
                t == "JobReasserted" and ev.status in TERMINAL)
            removal = t == "JobReasserted" and ev.status == "ABSENT"
            if job in terminal and not ends and not removal:
                out.append(Violation("resurrection", f"job {job!r} became terminal at offset "
                                     f"{terminal[job]}; the fold then accepted {t} at offset "
                                     f"{d['offset']}{zombie}", ns, [terminal[job], d["offset"]]))
                reported.add(d["offset"])
            if ends:
                terminal.setdefault(job, d["offset"])
        # Calls the fold half-applied (rule 8: all or none; unknown_job does not sink).
        calls: dict[str, list[tuple[dict[str, Any], Any]]] = defaultdict(list)
        for d in decisions:
            v = m.by_offset.get(d["offset"])
            cid = getattr(v.event, "call_id", None) if v is not None else None
            if cid and d.get("outcome") != "DUPLICATE":
                calls[cid].append((d, v))
        for cid, members in calls.items():
            counted = [(d, v) for d, v in members if d.get("reason") != "unknown_job"]
            took = [d["offset"] for d, _v in counted if d.get("accepted")]
            if 0 < len(took) < len(counted):
                out.append(Violation("call_not_atomic", f"the fold accepted {len(took)} of the "
                                     f"{len(counted)} records of call {cid}", ns,
                                     [d["offset"] for d, _v in counted]))
                reported.update(d["offset"] for d, _v in counted)
        # What the fold said against what the documented rules say, record by record.
        lib = {d["offset"]: d for d in decisions}
        diffs: list[tuple[Verdict, dict[str, Any] | None]] = []
        for v in m.verdicts:
            if v.outcome == "SKIPPED" or v.offset in reported:
                continue
            found = lib.get(v.offset)
            if found is None:
                if v.outcome != "COLLECTED":  # (a collection has no verdict to read back)
                    diffs.append((v, None))
                continue
            theirs = bool(found.get("accepted"))
            quarantine_differs = (found.get("outcome") == "QUARANTINED") != \
                (v.outcome == "QUARANTINED")
            if theirs != v.accepted or quarantine_differs:
                diffs.append((v, found))
        for v, fold_said in diffs[:_CAP]:
            said = ("no verdict" if fold_said is None
                    else f"{fold_said.get('outcome')} ({fold_said.get('reason')})")
            out.append(Violation("fold_disagrees", f"offset {v.offset} {v.etype or v.key}: the "
                                 f"fold said {said}, the documented rules {v.outcome} "
                                 f"({v.reason})", ns, [v.offset]))
        if len(diffs) > _CAP:
            notes.append(f"{ns}: {len(diffs) - _CAP} more fold_disagrees not listed")


def _uncommitted_note(run: _Run, missing: list[int]) -> str:
    """Where the records an acknowledgement names but the readable log lacks are, as a
    read_uncommitted reader saw the partition at the end (the runner's diagnosis files)."""
    path = run.dir / "log_uncommitted.jsonl"
    if not missing or not path.exists():
        return ""
    seen = {r["o"] for r in _jsonl(path, [])}
    marks = run.dir / "watermarks.json"
    wm = json.loads(marks.read_text()) if marks.exists() else {}
    there = sorted(o for o in missing if o in seen)
    return (f" [diagnosis: read_uncommitted sees {len(there)} of the {len(missing)} missing "
            f"offsets ({there[:5]}{'...' if len(there) > 5 else ''}); watermarks {wm}]")


def _acknowledged(run: _Run, out: list[Violation], notes: list[str]) -> None:
    missing: dict[str, list[int]] = defaultdict(list)
    for op in run.ops:
        if op.type != "ok" or op.ns is None:
            continue
        m = run.models[op.ns]
        if op.f in WRITES:
            receipts = (op.value or {}).get("receipts") or []
            for r in receipts:
                v = m.by_offset.get(r["offset"])
                if v is None or v.event_id != r["event_id"]:
                    elsewhere = [x.offset for x in m.by_event.get(r["event_id"], [])]
                    out.append(Violation("ok_write_missing", f"{op.f} acknowledged event "
                                         f"{r['event_id']} at offset {r['offset']}, which holds "
                                         f"{'nothing' if v is None else v.event_id}"
                                         + (f"; the event is at {elsewhere}" if elsewhere
                                            else "; the event is not in the log"),
                                         op.ns, [r["offset"], *elsewhere], op.lines()))
                    if v is None and not elsewhere:
                        missing[op.ns].append(r["offset"])
                    continue
                if not v.accepted and m.accepted(r["event_id"]) is None:
                    out.append(Violation("ok_write_not_accepted", f"{op.f} acknowledged offset "
                                         f"{r['offset']}, which the rules refuse: {v.outcome} "
                                         f"({v.reason})", op.ns, [r["offset"]], op.lines()))
            if op.f in MULTI and len(receipts) != len(op.args.get("jobs", [])):
                out.append(Violation("call_not_atomic", f"{op.f} of {len(op.args['jobs'])} jobs"
                                     f" acknowledged {len(receipts)} records", op.ns,
                                     [r["offset"] for r in receipts], op.lines()))
        elif op.f == "recover":
            for r in (op.value or {}).get("results") or []:
                v = m.by_offset.get(r.get("offset"))
                if v is None or v.job != r["job"] or not v.accepted:
                    out.append(Violation("ok_write_not_accepted", f"recover reported job "
                                         f"{r['job']!r} {r['status']} at offset {r.get('offset')}"
                                         f", where the log has {v.etype if v else 'nothing'} "
                                         f"{v.outcome if v else ''}", op.ns,
                                         [r.get("offset")], op.lines()))
    for ns, offsets in missing.items():
        note = _uncommitted_note(run, offsets)
        if note:
            notes.append(f"{ns}: acknowledged records missing from the readable log{note}")


def _members(m: NamespaceModel, op: Op) -> dict[str, list[Any]]:
    """The records of ``op`` that make up its calls, by call (first copies only), leaving out
    those refused as ``unknown_job`` (rule 8: they do not sink a call)."""
    kinds = {"submit_many": ("JobSubmitted",), "adopt": ("JobAdopted",),
             "recover": ("JobAdopted", "JobRecoveryFailed")}[op.f]
    jobs = set(op.args.get("jobs") or []) if op.f != "recover" else None
    out: dict[str, list[Any]] = defaultdict(list)
    for e in op.event_ids:
        copies = [v for v in m.by_event.get(e, []) if v.outcome != "DUPLICATE"]
        if not copies:
            continue
        v = copies[0]
        if v.etype in kinds and (jobs is None or v.job in jobs) and v.reason != "unknown_job":
            out[getattr(v.event, "call_id", None) or "(no call id)"].append(
                m.accepted(e) or v)
    return out


def _failed_and_atomic(run: _Run, out: list[Violation], notes: list[str]) -> None:
    for op in run.ops:
        if op.ns is None or op.f not in WRITES and op.f != "recover":
            continue
        m = run.models[op.ns]
        if op.type == "fail":
            for e in op.event_ids:
                v = m.accepted(e)
                if v is not None:
                    out.append(Violation("failed_call_had_effect", f"{op.f} raised "
                                         f"{op.reply.get('error')} ({op.reply.get('reason')}), but "
                                         f"its {v.etype} of {v.job or '-'} at offset {v.offset} "
                                         "was accepted", op.ns, [v.offset], op.lines()))
        if op.f not in MULTI and op.f != "recover":
            continue
        if op.f in MULTI and (len(op.args.get("jobs") or []) < 2 or op.type == "ok"):
            continue  # one record; or acknowledged (receipts are checked on their own)
        for call, members in _members(m, op).items():
            took = [v.offset for v in members if v.accepted]
            if 0 < len(took) < len(members):
                out.append(Violation("call_not_atomic", f"{op.f} ({op.type}, "
                                     f"{(op.done or {}).get('error')}) had {len(took)} of the "
                                     f"{len(members)} records of call {call} accepted", op.ns,
                                     [v.offset for v in members], op.lines()))


def _reads(run: _Run, out: list[Violation], notes: list[str]) -> None:
    """A read shows every acknowledgement that completed before it was invoked; except, on
    Kafka, an acknowledgement that completed while the partition's leader was deposed
    (:func:`_deposed_windows`) is not compared with a read invoked in the same window: the
    read may have been served by the deposed leader. Those pairs are counted."""

    def deposed(ns: str, acked_at: float, read_at: float) -> bool:
        for start, end in run.deposed.get(int(run.cfg["partitions"][ns]), ()):
            if start <= acked_at and read_at <= end:
                run.deposed_pairs += 1
                return True
        return False

    acked: dict[str, list[tuple[float, int, Op]]] = defaultdict(list)  # ns -> (t1, epoch, op)
    submits: dict[str, list[tuple[float, str, Op]]] = defaultdict(list)
    ends: dict[str, list[tuple[float, str, Op]]] = defaultdict(list)
    for op in run.ops:
        if op.type != "ok" or op.ns is None:
            continue
        if op.f == "elect":
            acked[op.ns].append((op.finished_at, int(op.reply["epoch"]), op))
        elif op.f in ("submit", "submit_many"):
            jobs = [op.args["job"]] if op.f == "submit" else op.args.get("jobs", [])
            submits[op.ns] += [(op.finished_at, j, op) for j in jobs]
        elif op.f in ("cancel", "terminate"):
            ends[op.ns].append((op.finished_at, op.args["job"], op))
    for op in run.ops:
        if op.type != "ok" or op.f not in ("read", "leader") or op.ns is None:
            continue
        if op.f == "leader":
            seen = int((op.value or {}).get("epoch", 0))
            before = [(e, o) for t, e, o in acked[op.ns] if t < op.t0 and e > seen
                      and not deposed(op.ns, t, op.t0)]
            if before:
                e, o = max(before, key=lambda x: x[0])
                out.append(Violation("stale_read", f"a read of {op.ns} invoked after epoch {e} "
                                     f"was acknowledged shows epoch {seen}", op.ns,
                                     history=o.lines() + op.lines()))
            continue
        jobs = (op.value or {}).get("jobs") or {}
        for t, job, o in submits[op.ns]:
            if t < op.t0 and job not in jobs and not deposed(op.ns, t, op.t0):
                out.append(Violation("acked_write_lost", f"job {job!r} was acknowledged before "
                                     f"a read of {op.ns} that does not show it", op.ns,
                                     history=o.lines() + op.lines()))
        for t, job, o in ends[op.ns]:
            if t < op.t0 and jobs.get(job) not in TERMINAL and not deposed(op.ns, t, op.t0):
                out.append(Violation("resurrection", f"job {job!r} was ended before a read of "
                                     f"{op.ns} that shows it {jobs.get(job)}", op.ns,
                                     history=o.lines() + op.lines()))


def _model_job(m: NamespaceModel, job: str) -> dict[str, Any]:
    j = m.jobs[job]
    g = j.graph
    graph = None if g is None else {"kind": "inline", "size": g[1]} if g[0] == "inline" else \
        {"kind": "blob", "uri": g[1], "sha256": g[2], "size": g[3]}
    live = j.live
    return {"status": j.status, "owner_epoch": j.owner if live else None,
            "graph": graph if live else None, "error": j.error if live else None,
            "consecutive_failures": len(j.cp.counted) + j.cp.unknown if live else 0,
            "checkpoints": [list(c) for c in j.cp.retained] if live else []}


def _library_job(j: dict[str, Any]) -> dict[str, Any]:
    live = j["status"] not in TERMINAL
    return {"status": j["status"], "owner_epoch": j.get("owner_epoch") if live else None,
            "graph": j.get("graph") if live else None, "error": j.get("error") if live else None,
            "consecutive_failures": j.get("consecutive_failures", 0) if live else 0,
            "checkpoints": [[c["checkpoint_id"], c["location"]] for c in j.get("checkpoints")
                            or []] if live else []}


def _compare(run: _Run, ns: str, state: dict[str, Any], rule: str, source: str,
             out: list[Violation]) -> None:
    m = run.models[ns]
    theirs = {j["job_id"]: _library_job(j) for j in state.get("jobs", [])}
    diffs = []
    for field_ in ("epoch", "leader", "revoked"):
        mine = getattr(m, field_)
        if state.get(field_) != mine:
            diffs.append(f"{field_}: {state.get(field_)!r}, the model {mine!r}")
    resurrected = []
    for job in sorted(set(theirs) | set(m.jobs)):
        mine = _model_job(m, job) if job in m.jobs else None
        if theirs.get(job) == mine:
            continue
        if mine is not None and mine["status"] in TERMINAL and job in theirs and \
                theirs[job]["status"] not in TERMINAL:
            resurrected.append(job)
        diffs.append(f"job {job}: {theirs.get(job)}, the model {mine}")
    if resurrected:
        out.append(Violation("resurrection", f"{source} shows live job(s) that the log ended: "
                             f"{resurrected[:10]}", ns))
    if diffs:
        out.append(Violation(rule, f"{source} differs from the model in {len(diffs)} "
                             f"place(s): " + "; ".join(diffs[:8]), ns))


def _finals(run: _Run, out: list[Violation], notes: list[str]) -> None:
    for ns, final in run.finals.items():
        if final is None:
            notes.append(f"{ns}: no final states; fresh clients and snapshots were not judged")
            continue
        _compare(run, ns, final["fresh"], "fresh_client_disagrees", "a fresh client", out)
        for snap in final.get("snapshots", []):
            if "error" in snap:
                out.append(Violation("snapshot_start_disagrees", f"starting from snapshot "
                                     f"{snap['path']} failed: {snap['error']}", ns))
                continue
            if not str(snap.get("started_from", "")).startswith("snapshot"):
                notes.append(f"{ns}: snapshot {snap['path']} was not used: "
                             f"{snap.get('started_from')}")
            _compare(run, ns, snap["state"], "snapshot_start_disagrees",
                     f"a client started from {snap['path']}", out)


def _blob_path(run: _Run, uri: str) -> Path:
    """Where the blob of ``uri`` is, also when the run folder was moved."""
    path = Path(urlsplit(uri).path)
    root = Path(run.cfg.get("blob_dir", "/nonexistent"))
    try:
        return run.dir / "blobs" / path.relative_to(root)
    except ValueError:
        return path


def _graphs(run: _Run, out: list[Violation], notes: list[str]) -> None:
    for ns, m in run.models.items():
        for v in m.verdicts:
            if v.etype == "JobRecoveryFailed" and v.accepted and \
                    HOOK_FAILURE not in (v.event.error or ""):
                out.append(Violation("graph_lost", f"recovery of job {v.job!r} failed: "
                                     f"{v.event.error}", ns, [v.offset]))
        for job, j in sorted(m.jobs.items()):
            if not j.referenced or j.graph is None or j.graph[0] != "blob":
                continue
            _kind, uri, sha, size = j.graph
            what = "live job" if j.live else "dirty result of job"
            path = _blob_path(run, uri)
            try:
                data = path.read_bytes()
            except OSError:
                out.append(Violation("graph_lost", f"{what} {job!r} references blob {sha[:12]}"
                                     f", which is gone from the store at the end", ns))
                continue
            if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
                out.append(Violation("graph_lost", f"{what} {job!r}'s blob {sha[:12]} does not "
                                     "verify at the end", ns))


def _gc(run: _Run, out: list[Violation], notes: list[str]) -> None:
    tol = float(run.cfg.get("clock_tolerance", 1.0))
    for op in run.ops:
        if op.f != "gc" or op.type != "ok":
            continue
        t0, t1 = (op.t0 - tol) * 1000, (op.finished_at + tol) * 1000
        for uri in (op.value or {}).get("deleted") or []:
            for ns, m in run.models.items():
                for job, changes in m.changes.items():
                    if not any(c[3] == uri for c in changes):
                        continue
                    live, held = m.live_at(job, t0)
                    if live and held == uri and not m.changed_between(job, t0, t1):
                        out.append(Violation("gc_deleted_live_blob", f"collect_garbage in "
                                             f"{op.ns} deleted the blob of job {job!r} of {ns}, "
                                             "live (or its result dirty) throughout the "
                                             "collection", ns,
                                             [c[0] for c in changes], op.lines()))


def _intervals(run: _Run) -> tuple[dict[int, list[tuple[float, float]]],
                                   list[tuple[float, float]]]:
    """Per pid, when it was paused; and when every client was cut off (broker, network)."""
    per_pid: dict[int, list[tuple[float, float]]] = defaultdict(list)
    starts: dict[tuple[str, int], float] = {}
    everyone: list[tuple[float, float]] = []
    end = float(run.cfg.get("deadline", 0)) + 60
    for n in run.nemesis:
        kind = n.get("kind", "")
        if kind.startswith("net_"):
            everyone.append((n["time"], n["time"] + float(n.get("seconds", 0))))
        elif n.get("phase") == "start" and "pid" in n:
            starts[(kind, n["pid"])] = n["time"]
        elif n.get("phase") == "end" and "pid" in n:
            s = next((starts.pop(k) for k in list(starts) if k[1] == n["pid"]), None)
            if s is not None:
                iv = (s, n["time"])
                (everyone if n.get("process") == "broker" else per_pid[n["pid"]]).append(iv)
    for (kind, pid), s in starts.items():
        (everyone if kind == "broker_pause" else per_pid[pid]).append((s, end))
    return per_pid, everyone


def _running(t0: float, t1: float, off: list[tuple[float, float]]) -> float:
    """Seconds in ``[t0, t1]`` outside every interval of ``off``."""
    if t1 <= t0:
        return 0.0
    cut = sorted((max(a, t0), min(b, t1)) for a, b in off if b > t0 and a < t1)
    total, at = 0.0, t0
    for a, b in cut:
        if a > at:
            total += a - at
        at = max(at, b)
    return total + max(0.0, t1 - at)


def _loss(run: _Run, out: list[Violation], notes: list[str]) -> None:
    lease, timeout = float(run.cfg["lease"]), float(run.cfg["timeout"])
    bound = lease + 4 * (2 * timeout + 0.25) + 2
    per_pid, everyone = _intervals(run)
    last_seen: dict[tuple[str, int], float] = {}
    pids: dict[tuple[str, int], int] = {}
    for op in run.ops:
        last_seen[op.who] = max(last_seen.get(op.who, 0), op.t1 or op.t0)
        pids[op.who] = op.invoke["pid"]
    revoked = {(n["process"], int(n["incarnation"]), n.get("ns"), n.get("epoch")): n["time"]
               for n in run.notes if n.get("f") == "revoked"}
    for n in run.notes:
        who = (n["process"], int(n["incarnation"]))
        last_seen[who] = max(last_seen.get(who, 0), n["time"])
    ended = {(p["process"], int(p["incarnation"])): p["end"] for p in run.procs}
    resigned = {(o.who, o.ns, o.invoke.get("epoch")) for o in run.ops if o.f == "revoke"}
    for op in run.ops:
        if op.f != "elect" or op.type != "ok" or op.ns is None:
            continue
        ns, epoch = op.ns, int(op.reply["epoch"])
        if (op.who, ns, epoch) in resigned:
            continue
        later = [g for e, g in run.models[ns].grants.items() if e > epoch]
        if not later:
            continue
        t_g = min(g[2] for g in later if g[2] is not None) / 1000 if any(
            g[2] is not None for g in later) else None
        if t_g is None:
            continue
        t_r = revoked.get((*op.who, ns, epoch))
        t_end = min(ended.get(op.who, float("inf")), last_seen.get(op.who, t_g))
        until = t_r if t_r is not None else t_end
        off = per_pid.get(pids.get(op.who, -1), []) + everyone
        ran = _running(t_g, until, off)
        if ran > bound:
            how = f"learned it {ran:.1f} s of running time later" if t_r is not None else \
                f"never learned it in {ran:.1f} s of running time"
            out.append(Violation("loss_not_learned", f"{op.who[0]}.{op.who[1]} led epoch {epoch}"
                                 f" of {ns}; a newer grant landed, and it {how} (bound "
                                 f"{bound:.1f} s){_stacks(run, op.who)}", ns,
                                 [min(g[1] for g in later)], op.lines()))


def _certainty(run: _Run, out: list[Violation], notes: list[str]) -> None:
    """Rule two_leaders: each ``certain`` note says until when its process believed, at the
    note's time, that it certainly led its epoch; a newer grant stamped before that moment
    (broker time, or on the embedded broker its contender's send time: earlier still) means
    two processes believed they led at once (issue 42, finding 3)."""
    reported: set[tuple[str, int, str, int]] = set()
    resigned: dict[tuple[str, int, str | None, int], float] = {}  # its own revoke, invoked
    for o in run.ops:
        if o.f == "revoke" and o.invoke.get("epoch") is not None:
            k = (*o.who, o.ns, int(o.invoke["epoch"]))
            resigned[k] = min(resigned.get(k, o.t0), o.t0)
    for n in run.notes:
        if n.get("f") != "certain" or n.get("ns") not in run.models:
            continue
        ns, epoch, until = n["ns"], int(n["epoch"]), float(n["until"])
        # A process that gave its term up stopped believing it led when it began to.
        until = min(until, max(float(n["time"]), resigned.get(
            (n["process"], int(n["incarnation"]), ns, epoch), until)))
        stamps = [(g[2], e, g) for e, g in run.models[ns].grants.items()
                  if e > epoch and g[2] is not None]
        if not stamps:
            continue
        t_g, newer, grant = min(stamps)
        over = until - t_g / 1000
        who = (n["process"], int(n["incarnation"]), ns, epoch)
        if over > 0.01 and who not in reported:
            reported.add(who)
            out.append(Violation("two_leaders", f"{n['process']}.{n['incarnation']} believed "
                                 f"at {n['time']:.3f} that it certainly led epoch {epoch} of "
                                 f"{ns} for {until - float(n['time']):.2f} s more, but epoch "
                                 f"{newer}'s grant ({grant[0]}) landed {over:.2f} s before "
                                 "that", ns, [grant[1]], [_short(n)]))


def _stacks(run: _Run, who: tuple[str, int]) -> str:
    """Where the process's threads' stacks are, if the runner had to kill it and it dumped
    them first (the runner's SIGUSR1 before SIGKILL)."""
    err = run.dir / "logs" / f"{who[0]}.{who[1]}.err"
    try:
        dumped = "most recent call first" in err.read_text(errors="replace")
    except OSError:
        return ""
    return f" [it would not stop; its threads' stacks at the kill: {err}]" if dumped else ""


def _errors(run: _Run, out: list[Violation], notes: list[str]) -> None:
    for op in run.ops:
        if op.done is not None and op.done.get("unexpected"):
            out.append(Violation("unexpected_error", f"{op.f} raised {op.done.get('error')}, "
                                 "outside the documented errors: "
                                 f"{(op.done.get('trace') or '')[-400:]}", op.ns,
                                 history=op.lines()))
    for n in run.notes:
        if n.get("f") in ("worker_error",) or n.get("unexpected"):
            out.append(Violation("unexpected_error", f"{n['process']}.{n['incarnation']}: "
                                 f"{(n.get('reason') or '')[-400:]}", n.get("ns"),
                                 history=[_short(n)]))
    for p in run.procs:
        if p.get("how") == "exited" and p.get("returncode") not in (0, None):
            out.append(Violation("unexpected_error", f"worker {p['process']}.{p['incarnation']} "
                                 f"exited with code {p['returncode']} (see logs/"
                                 f"{p['process']}.{p['incarnation']}.err)"))


def _stats(run: _Run) -> dict[str, Any]:
    ops: dict[str, int] = defaultdict(int)
    by_f: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for op in run.ops:
        ops[op.type] += 1
        by_f[op.f][op.type] += 1
    faults: dict[str, int] = defaultdict(int)
    for n in run.nemesis:
        if n.get("skipped") or n.get("phase") == "end" or n.get("kind") == "resume":
            continue
        faults[n["kind"] if n["kind"] != "zombie" else f"zombie_{n['sub']}"] += 1
    outcomes: dict[str, int] = defaultdict(int)
    for m in run.models.values():
        for v in m.verdicts:
            if v.outcome != "SKIPPED":
                outcomes[v.outcome] += 1
    return {"ops": dict(ops), "ops_by_f": {f: dict(c) for f, c in sorted(by_f.items())},
            "concurrency": _concurrency(run),
            "faults": dict(faults), "records": sum(outcomes.values()),
            "deposed": {"windows": sum(len(w) for w in run.deposed.values()),
                        "pairs_not_compared": run.deposed_pairs},
            "outcomes": dict(outcomes), "fencing_refusals": sum(
                1 for m in run.models.values() for v in m.verdicts
                if v.reason in FENCING_REASONS)}


def _concurrency(run: _Run) -> dict[str, int]:
    """How much the writes of one term overlapped in one process (statistics, no rule).

    ``overlapping``: write calls in flight while another write call of the same process and
    term was; of them ``ok``, ``refused`` (fail; ``fenced`` of those: ``Fenced``, the term
    over while the call was made), ``unknown`` (info) and ``cut`` (no completion: a kill);
    ``revokes``: revokes that overlapped another write of their term;
    ``max_in_flight``: the most write calls of one term in flight at once in a process.
    A call without a completion counts as in flight until its incarnation's last line."""
    last: dict[tuple[str, int], float] = defaultdict(float)
    for op in run.ops:
        last[op.who] = max(last[op.who], op.t1 or op.t0)
    for n in run.notes:
        who = (n["process"], int(n["incarnation"]))
        last[who] = max(last[who], float(n["time"]))
    groups: dict[tuple[Any, ...], list[tuple[float, float, Op]]] = defaultdict(list)
    for op in run.ops:
        if op.f in WRITES and op.ns is not None:
            key = (op.who, op.ns, op.invoke.get("epoch"))
            groups[key].append((op.t0, op.t1 if op.t1 is not None else last[op.who], op))
    out = {"overlapping": 0, "ok": 0, "refused": 0, "fenced": 0, "unknown": 0, "cut": 0,
           "revokes": 0, "max_in_flight": 0}
    kinds = {"ok": "ok", "fail": "refused", "info": "unknown", "unfinished": "cut"}
    for calls in groups.values():
        calls.sort(key=lambda c: c[0])
        overlapped: set[int] = set()
        active: list[tuple[float, int]] = []  # (end, index) of the calls in flight
        for i, (t0, t1, _op) in enumerate(calls):
            active = [(e, j) for e, j in active if e > t0]
            if active:
                overlapped.add(i)
                overlapped.update(j for _e, j in active)
            active.append((t1, i))
            out["max_in_flight"] = max(out["max_in_flight"], len(active))
        for i in overlapped:
            op = calls[i][2]
            out["overlapping"] += 1
            out[kinds[op.type]] += 1
            out["revokes"] += op.f == "revoke"
            out["fenced"] += op.type == "fail" and op.reply.get("error") == "Fenced"
    return out
