"""The checker's own model of the fold's documented rules, written from the README and the
rule list in :mod:`registry.rules`' docstring, not from its code.

It folds one namespace's raw records (offset, key, value, broker time) and says, per
record, what the documented rules decide: ``ACCEPTED``, ``IGNORED`` (kept without
effect), ``REJECTED`` (with a reason), ``DUPLICATE``, ``QUARANTINED``, ``SKIPPED``
(another namespace) or ``PENDING`` (a record of a multi-record call whose commit never
came). Values are decoded with :mod:`registry.wire` only.

The rules modelled (README "What it guarantees", "The log", "Failover"; fold rules 0-7):

* keys ``<ns>/job/<id>/birth/<event id>`` (submit), ``<ns>/job/<id>/end/<event id>``
  (cancel, terminate), ``<ns>/job/<id>`` (cleanup; before a grant of layout 1 also submit,
  cancel and terminate: refused ``wrong_key`` there since), ``<ns>/job/<id>/lock`` (adopt,
  release, recovery failed), ``<ns>/job/<id>/checkpoints``, ``<ns>/term/<epoch>/<event id>``
  (grants, revokes), ``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>`` (renewals;
  ``<ns>/term/<epoch>/lease`` for one written without them); a reassertion may use any of
  its job's keys. Another namespace's key is skipped; a tombstone or undecodable value
  is quarantined.
* a verbatim copy (the same event id, key and bytes) of a record folded within the last
  two windows and not refused has no second effect (a copy of a refused one is decided
  by the rules); any other record reusing an id is decided by the
  rules and is junk to its key if the first copy lay there, and a copy under a key that
  holds one record (a birth, an end, a checkpoint record, a commit) is junk to that key.
  The event must name the namespace and sit under its key.
* a grant is a compare-and-set on the current epoch and claims the next one; one that
  says which renewal of the current term it saw (``saw_renewal``) is refused
  (``renewed_since``) if a renewal of that term with a higher ordinal was accepted
  before it.
* any other event needs the current, unrevoked term and its leader.
* a known id cannot be submitted again; cancel and terminate are terminal for ever
  (even for an id not seen); adopt, release, recovery-failed and checkpoints need a
  known, live job; release of a job that failed recovery is refused; a reassertion sets
  the whole state but cannot make a terminal job live, and on the job's lock or
  checkpoints key it needs a known job (only its own birth or end key, and before a grant
  of layout 1 the job key, brings a job into existence); with status ``ABSENT`` under a
  birth key it removes the job only if that key holds the job's birth.
* job results (README "Job results"): a cancel or terminate (schema version 2 and later)
  leaves a dirty result that holds the graph and checkpoint state the job had (the
  record's own copy when the job is unknown); one of version 1 leaves a clean result
  without a graph. ``JobCleanedUp`` (on the job key) needs a terminal status and refuses
  a live job (``job_live``); it leaves the result clean, without a graph. A terminal
  reassertion carries ``dirty`` and, when dirty, the graph and checkpoints. A dirty
  result's graph is referenced like a live job's: blob collection must keep it.
* checkpoints: trigger ids increase; late, discarded, superseded or already counted
  failures are ignored; completion resets the count and keeps the newest N; each record
  carries the state after it and its sequence number, which must be the next one (a
  jump ahead means compaction: the carried state is taken, unless, once a grant of schema
  version 3 was accepted, it takes the job's ids back or triggers an id not above the
  newest: ``checkpoint_id_not_increasing``). A state as the rule before ids were kept
  computes it is accepted only until a grant of schema version 3 is accepted.
* reassertions restate what their own key holds: on the job key the whole job; on the
  lock or checkpoints key of a known job only the lock (status, owner, error) or the
  checkpoint state, refusing one that removes the job (``job_exists``) or ends a live one
  (``bad_state``), and changing nothing of a terminal job. A reassertion's checkpoint
  state is taken unless it is older than the job's both in sequence number and in ids (a
  newer id known, or a newer completed one).
* calls (rule 8): a record carrying a ``call_id`` is fenced when it arrives and otherwise
  waits (``PENDING``); at its ``CallCommitted`` (key ``<ns>/call/<event id>``, fenced like
  any write) the waiting records are applied in log order, all or none: the first one a
  rule refuses sinks the call (every other record and the commit are refused
  ``call_aborted``), except that ``unknown_job`` does not sink it; a commit that finds
  fewer than ``size`` records decides each on its own (all or none over them once a grant
  of layout 1 was accepted); an accepted grant ends the calls
  left open (``call_not_committed``). A reassertion with status ``ABSENT`` says the job
  does not exist.
* Flink's leader information (rule 9; key ``<ns>/leader/<epoch>/<writer>/<component>``):
  fenced like any write, then refused (``bad_leader_information``) unless the component
  is an id, the session printable and at most 200 characters (not empty with an
  address), the address absent (a deletion) or printable and 1 to 2,048 characters; the
  current term's information, per component, is emptied by a grant or a revoke.
* an event type without a rule is quarantined (``no_rule``).
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from registry.errors import CodecError
from registry.fold import DUPLICATE_WINDOW_MS
from registry.wire import decode

__all__ = ["FENCING_REASONS", "Cp", "Graph", "MJob", "NamespaceModel", "Verdict", "graph_of"]

FENCING_REASONS = frozenset({"no_leader", "stale_epoch", "future_epoch", "not_leader",
                             "term_revoked"})
TERMINAL = frozenset({"CANCELLED", "FINISHED", "FAILED"})
STATUSES = frozenset({"ACTIVE", "RECOVERY_FAILED", "ABSENT", *TERMINAL})
ACCEPTING = frozenset({"ACCEPTED", "IGNORED"})

Graph = tuple[Any, ...]  # ("inline", size) | ("blob", uri, sha256, size)


def graph_of(g: Any) -> Graph | None:
    """The model's view of a graph: what identifies it, not its bytes."""
    if g is None:
        return None
    if hasattr(g, "uri"):
        return ("blob", g.uri, g.sha256, g.size)
    return ("inline", len(g.data))


