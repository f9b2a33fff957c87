"""Identifiers, record keys and the namespace -> partition map.

Compaction keeps the newest record *per key*, so the key layout is part of the
correctness argument (README, "Compaction"):

* ``<ns>/job/<id>``              the job's definition and its cleanup (reassertions of the
  whole job, cleanup; before this layout also its submit and its end)
* ``<ns>/job/<id>/birth/<event_id>``  the job's submit under a key of its own, so that no
  later record can supersede it: whether a job exists is a fact the cleaner never removes
  (fold rule 5 decides ``job_exists`` on it, and ``unknown_job`` of every other record)
* ``<ns>/job/<id>/end/<event_id>``  one end of the job (cancel, terminate) under a key of
  its own, so that no later record can supersede it: whether a job ended is a fact the
  cleaner never removes (fold rule 5 decides ``job_live``, ``terminal_job`` on it)
* ``<ns>/job/<id>/lock``         which term holds the job (adopt, release, recovery failed)
* ``<ns>/job/<id>/checkpoint/<event_id>``  one checkpoint record of the job (each carries
  the job's whole checkpoint state after it) under a key of its own, so that no later record
  (a stale one the fold refuses) can supersede the one whose state a verdict rests on; the
  leader removes the ones no verdict needs any more with tombstones, the refused ones before
  the accepted ones they rest on (fold rule 6, :func:`registry.fold.plan_collection`)
* ``<ns>/job/<id>/checkpoints``  the job's checkpoint lifecycle before checkpoint records had
  keys of their own (layout 1: only the newest record was kept)
* ``<ns>/term/<epoch>/<event_id>``  every grant and revoke, under a key of its own,
  so the cleaner never removes one
* ``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>``  the lease renewals of a term:
  ``attempts`` the refused grant attempts against the term its renewer had folded plus
  its renewals not seen confirmed, ``renewal`` its ordinal (fold rule 3). Consecutive
  renewals alternate two keys, and a refused grant (or a renewal whose write failed)
  moves the renewals planned after it to two new ones, so no renewal that lands after a
  grant attempt removes the highest renewal before it, which the attempt's verdict rests
  on (README "Compaction").
* ``<ns>/term/<epoch>/lease``    the renewals written before ordinals (only the newest
  matters: no verdict rests on them)
* ``<ns>/call/<event_id>``      the commit of one multi-record call, under a key of its
  own, so the cleaner never removes one (fold rule 8)
* ``<ns>/leader/<epoch>/<writer>/<component>``  a term's leader information of one
  component (fold rule 9; only the newest matters). Per term and writer, so that no
  refused publication (a deposed leader's, a zombie's) can land on the key of an accepted
  one of the current term and be all the cleaner leaves of it; a grant clears the
  information, so older terms' keys hold nothing the fold still needs.

A :class:`~registry.events.JobReasserted` may land on any of a job's keys (on a birth key
of another event than itself only to remove a refused call's submit, status ``ABSENT``). Ids may
not contain ``/`` so a key parses one way only.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from .errors import ConfigError
from .events import (
    CallCommitted,
    CheckpointEvent,
    Event,
    JobAdopted,
    JobCancelled,
    JobEvent,
    JobLockReleased,
    JobReasserted,
    JobRecoveryFailed,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeaseRenewed,
)

__all__ = [
    "ParsedKey",
    "allowed_keys",
    "call_key",
    "check_id",
    "birth_key",
    "checkpoint_key",
    "checkpoints_key",
    "end_key",
    "is_birth_key",
    "is_checkpoint_key",
    "is_end_key",
    "job_key",
    "leader_key",
    "lease_key",
    "lock_key",
    "parse_key",
    "partition_for",
    "record_key",
    "term_key",
]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")


def check_id(kind: str, value: object) -> str:
    """Return ``value`` if it is a well-formed id, else raise :class:`ConfigError`.

    Ids are 1 to 200 characters: letters, digits and ``. _ : @ + = -``,
    starting with a letter or digit (no ``/``, no spaces).
    """
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise ConfigError(
            f"malformed {kind} {value!r}: use 1-200 characters from "
            "letters, digits and . _ : @ + = -, starting with a letter or digit"
        )
    return value


def job_key(namespace: str, job_id: str) -> str:
    """The key of a job's definition records."""
    return f"{namespace}/job/{job_id}"


