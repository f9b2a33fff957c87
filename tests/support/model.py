"""Models for the property tests: Kafka's log cleaner, and a log written by simulated clients.

The cleaner model (:func:`compact`) follows Kafka's ``LogCleaner``:

* it cleans a prefix of the log, ``[0, U)``, where ``U`` is no later than the
  first record younger than ``min.compaction.lag.ms`` (segment boundaries can
  only make ``U`` earlier, so any smaller ``U`` is also a legal cleaning);
* within that prefix a record is removed if a later record with the same key
  exists in the prefix (the offset map is built from the cleanable range);
* records of aborted transactions are removed and never enter the offset
  map (``Cleaner.buildOffsetMapForSegment``: "If the batch is aborted, do not
  bother populating the offset map");
* a tombstone in the prefix is removed once older than ``delete.retention.ms``;
* nothing at or after ``U`` is touched.

The simulated clients (:class:`Sim`) write through the same pure code the real
client uses (event construction, :func:`registry.fold.plan_reassertions`) and
read the log as read_committed consumers do (aborted records invisible).
"""

from __future__ import annotations

import dataclasses
import io
import struct
from dataclasses import dataclass, field

import fastavro

from registry.events import (
    LAYOUT,
    UNKNOWN_CHECKPOINT,
    CallCommitted,
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointTriggered,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobCleanedUp,
    JobEvent,
    JobLockReleased,
    JobRecoveryFailed,
    JobRescaled,
    JobRestarted,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeadershipGranted,
    LeadershipRevoked,
    LeaseRenewed,
    VertexParallelism,
    as_call,
    new_event_id,
)
from registry.fold import (
    DUPLICATE_WINDOW_MS,
    CheckpointRuleViolation,
    checkpoint_step,
    failure_reason_counts,
    fencing_reason,
    fold,
    plan_collection,
    plan_reassertions,
)
from registry.image import Image, LogRecord
from registry.keys import checkpoints_key, job_key, lock_key, record_key, term_key
from registry.log import TopicConfig
from registry.wire import default_codec, encode
from registry.wire.mapping import to_avro

NS = "prod"
TOPIC = TopicConfig()