@dataclass(frozen=True)
class Cp:
    """A job's checkpoint bookkeeping, as the docs describe ``CheckpointState``."""

    seq: int = 0
    last: int = -1
    retained: tuple[tuple[int, str], ...] = ()
    pending: frozenset[int] = frozenset()
    discarded: frozenset[int] = frozenset()
    counted: frozenset[int] = frozenset()
    unknown: int = 0  # counted failures without a checkpoint id (the trigger phase)
    req: tuple[tuple[str, int, int], ...] = ()  # the newest rescale's (vertex, lower, upper)

    @property
    def newest(self) -> int:
        """The highest checkpoint id known (-1: none)."""
        return max((self.last, *self.pending, *self.discarded, *self.counted))

    @classmethod
    def of(cls, s: Any) -> Cp:
        """From a decoded ``CheckpointState``."""
        return cls(s.seq, s.last_completed,
                   tuple((c.checkpoint_id, c.location) for c in s.retained),
                   frozenset(s.pending), frozenset(s.discarded), frozenset(s.counted),
                   s.unknown_failures,
                   tuple((r.vertex_id, r.lower_bound, r.upper_bound)
                         for r in getattr(s, "requirements", ())))


@dataclass
class MJob:
    """One job in the model."""

    status: str
    owner: int | None
    graph: Graph | None
    error: str | None = None
    budget: int = 0
    retained: int = 1
    cp: Cp = field(default_factory=Cp)
    dirty: bool = False
    born: str | None = None  # the event id under whose birth key the job came to exist

    @property
    def live(self) -> bool:
        return self.status not in TERMINAL

    @property
    def referenced(self) -> bool:
        """Its graph must stay: a live job, or a result not yet cleaned up."""
        return self.live or self.dirty


@dataclass
class Verdict:
    """What the documented rules decide about one record."""

    offset: int
    outcome: str
    reason: str | None = None
    key: str | None = None
    etype: str | None = None
    event_id: str | None = None
    epoch: int | None = None
    writer: str | None = None
    job: str | None = None
    timestamp: int | None = None
    event: Any = None
    decided_at: int | None = None  # for call members: the commit's offset

    @property
    def accepted(self) -> bool:
        return self.outcome in ACCEPTING