def lock_key(namespace: str, job_id: str) -> str:
    """The key of a job's lock records (adopt, release)."""
    return f"{namespace}/job/{job_id}/lock"


def checkpoints_key(namespace: str, job_id: str) -> str:
    """The key of a job's checkpoint records."""
    return f"{namespace}/job/{job_id}/checkpoints"


def checkpoint_key(namespace: str, job_id: str, event_id: str) -> str:
    """The key of one checkpoint record of a job (or of a reassertion restating the job's
    checkpoint state): never shared, so only a tombstone removes it."""
    return f"{namespace}/job/{job_id}/checkpoint/{event_id}"


def end_key(namespace: str, job_id: str, event_id: str) -> str:
    """The key of one end of a job (a cancel or terminate, or a reassertion restating an
    end): never shared, so never compacted away."""
    return f"{namespace}/job/{job_id}/end/{event_id}"


def birth_key(namespace: str, job_id: str, event_id: str) -> str:
    """The key of a job's submit (or of a reassertion restating its birth): never shared,
    so never compacted away."""
    return f"{namespace}/job/{job_id}/birth/{event_id}"


def is_end_key(key: str | bytes) -> bool:
    """Whether a job key of a namespace (one :func:`job_key`, :func:`lock_key`,
    :func:`checkpoints_key`, :func:`birth_key` or :func:`end_key` gives) is an end key:
    four slashes (ids hold none) and ``end`` the fourth part. Cheap: the fold asks it of
    every job record."""
    if isinstance(key, str):
        return key.count("/") == 4 and key.split("/")[3] == "end"
    return key.count(b"/") == 4 and key.split(b"/")[3] == b"end"


def is_birth_key(key: str | bytes) -> bool:
    """Whether a job key of a namespace is a birth key (as :func:`is_end_key`)."""
    if isinstance(key, str):
        return key.count("/") == 4 and key.split("/")[3] == "birth"
    return key.count(b"/") == 4 and key.split(b"/")[3] == b"birth"


def is_checkpoint_key(key: str | bytes) -> bool:
    """Whether a job key of a namespace is a checkpoint record's key (as :func:`is_end_key`)."""
    if isinstance(key, str):
        return key.count("/") == 4 and key.split("/")[3] == "checkpoint"
    return key.count(b"/") == 4 and key.split(b"/")[3] == b"checkpoint"


def term_key(namespace: str, epoch: int, event_id: str) -> str:
    """The key of one grant or revoke: never shared, so never compacted away."""
    return f"{namespace}/term/{epoch}/{event_id}"


def call_key(namespace: str, call_id: str) -> str:
    """The key of a call's commit: never shared, so never compacted away."""
    return f"{namespace}/call/{call_id}"


def lease_key(namespace: str, epoch: int, attempts: int | None = None,
              renewal: int | None = None) -> str:
    """The key of a lease renewal of term ``epoch``: with ``attempts`` (refused grant
    attempts its renewer had folded) and ``renewal`` (its ordinal),
    ``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>``; without them (a renewal written
    before ordinals), ``<ns>/term/<epoch>/lease``."""
    if attempts is None or renewal is None:
        return f"{namespace}/term/{epoch}/lease"
    return f"{namespace}/term/{epoch}/lease/{attempts}/{renewal % 2}"


def leader_key(namespace: str, epoch: int, writer: str, component: str) -> str:
    """The key of the leader information of ``component`` published in term ``epoch`` by
    ``writer`` (fold rule 9)."""
    return f"{namespace}/leader/{epoch}/{writer}/{component}"