@dataclass(frozen=True)
class Rec:
    """A record in the modelled partition."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    aborted: bool = False

    def as_log_record(self) -> LogRecord:
        return LogRecord(self.offset, self.key, self.value, self.timestamp)


def visible(log: list[Rec]) -> list[LogRecord]:
    """What a read_committed consumer reads."""
    return [r.as_log_record() for r in log if not r.aborted]


def cleanable_limit(log: list[Rec], now: int, config: TopicConfig = TOPIC) -> int:
    """The largest legal ``U``: index of the first record younger than the lag."""
    for i, r in enumerate(log):
        if r.timestamp > now - config.min_compaction_lag_ms:
            return i
    return len(log)


def compact(log: list[Rec], now: int, upto: int | None = None,
            config: TopicConfig = TOPIC) -> list[Rec]:
    """One cleaner pass at time ``now`` over ``[0, upto)`` (default: the largest legal prefix)."""
    limit = cleanable_limit(log, now, config)
    u = limit if upto is None else min(upto, limit)
    newest: dict[bytes | None, int] = {}
    for r in log[:u]:
        if not r.aborted and r.key is not None:
            newest[r.key] = r.offset
    out: list[Rec] = []
    for r in log[:u]:
        if r.aborted:
            continue
        if r.key is not None and newest[r.key] != r.offset:
            continue
        if r.value is None and r.timestamp < now - config.delete_retention_ms:
            continue
        out.append(r)
    return out + log[u:]


# -- simulated clients -----------------------------------------------------------

JOBS = ("a", "b", "c", "d")
CHECKPOINT_KINDS = {"trigger": CheckpointTriggered, "complete": CheckpointCompleted,
                    "cpfail": CheckpointFailed, "discard": CheckpointDiscarded}


# Failures that do not count (Flink's JOB_FAILOVER_REGION), in the trigger phase (id -1;
# counted for an odd drawn id, FINALIZE_CHECKPOINT_FAILURE, not for an even one,
# CHANNEL_STATE_SHARED_STREAM_EXCEPTION), restarts, and rescales (issue 43: the drawn id
# picks the keyed vertex's parallelism, 1 to 4, so consecutive rescales often differ).
EXTRA_CHECKPOINT_KINDS = ("cpskip", "trigfail", "restart", "rescale")


def checkpoint_event(view, kind, cp: int, common: dict):
    """The checkpoint event a client writes: it carries the state the fold's rule gives.

    ``kind`` is an event class or one of :data:`EXTRA_CHECKPOINT_KINDS`."""
    failure_reason = "CHECKPOINT_DECLINED"
    if kind == "cpskip":
        kind, failure_reason = CheckpointFailed, "JOB_FAILOVER_REGION"
    elif kind == "trigfail":
        kind, failure_reason = CheckpointFailed, ("FINALIZE_CHECKPOINT_FAILURE" if cp % 2
                                                  else "CHANNEL_STATE_SHARED_STREAM_EXCEPTION")
        cp = UNKNOWN_CHECKPOINT
    elif kind == "restart":
        kind, cp = JobRestarted, view.checkpoints.last_completed
    requirements: tuple = ()
    if kind == "rescale":
        requirements = (VertexParallelism("0" * 32, 1, 1),
                        VertexParallelism("f" * 32, 1, 1 + cp % 4))
        kind, cp = JobRescaled, UNKNOWN_CHECKPOINT
    try:
        state, _ = checkpoint_step(view.checkpoints, kind, cp, location=f"loc-{cp}",
                                   retained=view.retained_checkpoints,
                                   failure_reason=failure_reason, requirements=requirements)
    except CheckpointRuleViolation:  # the fold will refuse it; the client writes it anyway
        state = dataclasses.replace(view.checkpoints, seq=view.checkpoints.seq + 1)
    extra = {CheckpointCompleted: {"location": f"loc-{cp}"},
             CheckpointFailed: {"reason": "declined", "task": f"task-{cp}",
                                "failure_reason": failure_reason,
                                "reason_counts": failure_reason_counts(failure_reason)},
             CheckpointDiscarded: {"reason": "declined"},
             JobRestarted: {"reason": "over budget"},
             JobRescaled: {"reason": "autoscaler"}}.get(kind, {})
    return kind(job_id=view.job_id, checkpoint_id=cp, state=state, **extra, **common)


CONTENDERS = ("jm-1", "jm-2", "jm-3")


@dataclass
class Actor:
    """A client: the prefix of the log it has read, and the term it believes it holds."""

    name: str
    seen: int = 0
    term: int | None = None
    renewal: int = 0  # the ordinal of the last renewal it sent in its term (fold rule 3)
    unconfirmed: int = 0  # its renewals whose write failed (they move later ones apart)


@dataclass
class Sim:
    """Builds a log by interpreting ops; every client write mirrors :class:`registry.Term`."""

    log: list[Rec] = field(default_factory=list)
    now: int = 1_000_000
    next_offset: int = 0
    actors: dict[str, Actor] = field(default_factory=lambda: {c: Actor(c) for c in CONTENDERS})
    reassert: bool = True  # switch off to show the hazard the reassertions prevent
    # the record layout its clients write (their grants say it; None: this module's LAYOUT
    # when they write): 1 writes checkpoint records under the job's one checkpoints key, as
    # a jobreg before layout 2 did
    layout: int | None = None
    client_records: list[int] = field(default_factory=list)  # indices of job records clients wrote

    def layout_now(self) -> int:
        return LAYOUT if self.layout is None else self.layout

    def key(self, event) -> str:
        """The key a client of this layout writes ``event`` under."""
        if self.layout_now() < 2 and isinstance(event, CheckpointEvent):
            return checkpoints_key(NS, event.job_id)
        return record_key(event)

    def image(self, upto: int | None = None) -> Image:
        return fold(visible(self.log[:upto]), NS)

    def append(self, key: str | bytes | None, value: bytes | None, aborted: bool = False) -> int:
        if isinstance(key, str):
            key = key.encode()
        off = self.next_offset
        self.log.append(Rec(off, key, value, self.now, aborted))
        # transaction markers and other partitions' gaps: offsets are not dense
        self.next_offset += 2
        self.now += 1
        return off

    # ops ----------------------------------------------------------------------
    def sync(self, who: str) -> None:
        self.actors[who].seen = len(self.log)

    def tick(self, ms: int) -> None:
        self.now += ms

    def claim(self, who: str, external: bool = False) -> None:
        """A claim from the actor's (possibly stale) view, then read to its grant: an
        election's (a compare-and-set on the epoch and the renewals it saw, fold rule 3),
        or ``external``: claim_leadership (the epoch only)."""
        a = self.actors[who]
        view = self.image(a.seen)
        saw = None if external else (view.term.renewal if view.term is not None else 0)
        g = LeadershipGranted(event_id=new_event_id(), namespace=NS, epoch=view.epoch + 1,
                              writer=who, created_at=0, prev_epoch=view.epoch,
                              saw_renewal=saw, layout=self.layout_now())
        self.append(record_key(g), encode(g))
        a.seen = len(self.log)
        img = self.image()
        if img.epoch == g.epoch and img.leader == who:
            a.term, a.renewal, a.unconfirmed = g.epoch, 0, 0
            self.write(who, None, None)  # Term._start(): reassert

    def write(self, who: str, cmd: str | None, job: str | None, aborted: bool = False,
              cp: int = 1) -> None:
        """A Term command by ``who`` (with the epoch it believes it holds): the leader first
        collects the records no state stands on of the jobs it will restate (fold rule 6),
        then the command (:meth:`command`)."""
        a = self.actors[who]
        if a.term is None:
            return
        if self.reassert and not aborted:
            img = self.image()
            first = plan_collection(img, first=True)
            if first and img.epoch == a.term and img.leader == who and not img.revoked:
                self.collect(who, first)
        self.command(who, cmd, job, aborted, cp)

    def command(self, who: str, cmd: str | None, job: str | None, aborted: bool = False,
                cp: int = 1) -> None:
        """The command's write: the reassertions its view plans, its records, the settling."""
        a = self.actors[who]
        if a.term is None:
            return
        view = self.image(a.seen)
        pairs = plan_reassertions(view, a.term, who) if self.reassert else []
        common = dict(event_id=new_event_id(), namespace=NS, epoch=a.term, writer=who,
                      created_at=0)
        ev = None
        if cmd == "submit":
            ev = JobSubmitted(job_id=job, graph=InlineGraph(f"graph-{job}".encode()),
                              max_checkpoint_failures=cp % 3, retained_checkpoints=1 + cp % 2,
                              **common)
        elif cmd == "revoke":
            ev = LeadershipRevoked(**common)
        elif cmd == "renew" and fencing_reason(view.epoch, view.leader, view.revoked, a.term,
                                               who) is not None:
            pass  # the client sends nothing once its image shows the term over (Fenced)
        elif cmd == "renew":
            # The election's renewer: one more than the highest ordinal it folded or sent,
            # and the refused grants it folded plus its renewals that failed (they choose
            # the key, fold rule 3). An aborted one failed: the next ones move apart.
            info = view.term if view.term is not None and view.term.epoch == a.term else None
            a.renewal = max(info.renewal if info else 0, a.renewal) + 1
            ev = LeaseRenewed(renewal=a.renewal, attempts=a.unconfirmed + (
                info.refused_grants if info else 0), **common)
            a.unconfirmed += aborted
        elif cmd in ("publish", "unpublish"):
            # Flink's leader information (fold rule 9): the drawn job names the component.
            ev = LeaderInformationPublished(
                component=job, session=f"session-{a.term}",
                address=f"addr-{cp}" if cmd == "publish" else None, **common)
        elif cmd in ("submit_many", "adopt_many"):
            # One call of several records (fold rule 8): ``job`` and the next one or two,
            # so a call may name a known job (a submit that sinks it) or a terminal one.
            i = JOBS.index(job)
            names = [JOBS[(i + k) % len(JOBS)] for k in range(2 + cp % 2)]
            if cmd == "submit_many":
                events = [JobSubmitted(job_id=n, graph=InlineGraph(f"graph-{n}".encode()),
                                       **{**common, "event_id": new_event_id()}) for n in names]
            else:
                names = [n for n in names if n in view.jobs]  # the client refuses unknown ids
                events = [JobAdopted(job_id=n, **{**common, "event_id": new_event_id()})
                          for n in names]
            pairs += [(self.key(e), e) for e in as_call(events)]
        elif cmd is not None and (view.jobs if cmd != "clean" else view.results()):
            # commands on known jobs (the client refuses unknown ids before writing);
            # the drawn name picks one of the jobs this client knows
            # (mark_clean: the client refuses a live job, so a terminal one)
            known = sorted(j for j, v in view.jobs.items() if cmd != "clean" or not v.live)
            job = known[JOBS.index(job) % len(known)] if known else job
            if cmd in CHECKPOINT_KINDS or cmd in EXTRA_CHECKPOINT_KINDS:
                ev = checkpoint_event(view.jobs[job], CHECKPOINT_KINDS.get(cmd, cmd), cp, common)
            else:
                # A cancel or terminate carries the result as the client sees it (fold rule 5).
                result = dict(graph=view.jobs[job].graph, checkpoints=view.jobs[job].checkpoints)
                ended = view.jobs[job]
                ev = {"cancel": lambda: JobCancelled(job_id=job, reason=f"r{cp}", **result,
                                                     **common),
                      "finish": lambda: JobTerminated(job_id=job, state="FINISHED",
                                                      reason="" if cp % 2 else "done", **result,
                                                      **common),
                      "fail": lambda: JobTerminated(job_id=job, state="FAILED",
                                                    reason=f"boom {cp}", **result, **common),
                      "clean": lambda: JobCleanedUp(job_id=job, status=ended.status,
                                                    reason=ended.reason, **common),
                      "adopt": lambda: JobAdopted(job_id=job, **common),
                      "release": lambda: JobLockReleased(job_id=job, **common),
                      "recfail": lambda: JobRecoveryFailed(job_id=job, error="boom", **common),
                      }[cmd]()
        if ev is not None:
            pairs.append((self.key(ev), ev))
        for key, e in pairs:
            self.append(key, encode(e), aborted)
            if not aborted and isinstance(e, (JobEvent, LeaderInformationPublished)):
                # the client re-sends these verbatim
                self.client_records.append(len(self.log) - 1)
        a.seen = len(self.log)
        if self.reassert and not aborted:
            img = self.image()
            if img.epoch == a.term and img.leader == who and not img.revoked and img.unsettled \
                    and plan_reassertions(img, a.term, who):
                self.write(who, None, None)  # the client settles after a refusal
                return
            if img.epoch == a.term and img.leader == who and not img.revoked:
                self.collect(who, plan_collection(img))

    def collect(self, who: str, keys: list[str]) -> None:
        """Fold rule 6's collection (``TermWrites.collect``: one plain write of the
        idempotent producer, no transaction): a tombstone per key, in order."""
        for key in keys:
            self.append(key, None)
        self.actors[who].seen = len(self.log)

    def raw(self, kind: str, epoch: int, writer: str, job: str, key_choice: int) -> None:
        """A zombie that ignores fencing: any event, any epoch, on some job key (choice 0: the
        event's own key, the job's key for junk; 1: the job's lock key; 2: another job's key;
        3: the job's key, where a jobreg before births and ends had keys of their own wrote
        submits and ends)."""
        keys = [job_key(NS, job), lock_key(NS, job), job_key(NS, JOBS[(JOBS.index(job) + 1) % len(JOBS)]),
                job_key(NS, job)]
        key = keys[key_choice % len(keys)]
        own = key_choice % len(keys) == 0
        common = dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer,
                      created_at=0)
        if kind == "garbage":
            self.append(key, b"\x00\x00\x00\x00\x63not avro at all")
            return
        if kind == "tombstone":
            self.append(key, None)
            return
        if kind == "publish":
            # A deposed leader (or one that never led) publishing under its own epoch: the
            # key is its own (a client keys a record by its content), fold rule 9.
            ev = LeaderInformationPublished(component=job, session=f"zombie-{epoch}",
                                            address=f"zombie-{key_choice}", **common)
            self.append(record_key(ev), encode(ev))
            return
        if kind in ("call", "torn"):
            # A zombie's call of two submits and an adopt, whole or without its commit.
            others = [JOBS[(JOBS.index(job) + k) % len(JOBS)] for k in (1, 2)]
            events = [JobSubmitted(job_id=job, graph=InlineGraph(b"zombie"), **common),
                      JobSubmitted(job_id=others[0], graph=InlineGraph(b"zombie"),
                                   **{**common, "event_id": new_event_id()}),
                      JobAdopted(job_id=others[1], **{**common, "event_id": new_event_id()})]
            records = as_call(events)
            for e in records[:-1] if kind == "torn" else records:
                self.append(record_key(e), encode(e))
            return
        ev = {"submit": lambda: JobSubmitted(job_id=job, graph=InlineGraph(b"zombie"), **common),
              "cancel": lambda: JobCancelled(job_id=job, **common),
              "clean": lambda: JobCleanedUp(job_id=job, status="FINISHED", **common),
              "release": lambda: JobLockReleased(job_id=job, **common),
              "adopt": lambda: JobAdopted(job_id=job, **common),
              "revoke": lambda: LeadershipRevoked(**common)}[kind]()
        if kind == "revoke":
            key = term_key(NS, epoch, ev.event_id)
        elif own:
            key = record_key(ev)
        self.append(key, encode(ev))

    def duplicate(self, index: int) -> None:
        """Re-send an earlier client record verbatim: a retry whose first copy landed after all.

        Only the client re-sends records (README, assumption 3); its records
        always carry an epoch that was granted before it wrote them.
        """
        # ... and every copy lands within one duplicate window of the first (assumption 5).
        recent = [i for i in self.client_records
                  if self.now // DUPLICATE_WINDOW_MS <= self.log[i].timestamp // DUPLICATE_WINDOW_MS + 1]
        if recent:
            r = self.log[recent[index % len(recent)]]
            event = default_codec().decode(r.value)
            call = getattr(event, "call_id", None)
            if r.key is not None and event.event_id.encode() in r.key and call is not None:
                # a call's submit under its birth key: the client re-sends the whole call as
                # a fresh call (fresh records, keys and commit, registry.writes)
                codec, fresh_call = default_codec(), new_event_id()
                for c in [c for c in self.log if c.value is not None and not c.aborted]:
                    try:
                        e = codec.decode(c.value)
                    except Exception:
                        continue
                    if isinstance(e, CallCommitted) and e.event_id == call:
                        self.append(c.key.replace(call.encode(), fresh_call.encode()),
                                    encode(dataclasses.replace(e, event_id=fresh_call)))
                    elif getattr(e, "call_id", None) == call:
                        f = dataclasses.replace(e, event_id=new_event_id(), call_id=fresh_call)
                        self.append(c.key.replace(e.event_id.encode(), f.event_id.encode()),
                                    encode(f))
                return
            if r.key is not None and event.event_id.encode() in r.key:
                # under a key of its own (a job's end or birth): the client re-sends a fresh event
                # under a fresh key (registry.writes), so that no such key is written twice
                fresh = dataclasses.replace(event, event_id=new_event_id())
                self.append(r.key.replace(event.event_id.encode(), fresh.event_id.encode()),
                            encode(fresh))
                return
            self.append(r.key, r.value)

    def settle(self) -> None:
        """A leader is back within the lag: it catches up and claims (which reasserts)."""
        who = CONTENDERS[0]
        self.sync(who)
        self.claim(who)


def encode_with(event, schema_id: int) -> bytes:
    """``event`` encoded with the catalog's schema ``schema_id`` (an older version): a record
    as a jobreg of that time wrote it, for the schema evolution tests."""
    entry = default_codec().catalog.entry(schema_id)
    env = {k: getattr(event, k) for k in ("event_id", "namespace", "epoch", "writer",
                                          "created_at")}
    env["schema_version"] = entry.version
    rec = {"envelope": env}
    for f in entry.parsed["fields"][1:]:
        value = getattr(event, f["name"])
        rec[f["name"]] = to_avro(value) if hasattr(value, "__dataclass_fields__") else value
    buf = io.BytesIO()
    buf.write(struct.pack(">bI", 0, schema_id))  # Confluent framing: magic byte, schema id
    fastavro.schemaless_writer(buf, entry.parsed, rec)
    return buf.getvalue()