class _Refused(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Ignored(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _expected_keys(ns: str, ev: Any) -> tuple[str, ...] | None:
    t = ev.TYPE
    job = getattr(ev, "job_id", None)
    if t in ("JobCancelled", "JobTerminated"):  # its own key, or the job's (older jobregs)
        return (f"{ns}/job/{job}/end/{ev.event_id}", f"{ns}/job/{job}")
    if t == "JobSubmitted":  # its own (birth) key, or the job's (older jobregs)
        return (f"{ns}/job/{job}/birth/{ev.event_id}", f"{ns}/job/{job}")
    if t == "JobCleanedUp":
        return (f"{ns}/job/{job}",)
    if t in ("JobAdopted", "JobLockReleased", "JobRecoveryFailed"):
        return (f"{ns}/job/{job}/lock",)
    if t.startswith("Checkpoint") or t in ("JobRestarted", "JobRescaled"):
        # its own key, or the job's one checkpoints key (older jobregs)
        return (f"{ns}/job/{job}/checkpoint/{ev.event_id}", f"{ns}/job/{job}/checkpoints")
    if t == "JobReasserted":
        return (f"{ns}/job/{job}", f"{ns}/job/{job}/lock", f"{ns}/job/{job}/checkpoints",
                f"{ns}/job/{job}/end/{ev.event_id}", f"{ns}/job/{job}/birth/{ev.event_id}",
                f"{ns}/job/{job}/checkpoint/{ev.event_id}")
    if t == "LeaseRenewed":
        if ev.renewal is None or ev.attempts is None:
            return (f"{ns}/term/{ev.epoch}/lease",)
        return (f"{ns}/term/{ev.epoch}/lease/{ev.attempts}/{ev.renewal % 2}",)
    if t in ("LeadershipGranted", "LeadershipRevoked"):
        return (f"{ns}/term/{ev.epoch}/{ev.event_id}",)
    if t == "CallCommitted":
        return (f"{ns}/call/{ev.event_id}",)
    if t == "LeaderInformationPublished":
        return (f"{ns}/leader/{ev.epoch}/{ev.writer}/{ev.component}",)
    return None


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")  # README: ids


def _leader_information_ok(ev: Any) -> bool:
    """Rule 9's well-formed leader information, as documented."""
    session, address = ev.session, ev.address
    if not _ID.fullmatch(ev.component) or len(session) > 200 or not session.isprintable():
        return False
    return address is None or (session != "" and 0 < len(address) <= 2048
                               and address.isprintable())


# The reasons that counted for the jobregs that did not record the writer's decision
# (Flink 1.x's CheckpointFailureManager.checkFailureCounter, and UNSPECIFIED).
_COUNTED_BEFORE = {"UNSPECIFIED", "IO_EXCEPTION", "CHECKPOINT_ASYNC_EXCEPTION",
                   "CHECKPOINT_DECLINED", "CHECKPOINT_EXPIRED"}


def _requirements_ok(req: tuple[tuple[str, int, int], ...]) -> bool:
    """The README's shape of a job's resource requirements: at most 512 vertices, sorted by
    id and each once, ids of 32 lower-case hex digits, bounds -1 or 1 to 32768, the lower not
    above the upper when both are set."""
    ids = [v for v, _, _ in req]
    return (len(req) <= 512 and ids == sorted(set(ids))
            and all(len(v) == 32 and set(v) <= set("0123456789abcdef") for v in ids)
            and all(b == -1 or 1 <= b <= 32768 for _, lo, hi in req for b in (lo, hi))
            and all(lo == -1 or hi == -1 or lo <= hi for _, lo, hi in req))


def _cp_step(cur: Cp, kind: str, cp: int, location: str, retained: int,
             reason: str = "UNSPECIFIED", version: int = 2,
             recorded: bool | None = None, keep: bool = True,
             req: tuple[tuple[str, int, int], ...] = ()) -> tuple[Cp, str | None]:
    """Rule 6 as documented: the state after one event and why it was ignored. A failure's
    reason counts as its writer recorded (``recorded``), or by the old table if it did not.
    ``keep``: every id triggered stays known until a newer one completes (ids never go
    back); ``False``: the rule before that, which older records' states follow."""
    seq = cur.seq + 1
    gone = cur.counted if keep else frozenset()  # counted ids that stop counting, as ended
    counts = recorded if recorded is not None else reason in _COUNTED_BEFORE
    if kind == "JobRescaled":  # sets the requirements, nothing else; names no checkpoint
        if cp != -1 or not _requirements_ok(req):
            raise _Refused("bad_requirements")
        return replace(cur, seq=seq, req=req), None
    if kind == "JobRestarted":
        if cp != cur.last:
            raise _Refused("restart_checkpoint_mismatch")
        return Cp(seq, cur.last, cur.retained, frozenset(), cur.discarded | cur.pending | gone,
                  frozenset(), 0, cur.req), None
    if kind == "CheckpointFailed" and cp == -1:  # the trigger phase: no id
        if counts:
            return replace(cur, seq=seq, unknown=cur.unknown + 1), None
        return replace(cur, seq=seq), "reason does not count"
    if kind == "CheckpointTriggered":
        newest = max([cur.last, *cur.pending, *cur.discarded, *cur.counted])
        if cp <= newest:
            raise _Refused("checkpoint_id_not_increasing")
        return replace(cur, seq=seq, pending=cur.pending | {cp}), None
    if cp <= cur.last:
        return replace(cur, seq=seq), "not newer than the last completed"
    if cp in cur.discarded and kind != "CheckpointDiscarded":
        return replace(cur, seq=seq), "discarded"
    if kind == "CheckpointCompleted":
        kept = (*cur.retained, (cp, location))[-max(retained, 1):]
        return Cp(seq, cp, kept, frozenset(p for p in cur.pending if p > cp),
                  frozenset(d for d in cur.discarded | gone if d > cp), frozenset(), 0,
                  cur.req), None
    if kind == "CheckpointFailed":
        if cp in cur.counted:
            return replace(cur, seq=seq), "already counted"
        if cp not in cur.pending and version >= 2:  # version 1 counted it anyway
            return replace(cur, seq=seq), "not pending"
        if counts:
            return replace(cur, seq=seq, counted=cur.counted | {cp},
                           pending=cur.pending - {cp}), None
        return replace(cur, seq=seq, pending=cur.pending - {cp},
                       discarded=cur.discarded | ({cp} if keep else frozenset())), \
            "reason does not count"
    if cp in cur.discarded:
        return replace(cur, seq=seq), "already discarded"
    return replace(cur, seq=seq, discarded=cur.discarded | {cp}, pending=cur.pending - {cp}), None


class NamespaceModel:
    """Folds one namespace's records with the documented rules; keeps what the checker asks.

    ``grants[epoch] = (writer, offset, time)``, ``revokes[epoch] = offset``; per job a
    list of ``(offset, time, live, blob uri)`` after every change (``changes``), and the
    verdicts by offset and by event id.
    """

    def __init__(self, namespace: str) -> None:
        self.ns = namespace
        self._on_end_key = False  # the record being decided is under an end key
        self._reasserting_part: str | None = None  # lock or checkpoints: its key, if so
        self.ends_keyed = False  # a grant of a jobreg whose ends have keys of their own
        self.births_keyed = False  # a grant of layout 1: submits under birth keys
        # a grant of layout 2: checkpoint records under keys of their own
        self.checkpoints_keyed = False
        # rule 6: job -> the key of the checkpoint record whose state the job's is
        self.cp_holder: dict[str, str] = {}
        self._key: str | None = None  # the key of the record being decided
        self._birth_key = False  # it is a birth key
        self.epoch = 0
        self.leader: str | None = None
        self.revoked = False
        self.jobs: dict[str, MJob] = {}
        # the event id of the end key that holds each ended job's end (rule 5)
        self.ends: dict[str, str] = {}
        # rule 1: (event id, key) -> (the newest window when its first copy there was
        # folded, the CRC-32 of that copy's bytes)
        self.seen: dict[tuple[str, str | None], tuple[int, int]] = {}
        self._junk_to_key = False  # the record being decided is junk to its key (rule 1)
        self._seen_at: dict[tuple[str, str | None], int] = {}  # the offset of that first copy
        self.newest_window: int | None = None
        self.grants: dict[int, tuple[str, int, int | None]] = {}
        self.revokes: dict[int, int] = {}
        self.renewed = 0  # the highest renewal ordinal accepted in the current term
        self.leaders: dict[str, tuple[str, str]] = {}  # rule 9: component -> (session, address)
        self.verdicts: list[Verdict] = []
        self.by_offset: dict[int, Verdict] = {}
        self.by_event: dict[str, list[Verdict]] = {}
        self.changes: dict[str, list[tuple[int, int | None, bool, str | None]]] = {}
        self._calls: dict[str, list[Verdict]] = {}
        self.last_time: int | None = None

    # -- the entry point ------------------------------------------------------------------

    def apply(self, offset: int, key_bytes: bytes | None, value: bytes | None,
              timestamp: int | None) -> Verdict:
        """Decide one record of this namespace's partition."""
        if timestamp is not None:
            self.last_time = timestamp
        key: str | None = None
        if key_bytes is not None:
            try:
                key = key_bytes.decode("utf-8")
            except UnicodeDecodeError:
                key = None
        key_ns = None
        if key is not None:
            head, sep, _ = key.partition("/")
            if sep and head:
                key_ns = head
        if key_ns is not None and key_ns != self.ns:
            return self._note(Verdict(offset, "SKIPPED", key=key, timestamp=timestamp))
        if value is None:
            parts = key.split("/") if key is not None else []
            if len(parts) == 5 and parts[1] == "job" and parts[3] == "checkpoint":
                # rule 6: the leader's collection of a record no state stands on, or junk
                # over the one the job's checkpoint state stands on
                job = self.jobs.get(parts[2])
                if self.cp_holder.get(parts[2]) == key and job is not None \
                        and (job.live or job.dirty) and job.cp != Cp():
                    del self.cp_holder[parts[2]]
                    return self._note(Verdict(offset, "QUARANTINED", "tombstone", key,
                                              timestamp=timestamp))
                return self._note(Verdict(offset, "COLLECTED", "collected", key,
                                          timestamp=timestamp))
            return self._note(Verdict(offset, "QUARANTINED", "tombstone", key,
                                      timestamp=timestamp))

        ev: Any  # the model reads events by their TYPE and fields, as the README states them
        self._set_key(key)
        try:
            ev = decode(value)
        except CodecError:
            return self._note(Verdict(offset, "QUARANTINED", "undecodable", key,
                                      timestamp=timestamp))
        if key_ns is None and ev.namespace != self.ns:
            return self._note(Verdict(offset, "SKIPPED", key=key, timestamp=timestamp))
        v = Verdict(offset, "ACCEPTED", None, key, ev.TYPE, ev.event_id, ev.epoch, ev.writer,
                    getattr(ev, "job_id", None), timestamp, ev)
        # Fold rule 1: an id is remembered, per key, while the newest window of broker time
        # (DUPLICATE_WINDOW_MS) that any record reached is the one it was folded in, or the
        # next. Only a verbatim copy (the same id, key and bytes) is a duplicate; any other
        # record reusing an id is decided by the rules, and one under the first copy's key
        # is junk to that key. A duplicate under a key that holds one record (a birth, an
        # end, a checkpoint record, a commit) is junk to that key too: the cleaner keeps
        # the later copy.
        if timestamp is not None:
            window = timestamp // DUPLICATE_WINDOW_MS
            if self.newest_window is None or window > self.newest_window:
                self.newest_window = window
        newest = 0 if self.newest_window is None else self.newest_window
        crc = zlib.crc32(value)
        first = self.seen.get((ev.event_id, key))
        if first is not None and newest > first[0] + 1:
            first = None  # forgotten
        parts = key.split("/") if key is not None else []
        one_record = (len(parts) == 5 and parts[1] == "job"
                      and parts[3] in ("birth", "end", "checkpoint")) \
            or (len(parts) == 3 and parts[1] == "call")
        if first is not None and first[1] == crc:
            v.outcome, v.reason = "DUPLICATE", "duplicate"
            self._junk_to_key = one_record
            return self._note(v)
        self._junk_to_key = first is not None
        if first is None:
            self.seen[(ev.event_id, key)] = (newest, crc)
            self._seen_at[(ev.event_id, key)] = offset
        try:
            if ev.namespace != self.ns:
                raise _Refused("namespace_mismatch")
            allowed = _expected_keys(self.ns, ev)
            if allowed is None:
                v.outcome, v.reason = "QUARANTINED", "no_rule"
                return self._note(v)
            absent_on_birth = (ev.TYPE == "JobReasserted" and ev.status == "ABSENT"
                               and key is not None and key.count("/") == 4
                               and (key.startswith(f"{self.ns}/job/{ev.job_id}/birth/")
                                    or key.startswith(f"{self.ns}/job/{ev.job_id}/end/")))
            if key not in allowed and not absent_on_birth:
                raise _Refused("wrong_key")
            if self.births_keyed and key == f"{self.ns}/job/{getattr(ev, 'job_id', '')}" \
                    and ev.TYPE in ("JobSubmitted", "JobCancelled", "JobTerminated"):
                self._fence(ev)
                raise _Refused("wrong_key")  # the job key holds no submit or end any more
            if self.checkpoints_keyed \
                    and key == f"{self.ns}/job/{getattr(ev, 'job_id', '')}/checkpoints" \
                    and (ev.TYPE.startswith("Checkpoint") or ev.TYPE in (
                        "JobRestarted", "JobRescaled", "JobReasserted")):
                self._fence(ev)
                raise _Refused("wrong_key")  # checkpoint records have keys of their own
            if getattr(ev, "call_id", None) and ev.TYPE != "CallCommitted":
                self._fence(ev)
                v.outcome, v.reason = "PENDING", "waits for its call's commit"
                self._calls.setdefault(ev.call_id, []).append(v)
                return self._note(v)
            if ev.TYPE == "CallCommitted":
                self._fence(ev)
                self._commit(ev, v)
                return self._note(v)
            creates = key in (f"{self.ns}/job/{getattr(ev, 'job_id', '')}/end/{ev.event_id}",
                              f"{self.ns}/job/{getattr(ev, 'job_id', '')}/birth/{ev.event_id}"
                              ) or (not self.births_keyed
                                    and key == f"{self.ns}/job/{getattr(ev, 'job_id', '')}")
            if (ev.TYPE == "JobReasserted" and ev.status != "ABSENT" and not self._birth_key
                    and ev.job_id not in self.jobs and not creates):
                self._fence(ev)  # only a birth or an end key brings a job into existence
                raise _Refused("unknown_job")
            why = self._decide(ev, offset, timestamp)
            if why is not None:
                v.outcome, v.reason = "IGNORED", why
            if ev.TYPE == "LeadershipGranted":
                for members in self._calls.values():  # the old term's open calls end here
                    for m in members:
                        m.outcome, m.reason, m.decided_at = "REJECTED", "call_not_committed", \
                            offset
                        self._forget(m)
                self._calls.clear()
        except _Refused as r:
            v.outcome, v.reason = "REJECTED", r.reason
        return self._note(v)

    # -- reads ------------------------------------------------------------------------------

    def live_at(self, job: str, t_ms: float) -> tuple[bool, str | None]:
        """Whether ``job``'s graph was referenced (the job live, or its result dirty) after
        the last change stamped at or before ``t_ms``, and the blob uri it referenced then."""
        state: tuple[bool, str | None] = (False, None)
        for _o, ts, live, uri in self.changes.get(job, []):
            if ts is not None and ts > t_ms:
                break
            state = (live, uri)
        return state

    def changed_between(self, job: str, t0: float, t1: float) -> bool:
        """Whether the job's liveness changed by a record stamped in ``(t0, t1]``."""
        return any(ts is not None and t0 < ts <= t1
                   for _o, ts, _live, _uri in self.changes.get(job, []))

    def accepted(self, event_id: str) -> Verdict | None:
        """The accepted copy of an event id, if any."""
        return next((v for v in self.by_event.get(event_id, []) if v.accepted), None)

    # -- internals --------------------------------------------------------------------------

    def _set_key(self, key: str | None) -> None:
        self._key = key
        parts = key.split("/") if key is not None else []
        self._on_end_key = len(parts) == 5 and parts[3] == "end"
        self._birth_key = len(parts) == 5 and parts[3] == "birth"
        tail = parts[-1] if len(parts) == 4 else None
        self._reasserting_part = tail if tail in ("lock", "checkpoints") else (
            "checkpoints" if len(parts) == 5 and parts[3] == "checkpoint" else None)

    def _note(self, v: Verdict) -> Verdict:
        # A birth key holds one record: one there that is not accepted (nor a copy of the
        # birth) supersedes the birth it holds, which the job then no longer rests on.
        parts = v.key.split("/") if v.key is not None else []
        junk, self._junk_to_key = self._junk_to_key, False
        if v.outcome == "REJECTED":
            self._forget(v)
        if len(parts) == 5 and parts[3] == "checkpoint" and parts[0] == self.ns \
                and (junk or v.outcome not in ("DUPLICATE", "COLLECTED")):
            # Rule 6: the job's checkpoint state stands on the record whose carried state
            # it is; a record there that does not carry it (junk, a refusal) takes its place.
            job = self.jobs.get(parts[2])
            ev = v.event
            carried = getattr(ev, "checkpoints", None) if getattr(ev, "TYPE", "") == \
                "JobReasserted" else getattr(ev, "state", None)
            if not junk and v.outcome in ("ACCEPTED", "IGNORED") and job is not None \
                    and carried is not None and Cp.of(carried) == job.cp:
                self.cp_holder[parts[2]] = v.key or ""
            elif self.cp_holder.get(parts[2]) == v.key:
                del self.cp_holder[parts[2]]
        if len(parts) == 5 and parts[3] == "birth" and parts[0] == self.ns \
                and (junk or v.outcome not in ("ACCEPTED", "DUPLICATE")):
            job = self.jobs.get(parts[2])
            if job is not None and job.born == parts[4] and (junk or v.event_id != job.born):
                job.born = None
                if not job.live and job.dirty:
                    self.ends.pop(parts[2], None)  # the result's graph lay there: end due
        if len(parts) == 5 and parts[3] == "end" and parts[0] == self.ns \
                and (junk or v.outcome not in ("ACCEPTED", "DUPLICATE")) \
                and self.ends.get(parts[2]) == parts[4]:
            del self.ends[parts[2]]  # junk there supersedes the end it held
        self.verdicts.append(v)
        self.by_offset[v.offset] = v
        if v.event_id is not None:
            self.by_event.setdefault(v.event_id, []).append(v)
        return v

    def _forget(self, v: Verdict) -> None:
        """Rule 1: a refused record is not remembered (a verbatim copy of it is decided by
        the rules at its own position)."""
        at = (v.event_id or "", v.key)
        if self._seen_at.get(at) == v.offset:
            del self._seen_at[at]
            self.seen.pop(at, None)

    def _fence(self, ev: Any) -> None:
        if self.leader is None:
            raise _Refused("no_leader")
        if ev.epoch < self.epoch:
            raise _Refused("stale_epoch")
        if ev.epoch > self.epoch:
            raise _Refused("future_epoch")
        if ev.writer != self.leader:
            raise _Refused("not_leader")
        if self.revoked:
            raise _Refused("term_revoked")

    def _decide(self, ev: Any, offset: int, ts: int | None, *, dry: bool = False
                ) -> str | None:
        t = ev.TYPE
        if t == "LeadershipGranted":
            if ev.prev_epoch != self.epoch:
                raise _Refused("cas_failed")
            if ev.epoch != ev.prev_epoch + 1:
                raise _Refused("bad_epoch")
            if ev.saw_renewal is not None and self.renewed > ev.saw_renewal:
                raise _Refused("renewed_since")
            if not dry:
                self.epoch, self.leader, self.revoked = ev.epoch, ev.writer, False
                self.renewed = 0
                self.ends_keyed = self.ends_keyed or ev.schema_version >= 3
                self.births_keyed = self.births_keyed or getattr(ev, "layout", 0) >= 1
                self.checkpoints_keyed = self.checkpoints_keyed \
                    or getattr(ev, "layout", 0) >= 2
                self.grants[ev.epoch] = (ev.writer, offset, ts)
                self.leaders = {}
            return None
        self._fence(ev)
        if t == "LeadershipRevoked":
            if not dry:
                self.revoked = True
                self.revokes[self.epoch] = offset
                self.leaders = {}
            return None
        if t == "LeaseRenewed":
            if not dry:
                self.renewed = max(self.renewed, ev.renewal or 0)
            return None
        if t == "LeaderInformationPublished":
            if not _leader_information_ok(ev):
                raise _Refused("bad_leader_information")
            if not dry:
                if ev.address is None:
                    self.leaders.pop(ev.component, None)
                else:
                    self.leaders[ev.component] = (ev.session, ev.address)
            return None
        job_id = ev.job_id
        job = self.jobs.get(job_id)
        if t == "JobSubmitted":
            if job is not None:
                raise _Refused("job_exists" if job.live else "terminal_job")
            new = MJob("ACTIVE", ev.epoch, graph_of(ev.graph), None, ev.max_checkpoint_failures,
                       ev.retained_checkpoints,
                       born=ev.event_id if self._key == f"{self.ns}/job/{job_id}/birth/"
                       f"{ev.event_id}" else None)
        elif t in ("JobCancelled", "JobTerminated"):
            status = "CANCELLED" if t == "JobCancelled" else ev.state
            if status not in TERMINAL:
                raise _Refused("bad_state")
            if job is not None and not job.live:
                raise _Refused("terminal_job")
            if ev.schema_version < 2:  # before results: clean, no graph
                new = MJob(status, None, None)
            elif self._on_end_key:  # under its own key: its copy is not read
                new = (MJob(status, None, job.graph, cp=job.cp, dirty=True, born=job.born)
                       if job is not None else MJob(status, None, None, dirty=True))
            elif job is not None:
                new = MJob(status, None, job.graph, cp=job.cp, dirty=True)
            else:
                new = MJob(status, None, graph_of(ev.graph), cp=Cp.of(ev.checkpoints),
                           dirty=True)
        elif t == "JobCleanedUp":
            if ev.status not in TERMINAL:
                raise _Refused("bad_state")
            if job is not None and job.live:
                raise _Refused("job_live")
            # ends are never compacted away (since a grant of a jobreg that keys them)
            if job is None and (ev.schema_version >= 2 or self.ends_keyed):
                raise _Refused("unknown_job")
            new = MJob(ev.status if job is None else job.status, None, None)
        elif t == "JobReasserted":
            if ev.status not in STATUSES:
                raise _Refused("bad_state")
            part = self._reasserting_part
            if self._on_end_key and ev.status == "ABSENT" \
                    and self._key != f"{self.ns}/job/{job_id}/end/{ev.event_id}":
                # the leader's removal of a refused end there; never the end the key holds
                if self.ends.get(job_id) == (self._key or "").rsplit("/", 1)[-1]:
                    raise _Refused("terminal_job")
                return None
            own_birth = self._key == f"{self.ns}/job/{job_id}/birth/{ev.event_id}"
            if self._birth_key and (ev.status == "ABSENT" or not own_birth):
                # removes a refused call's submit; the job only if that was its birth, and
                # never a live one the removal names as existing (job_exists): then the birth
                # is due again
                if not dry and job is not None and self._key is not None \
                        and job.born == self._key.rsplit("/", 1)[-1]:
                    if ev.reason == "job_exists" and job.live:
                        self.jobs[job_id] = replace(job, born=None)
                    else:
                        del self.jobs[job_id]
                        self.changes.setdefault(job_id, []).append((offset, ts, False, None))
                return None
            if own_birth and ev.status in TERMINAL:
                raise _Refused("bad_state")
            if part is not None and job is not None:  # the lock or checkpoints key
                if ev.status == "ABSENT":
                    raise _Refused("job_exists")
                if not job.live:
                    if ev.status not in TERMINAL:
                        raise _Refused("terminal_job")
                    if part == "checkpoints" and job.dirty and not dry:
                        # a dirty result's checkpoints stand under the checkpoints key (under
                        # keys of their own: never older than the job's)
                        self.jobs[job_id] = replace(job, cp=_restated(job, ev.checkpoints)
                                                    if self.checkpoints_keyed
                                                    else Cp.of(ev.checkpoints))
                    return None
                if ev.status in TERMINAL:
                    raise _Refused("bad_state")
                new = (replace(job, status=ev.status, owner=ev.owner_epoch, error=ev.error)
                       if part == "lock" else replace(job, cp=_restated(job, ev.checkpoints)))
                if not dry:
                    self.jobs[job_id] = new
                    self._changed(job_id, offset, ts)
                return None
            if self._on_end_key and ev.status not in TERMINAL:
                raise _Refused("bad_state")
            if job is not None and not job.live and ev.status not in TERMINAL:
                raise _Refused("terminal_job")
            if ev.status == "ABSENT":
                if not dry and job is not None:
                    del self.jobs[job_id]
                    self.changes.setdefault(job_id, []).append((offset, ts, False, None))
                return None
            if own_birth and job is not None and job.live:
                # the birth alone: the lock and checkpoints stand (a later copy of a
                # restatement re-sent fresh must not undo what the term wrote since); the
                # key holds the birth now
                new = replace(job, graph=graph_of(ev.graph),
                              budget=ev.max_checkpoint_failures,
                              retained=ev.retained_checkpoints, born=ev.event_id)
            elif ev.status in TERMINAL:
                dirty = ev.dirty and (job is None or job.live or job.dirty)  # never clean->dirty
                # (a result's checkpoints never change: a restatement carries them, also
                # once checkpoint records have keys of their own)
                new = (MJob(ev.status, None, graph_of(ev.graph), cp=Cp.of(ev.checkpoints),
                            dirty=True) if dirty else MJob(ev.status, None, None))
            else:
                new = MJob(ev.status, ev.owner_epoch, graph_of(ev.graph), ev.error,
                           ev.max_checkpoint_failures, ev.retained_checkpoints,
                           job.cp if self.checkpoints_keyed and job is not None
                           else _restated(job, ev.checkpoints),
                           born=ev.event_id if own_birth else (
                               job.born if job is not None else None))
        else:
            if job is None:
                raise _Refused("unknown_job")
            if not job.live:
                raise _Refused("terminal_job")
            why = None
            if t == "JobAdopted":
                new = replace(job, status="ACTIVE", owner=ev.epoch, error=None)
            elif t == "JobRecoveryFailed":
                new = replace(job, status="RECOVERY_FAILED", owner=None, error=ev.error)
            elif t == "JobLockReleased":
                new = replace(job, status="ACTIVE", owner=None, error=None)
            elif t.startswith("Checkpoint") or t in ("JobRestarted", "JobRescaled"):
                carried = Cp.of(ev.state)
                if carried.seq > job.cp.seq + 1:  # compaction removed the earlier records
                    cur = job.cp
                    if self.ends_keyed and (
                            carried.newest < cur.newest or carried.last < cur.last
                            or (t == "CheckpointTriggered" and ev.checkpoint_id <= cur.newest)):
                        raise _Refused("checkpoint_id_not_increasing")
                    if not _requirements_ok(carried.req) or (
                            t == "JobRescaled" and ev.checkpoint_id != -1):
                        raise _Refused("bad_requirements")
                    new = replace(job, cp=carried)
                elif carried.seq <= job.cp.seq:
                    raise _Refused("stale_checkpoint_seq")
                else:
                    args = (job.cp, t, ev.checkpoint_id, getattr(ev, "location", ""),
                            # a completion's own count, else the job's (README, rule 6)
                            getattr(ev, "retained", 0) or job.retained,
                            getattr(ev, "failure_reason", "UNSPECIFIED"),
                            ev.schema_version, getattr(ev, "reason_counts", None))
                    cp, why = _cp_step(*args, req=carried.req)
                    if cp != carried and not self.ends_keyed:  # as an older jobreg did
                        try:
                            older, older_why = _cp_step(*args, keep=False, req=carried.req)
                        except _Refused:
                            older, older_why = cp, why
                        if older == carried:
                            cp, why = older, older_why
                    if cp != carried:
                        raise _Refused("checkpoint_state_mismatch")
                    new = replace(job, cp=cp)
            else:
                raise _Refused(f"no rule for {t}")
            if not dry:
                self.jobs[job_id] = new
            return why
        if not dry:
            self.jobs[job_id] = new
            if self._on_end_key and not new.live \
                    and self._key == f"{self.ns}/job/{job_id}/end/{ev.event_id}" \
                    and not (t == "JobReasserted" and ev.dirty and not new.dirty):
                # (a restatement of a dirty result made clean since holds not the result)
                self.ends[job_id] = ev.event_id
            self._changed(job_id, offset, ts)
        return None

    def _changed(self, job_id: str, offset: int, ts: int | None) -> None:
        # What blob collection must keep: the graph of a live job or of a dirty result.
        job = self.jobs[job_id]
        uri = job.graph[1] if job.graph is not None and job.graph[0] == "blob" else None
        self.changes.setdefault(job_id, []).append((offset, ts, job.referenced, uri))

    def _commit(self, ev: Any, v: Verdict) -> None:
        """A CallCommitted (fenced already): decide the call's waiting records."""
        waiting = self._calls.pop(ev.event_id, [])
        offset, ts = v.offset, v.timestamp
        for m in waiting:
            m.decided_at = offset
        if len(waiting) < ev.size and not self.births_keyed:  # the cleaner removed some:
            # each on its own (before a grant of layout 1; since, all or none over them)
            for m in waiting:
                self._decide_member(m, offset, ts)
            return
        saved = (dict(self.jobs), {j: len(c) for j, c in self.changes.items()})
        for i, m in enumerate(waiting):
            if not self._decide_member(m, offset, ts) and m.reason != "unknown_job":
                self.jobs = saved[0]
                for j in list(self.changes):
                    del self.changes[j][saved[1].get(j, 0):]
                for other in waiting[:i] + waiting[i + 1:]:
                    other.outcome, other.reason = "REJECTED", "call_aborted"
                for member in waiting:
                    if member.outcome == "REJECTED":
                        self._forget(member)
                v.outcome, v.reason = "REJECTED", "call_aborted"
                return

    def _decide_member(self, m: Verdict, offset: int, ts: int | None) -> bool:
        self._set_key(m.key)
        try:
            why = self._decide(m.event, offset, ts)
        except _Refused as r:
            m.outcome, m.reason = "REJECTED", r.reason
            self._forget(m)
            return False
        m.outcome, m.reason = ("IGNORED", why) if why is not None else ("ACCEPTED", None)
        return True


def b64(data: bytes | None) -> str | None:
    """Bytes as base64 text for the run files (``None`` stays ``None``)."""
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    """The inverse of :func:`b64`."""
    return None if text is None else base64.b64decode(text)


def _restated(job: MJob | None, state: Any) -> Cp:
    """A reassertion's checkpoint state: the carried one unless it is older than the job's
    in sequence number (the leader's restatement carries one at least as high as any record
    the rules did not take)."""
    carried = Cp.of(state)
    if job is not None and carried.seq < job.cp.seq:
        return job.cp
    if not _requirements_ok(carried.req):
        raise _Refused("bad_requirements")
    return carried