def record_key(event: Event) -> str:
    """The key a well-behaved writer uses for ``event``."""
    if isinstance(event, (JobAdopted, JobLockReleased, JobRecoveryFailed)):
        return lock_key(event.namespace, event.job_id)
    if isinstance(event, CheckpointEvent):
        return checkpoint_key(event.namespace, event.job_id, event.event_id)
    if isinstance(event, (JobCancelled, JobTerminated)):
        return end_key(event.namespace, event.job_id, event.event_id)
    if isinstance(event, JobSubmitted):
        return birth_key(event.namespace, event.job_id, event.event_id)
    if isinstance(event, JobEvent):
        return job_key(event.namespace, event.job_id)
    if isinstance(event, LeaseRenewed):
        return lease_key(event.namespace, event.epoch, event.attempts, event.renewal)
    if isinstance(event, CallCommitted):
        return call_key(event.namespace, event.event_id)
    if isinstance(event, LeaderInformationPublished):
        return leader_key(event.namespace, event.epoch, event.writer, event.component)
    return term_key(event.namespace, event.epoch, event.event_id)


def allowed_keys(event: Event) -> tuple[str, ...]:
    """Every key under which the fold accepts ``event`` (a reassertion may use any job key;
    a renewal the one its ``attempts`` and ``renewal`` choose, or, written before them, the
    term's one lease key)."""
    if isinstance(event, JobReasserted):
        # (and, with status ABSENT, any birth key of its job: fold rule 8's removal of a
        # refused call's submit, which lies under that submit's key)
        ns, job = event.namespace, event.job_id
        return (job_key(ns, job), lock_key(ns, job), checkpoints_key(ns, job),
                end_key(ns, job, event.event_id), birth_key(ns, job, event.event_id),
                checkpoint_key(ns, job, event.event_id))
    if isinstance(event, (JobCancelled, JobTerminated, JobSubmitted)):
        # and the job's key, where a jobreg before ends (submits) had keys of their own
        # wrote them (the fold refuses them there once a grant of layout 1 was accepted)
        return (record_key(event), job_key(event.namespace, event.job_id))
    if isinstance(event, CheckpointEvent):
        # and the job's one checkpoints key, where a jobreg before checkpoint records had
        # keys of their own wrote them (refused there once a grant of layout 2 was accepted)
        return (record_key(event), checkpoints_key(event.namespace, event.job_id))
    return (record_key(event),)


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """A record key split into its parts; ``kind`` is ``job``, ``lock``, ``checkpoints``,
    ``checkpoint``, ``end``, ``birth``, ``term``, ``call``, ``leader`` or ``other``."""

    namespace: str
    kind: str
    job_id: str | None = None


def parse_key(key: str) -> ParsedKey | None:
    """Split a record key; ``None`` if it is not of the form ``<ns>/...``."""
    ns, sep, rest = key.partition("/")
    if not sep or not ns:
        return None
    parts = rest.split("/")
    if len(parts) == 2 and parts[0] == "job":
        return ParsedKey(ns, "job", parts[1])
    if len(parts) == 3 and parts[0] == "job" and parts[2] in ("lock", "checkpoints"):
        return ParsedKey(ns, parts[2], parts[1])
    if len(parts) == 4 and parts[0] == "job" and parts[2] in ("end", "birth", "checkpoint"):
        return ParsedKey(ns, parts[2], parts[1])
    if len(parts) == 3 and parts[0] == "term":
        return ParsedKey(ns, "term")
    if len(parts) == 5 and parts[0] == "term" and parts[2] == "lease":
        return ParsedKey(ns, "term")
    if len(parts) == 2 and parts[0] == "call":
        return ParsedKey(ns, "call")
    if len(parts) == 4 and parts[0] == "leader":
        return ParsedKey(ns, "leader")
    return ParsedKey(ns, "other")


def partition_for(namespace: str, partitions: int) -> int:
    """The partition that holds every record of ``namespace``.

    CRC-32 of the UTF-8 name, modulo the partition count: stable across
    processes, Python versions and machines (unlike ``hash()``). The topic's
    partition count must therefore never change once namespaces live on it.
    """
    if partitions < 1:
        raise ConfigError(f"a topic needs at least one partition, not {partitions}")
    return zlib.crc32(namespace.encode("utf-8")) % partitions
