"""The producer client API: :class:`Registry` (read, claim) and :class:`Term` (write as leader).

A :class:`Registry` folds one namespace's records from the topic with
:mod:`registry.fold`; it never decides anything itself. A :class:`Term` is
the right to write that a granted leadership gives. Every write:

1. prepends a :class:`~registry.events.JobReasserted` for every key that a
   refused record is the newest record of (so compaction cannot change the
   answer, README "Compaction");
2. sends its records in one write of the term's idempotent producer
   (``acks=all``, no transaction: the fold fences a stale term's records
   wherever they land, README "The write path"), shared
   with the calls made at the same time on the term (group commit,
   :class:`~registry.writes.GroupCommit`: each call keeps its own answer); a call
   of several records carries its call id on each and ends with a
   :class:`~registry.events.CallCommitted`, so the fold applies them all or
   none (fold rule 8);
3. reads the log until the fold has decided every record it sent; if the
   write failed or timed out, it reads to the end of the log instead
   and takes what the fold decided, never a guess: records the log does not
   hold are re-sent (same event ids, so a copy that landed after all has no
   second effect) while this term is still current, else the write is
   :class:`~registry.errors.Fenced`;
4. settles, best-effort, any key a refused record landed on meanwhile, then
   returns a :class:`Receipt` per accepted record, or raises
   :class:`~registry.errors.WriteRejected` / :class:`~registry.errors.Fenced`
   with the fold's reason and both epochs. Once the fold decided, the call
   answers with that decision: what an exception means is in
   :mod:`registry.errors`.

What happens when the broker is lost: calls raise
:class:`~registry.errors.BrokerError` after their timeout, the term is not
given up (only a newer grant or :meth:`Term.revoke` ends it), and the next
call resolves any write whose fate was unknown by reading the log.

Steps 1 and 4 are :class:`Term`'s; steps 2 and 3 are :class:`registry.writes.TermWrites`'.
Both, and the registry's reads, go through one :class:`registry.folded.FoldedLog`.

Leaders must reassert refused keys within ``min.compaction.lag.ms`` (7 days
by default); every write does it, and :meth:`Term.reassert` does it alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from . import stalls
from .blobs import BlobStore, CollectionReport, collect, open_blob_store
from .election import Election, lease_clock
from .errors import (
    BrokerError,
    ClaimRejected,
    ConfigError,
    Fenced,
    LeaseExpired,
    NotAuthorized,
    OutcomeUnknown,
    RegistryError,
    UnknownJob,
    WriteRejected,
)
from .events import (
    LAYOUT,
    UNKNOWN_CHECKPOINT,
    CheckpointCompleted,
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointState,
    CheckpointTriggered,
    Event,
    GraphRef,
    InlineGraph,
    JobAdopted,
    JobCancelled,
    JobCleanedUp,
    JobEvent,
    JobLockReleased,
    JobRecoveryFailed,
    JobRescaled,
    JobRestarted,
    JobStatus,
    JobSubmitted,
    JobTerminated,
    LeaderInformationPublished,
    LeadershipGranted,
    LeadershipRevoked,
    LeaseRenewed,
    VertexParallelism,
    as_call,
    new_event_id,
    now_ms,
)
from .fold import (
    CheckpointRuleViolation,
    bulk,
    checkpoint_step,
    checkpoints_retained,
    failure_reason_counts,
    fencing_detail,
    fencing_reason,
    leader_information_error,
    plan_collection,
    plan_reassertions,
    requirements_error,
    restated_states,
)
from .folded import FoldedLog
from .forensics import BrokerSource, DumpSource, Forensics, TermSummary
from .image import Decision, Image, JobView, LeaderInfo, LeaderView, Outcome
from .kafka_config import Kafka, check_client_config
from .keys import check_id, partition_for, record_key
from .log import (
    DEFAULT_TOPIC,
    LeaderWriter,
    LogReader,
    PlainWriter,
    TopicConfig,
    check_bootstrap,
    ensure_topic,
)
from .metrics import ClientMetrics, metrics_for
from .placement import check_birth, check_count, check_mapping, verify
from .recovery import (
    CleanupHook,
    CleanupResult,
    RecoveryHook,
    RecoveryResult,
    candidates,
    clean_one,
    recover_one,
)
from .snapshot import StaleSnapshot, read_snapshot, write_snapshot
from .wire import Codec, default_codec
from .writes import GroupCommit, PendingCall, Restate, TermWrites, error_for_call

__all__ = ["DEFAULT_INLINE_LIMIT", "Receipt", "Registry", "Term"]

_log = logging.getLogger("registry")

DEFAULT_INLINE_LIMIT = 256 * 1024
"""Graphs up to this many bytes travel inside the JobSubmitted event."""

COLLECT_BATCH = 64
"""A term collects (fold rule 6: tombstones of checkpoint records no state stands on,
:func:`registry.fold.plan_collection`) at the settling after a decided call once it wrote
this many checkpoint records since its last collection, and at every :meth:`Term.reassert`
(what is due then, its own and any other writer's)."""

_FENCING_REASONS = frozenset({"stale_epoch", "term_revoked", "not_leader", "future_epoch",
                              "no_leader"})


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof that the fold accepted a record: its ``offset``, the writer's ``epoch``
    and the record's ``event_id``. ``ignored`` says why the fold kept the record
    without effect (a late checkpoint failure, for instance), else ``None``."""

    offset: int
    epoch: int
    event_id: str
    ignored: str | None = None


def _rejection(d: Decision) -> WriteRejected:
    cls = (Fenced if d.reason in _FENCING_REASONS
           else ClaimRejected if d.reason in ("cas_failed", "renewed_since")
           else WriteRejected)
    return cls(d.reason or "rejected", d.detail, expected_epoch=d.expected_epoch,
               actual_epoch=d.actual_epoch, leader=d.leader, offset=d.offset,
               event_id=d.event_id)


def _refusal(decisions: list[Decision]) -> Decision | None:
    # The record that sank a call (its own reason), not one refused because of it.
    refused = [d for d in decisions if not d.accepted]
    return next((d for d in refused if d.reason != "call_aborted"),
                refused[0] if refused else None)


class Registry:
    """A namespace's view of the registry log, kept current by folding it.

    Create one with :meth:`connect`. Reads (:meth:`jobs`, :meth:`leader`,
    :meth:`rejected`, ...) first catch up to the end of the log. Not for use
    by several threads at once without the caller's own care; it guards its
    own state with a lock, so sharing is safe but serialised.
    """

    def __init__(self, bootstrap: str, namespace: str, *, topic: str = DEFAULT_TOPIC,
                 partitions: int, codec: Codec | None = None, timeout: float = 10.0,
                 fetch_wait_ms: int = 5, inline_limit: int = DEFAULT_INLINE_LIMIT,
                 blob_store: BlobStore | str | os.PathLike[str] | None = None,
                 client_config: Mapping[str, object] | None = None,
                 pinned: bool = False, metrics: CollectorRegistry | None = None) -> None:
        self.bootstrap = check_bootstrap(bootstrap)
        self.kafka = Kafka(self.bootstrap, check_client_config(client_config))
        """Where every Kafka client of this registry connects, with the extra properties."""
        self.namespace = check_id("namespace", namespace)
        self.topic = topic
        self.partitions = partitions
        """The partition count the namespace is mapped with (README "The log")."""
        self.partition = partition_for(namespace, partitions)
        self._pinned = pinned  # mapped with a count given by the caller, not the topic's
        self.timeout = timeout
        self.inline_limit = inline_limit
        self._blob_store = blob_store
        self._scoped_store: BlobStore | None = None
        self._codec = codec or default_codec()
        self.metrics: ClientMetrics = metrics_for(metrics).client(topic, self.namespace)
        """This namespace's series of the metrics (README "Metrics")."""
        self._log = FoldedLog(LogReader(self.kafka, topic, self.partition,
                                        fetch_wait_ms=fetch_wait_ms), namespace, self._codec,
                              self.metrics)
        self._log.on_folded = self._note_leading
        self._plain: PlainWriter | None = None
        self._spare: LeaderWriter | None = None  # the next term's producer (prepare_claim)
        self._terms: list[Term] = []
        self.started_from = "scratch"
        """Where the image began: ``scratch`` or the snapshot it was read from (and why not)."""

    @classmethod
    def connect(cls, bootstrap: str, namespace: str, *, topic: str = DEFAULT_TOPIC,
                topic_config: TopicConfig | None = None, codec: Codec | None = None,
                timeout: float = 10.0, fetch_wait_ms: int = 5,
                inline_limit: int = DEFAULT_INLINE_LIMIT,
                blob_store: BlobStore | str | os.PathLike[str] | None = None,
                snapshot: str | os.PathLike[str] | None = None,
                client_config: Mapping[str, object] | None = None,
                partitions: int | None = None,
                metrics: CollectorRegistry | None = None) -> Registry:
        """Connect to ``bootstrap``, create the topic if needed, and fold the namespace's log.

        The namespace lives on partition ``crc32(namespace) % partitions``; ``partitions``
        is the topic's partition count unless given (at most the topic's: after partitions
        were added by mistake, the count namespaces were written under). A namespace with no
        grant on that partition is looked for where other counts the topic had would have
        put it (:mod:`registry.placement`): found there, the connect raises
        :class:`~registry.errors.NamespaceMoved` (a :class:`~registry.errors.ConfigError`).

        ``client_config``: extra librdkafka properties for every Kafka client the
        registry makes (a secured cluster's ``security.protocol``, ``ssl.*``,
        ``sasl.*``; :mod:`registry.kafka_config`); properties jobreg's guarantees rest
        on are refused (:data:`~registry.kafka_config.GUARDED`).

        ``metrics``: the ``prometheus_client.CollectorRegistry`` the client's metrics go to
        (default ``prometheus_client.REGISTRY``); several clients may share one, each
        labels its series with its topic and namespace (:mod:`registry.metrics`, README
        "Metrics").

        ``blob_store`` holds graphs larger than ``inline_limit`` (a
        :class:`~registry.blobs.BlobStore`, or a directory / ``file://`` uri;
        default ``$JOBREG_BLOB_DIR`` or ``~/.local/share/jobreg/blobs``); every
        coordinator of a namespace must see the same store. The store may be
        shared by every topic and namespace: the client puts and collects only
        in its own space of it (see :attr:`blob_store`).

        ``snapshot`` (a file from :meth:`write_snapshot`) makes start-up cost
        only the tail of the log: the client starts from the snapshot's image
        and folds what follows it. A snapshot is not trusted, and the client
        rebuilds from the start and says so (``started_from`` and a warning on
        the ``registry`` logger), when its position is older than the topic's
        ``delete.retention.ms`` (a tombstone after it may already be gone) or
        lies beyond the end of the log (another topic, or a wiped broker).

        Raises :class:`~registry.errors.BrokerError` if the broker does not
        answer within ``timeout`` seconds (:class:`~registry.errors.AuthenticationFailed`
        at once for a refused login, :class:`~registry.errors.NotAuthorized` for a missing
        ACL: DESCRIBE, READ and DESCRIBE_CONFIGS on the topic, CREATE to create it),
        :class:`~registry.errors.ConfigError` for a malformed namespace, an unusable topic
        or an unreadable snapshot.
        """
        check_id("namespace", namespace)
        check_id("topic", topic)
        config = topic_config or TopicConfig()
        kafka = Kafka(check_bootstrap(bootstrap), check_client_config(client_config))
        info = ensure_topic(kafka, topic, config, timeout)
        if partitions is not None:
            check_mapping(topic, partitions, info.partitions)
        reg = cls(bootstrap, namespace, topic=topic,
                  partitions=info.partitions if partitions is None else partitions,
                  codec=codec, timeout=timeout, fetch_wait_ms=fetch_wait_ms,
                  inline_limit=inline_limit, blob_store=blob_store,
                  client_config=client_config, pinned=partitions is not None,
                  metrics=metrics)
        if snapshot is not None:
            # The topic's own setting decides; ours only if the broker did not say.
            retention = info.delete_retention_ms
            reg._start_from_snapshot(snapshot, config.delete_retention_ms if retention is None
                                     else retention)
        reg._log.catch_up(reg.timeout)  # bounded by progress, not by the whole read
        try:
            # A namespace with a grant on its partition lives there; only a new (or moved)
            # one costs reads of other partitions.
            verify(reg.kafka, topic, namespace, reg.partitions, timeout,
                   here=reg.image.epoch > 0, codec=reg._codec, topic_count=info.partitions)
        except BaseException:
            reg.close()
            raise
        return reg

    def _start_from_snapshot(self, path: str | os.PathLike[str], retention_ms: int) -> None:
        try:
            snap = read_snapshot(path, namespace=self.namespace, topic=self.topic,
                                 partition=self.partition)
        except StaleSnapshot as e:  # another jobreg's fold rules: a cache of another fold
            self.started_from = f"scratch (snapshot {os.fspath(path)} not trusted: {e})"
            _log.warning("rebuilding namespace %r from the start of the log: %s",
                         self.namespace, e)
            return
        position = snap.image.provenance.last_offset + 1
        # A snapshot is as old as the older of its log time and its writing: a record
        # stamped ahead (a writer's clock on the embedded broker) must not make it young.
        log_time = snap.image.provenance.log_time
        stamp = snap.written_at_ms if log_time is None else min(log_time, snap.written_at_ms)
        age_ms = now_ms() - stamp
        end = self._log.reader.end_offset(self.timeout)
        if age_ms > retention_ms:
            why = (f"its position is {age_ms / 1000:.0f} s old, older than the topic's "
                   f"delete.retention.ms ({retention_ms / 1000:g} s)")
        elif end is not None and end < position:
            why = f"it reaches offset {position - 1}, beyond the end of the log ({end})"
        else:
            self._log.start_at(snap.image)
            self.metrics.snapshot(stamp)
            self.started_from = f"snapshot {os.fspath(path)} at offset {position - 1}"
            return
        self.started_from = f"scratch (snapshot {os.fspath(path)} not trusted: {why})"
        _log.warning("rebuilding namespace %r from the start of the log: snapshot %s not "
                     "trusted: %s", self.namespace, os.fspath(path), why)

    def write_snapshot(self, path: str | os.PathLike[str]) -> Path:
        """Write the current image (caught up first) to ``path``, atomically; return the path."""
        with self._log.lock:
            image = self.sync()
            written = write_snapshot(path, image, topic=self.topic, partition=self.partition)
            log_time = image.provenance.log_time
            self.metrics.snapshot(now_ms() if log_time is None else min(log_time, now_ms()))
            return written

    # -- folding -----------------------------------------------------------------

    def sync(self, timeout: float | None = None) -> Image:
        """Fold every record committed before this call; return the image."""
        return self._log.sync(timeout or self.timeout)

    @property
    def image(self) -> Image:
        """The image as last folded (no catching up; see :meth:`sync`)."""
        return self._log.image

    def _note_leading(self, image: Image) -> None:
        # After every fold: which of this client's terms the log now shows current.
        for term in self._terms:
            term._note_leading(image)

    # -- reads -------------------------------------------------------------------

    def jobs(self, *, include_terminal: bool = False) -> dict[str, JobView]:
        """Job id -> :class:`JobView` of the live jobs (or all, terminal included)."""
        image = self.sync()
        return dict(image.jobs.items()) if include_terminal else image.live_jobs()

    def job(self, job_id: str) -> JobView:
        """One job's view; :class:`~registry.errors.UnknownJob` if never submitted."""
        view = self.sync().jobs.get(check_id("job id", job_id))
        if view is None:
            raise UnknownJob(self.namespace, job_id)
        return view

    def results(self, *, dirty: bool | None = None) -> dict[str, JobView]:
        """Job id -> :class:`JobView` of the terminal jobs: their results (Flink's job result
        store). ``dirty=True``: only those not yet cleaned up (their ``graph`` and
        ``checkpoints`` are what cleanup must delete); ``dirty=False``: only the clean ones."""
        return self.sync().results(dirty=dirty)

    def leader(self) -> LeaderView | None:
        """The current leader (epoch, contender), or ``None`` if none holds an unrevoked term."""
        return self.sync().active_leader

    def epoch(self) -> int:
        """The current fencing epoch (0 before the first grant)."""
        return self.sync().epoch

    def leaders(self) -> Mapping[str, LeaderInfo]:
        """Component -> :class:`~registry.image.LeaderInfo` (``session``, ``address``): the
        leader information the current term published (fold rule 9; empty after a grant or
        a revoke until the new leader publishes). Read-only."""
        return self.sync().leaders

    def rejected(self) -> list[Decision]:
        """Every record the fold refused, in log order, with reason and epochs."""
        return list(self.sync().rejected)

    def quarantined(self) -> list[Decision]:
        """Every record the fold could not decode, in log order."""
        return list(self.sync().quarantined)

    def timeline(self, job_id: str) -> list[Decision]:
        """Every record about ``job_id`` in log order, with the fold's verdict on each.

        Reads the namespace's log from the start (a forensic read: it costs a
        full scan) and folds it afresh; see :mod:`registry.forensics`.
        """
        return self.forensics().timeline(job_id)

    # -- forensics (registry.forensics over this namespace's partition) -------------

    def forensics(self) -> Forensics:
        """Read-only questions answered by replaying this namespace's log from the start."""
        return Forensics(BrokerSource(self.kafka, self.topic, self.partition, self.timeout,
                                      self._codec), self.namespace)

    def state_at(self, offset: int | None = None, time: int | None = None) -> Image:
        """The image after the last record at or before ``offset``, or stamped at or before
        ``time`` (ms since the Unix epoch; :mod:`registry.forensics` says what time means)."""
        return self.forensics().state_at(offset=offset, time=time)

    def explain(self, job_id: str) -> str:
        """Why the job is in its current state: which record put it there, what was refused."""
        return self.forensics().explain(job_id)

    def terms(self) -> list[TermSummary]:
        """Every leadership term: leader, how it started and ended, span, write counts."""
        return self.forensics().terms()

    def dump(self, path: str | os.PathLike[str], *, force: bool = False) -> int:
        """Write this namespace's records to an Avro container file; return how many.

        Replay it with no broker through :meth:`open_dump`. An existing file at ``path`` is
        replaced only if it is a jobreg dump, or with ``force``
        (:meth:`Forensics.dump <registry.forensics.Forensics.dump>`).
        """
        return self.forensics().dump(path, topic=self.topic, force=force)

    @staticmethod
    def open_dump(path: str | os.PathLike[str]) -> Forensics:
        """The read functions (``state_at``, ``timeline``, ``explain``, ``terms``,
        ``decisions``, ``replay``) over a dump file, with no broker at all."""
        source = DumpSource(path)
        return Forensics(source, source.namespace)

    # -- job graphs ----------------------------------------------------------------

    @property
    def blob_store(self) -> BlobStore:
        """This namespace's space of the store of large job graphs (opened on first use).

        The view :meth:`BlobStore.scoped(topic, namespace)
        <registry.blobs.BlobStore.scoped>` of the configured store: blobs are
        put and collected in ``<store>/<topic>/<namespace>/`` only, and read
        from anywhere in the store.
        """
        if self._scoped_store is None:
            store = self._blob_store
            if not isinstance(store, BlobStore):
                store = open_blob_store(store or os.environ.get("JOBREG_BLOB_DIR") or os.path.join(
                    os.path.expanduser("~"), ".local", "share", "jobreg", "blobs"))
            self._scoped_store = store.scoped(self.topic, self.namespace)
        return self._scoped_store

    def collect_garbage(self, grace: float) -> CollectionReport:
        """Delete blobs of this namespace's space that no job references and that are older
        than ``grace`` seconds.

        A live job references its graph, and so does a terminal job until its result is
        clean (:meth:`Term.mark_clean`, :meth:`Term.cleanup`): a graph is freed only once
        the cleanup of its job is done. A caller that never cleans up marks results clean
        as jobs end (``term.cleanup(lambda view: None)``), or graphs are kept for ever.

        Never deletes a blob a job references: it lists and deletes only
        in :attr:`blob_store`, this topic's and namespace's own space, where
        only this namespace's jobs put blobs, so another namespace's (or
        another topic's) blobs are never even listed. Blobs of the flat layout
        written before key spaces, and graphs outside the store, are never
        collected. Steps, in this order:

        1. list the space (with each blob's age);
        2. read the log to its end: the referenced set is taken *after* the
           listing, so a graph whose submit landed before it is seen as
           referenced (a submit writes its blob first, then its event);
        3. list again and keep only blobs unchanged since step 1: a submit
           that re-put an existing blob meanwhile made it young again;
        4. delete the unreferenced ones older than ``grace``.

        ``grace`` must exceed the longest time between a blob's put and its
        submit's record landing (a submit's ``timeout``; the default
        deployments use an hour).
        """
        if grace < 0:
            raise ConfigError(f"grace must be >= 0 seconds, not {grace}")
        store = self.blob_store
        # Step 1.
        now = time.time()
        listed = {b.uri: b for b in store.list()}
        # Step 2.
        image = self.sync()
        referenced = image.referenced_blobs()
        # Step 3.
        unchanged = [b for b in store.list() if listed.get(b.uri) == b]
        # Step 4.
        return collect(store, referenced, grace_s=grace, now=now, blobs=unchanged)

    # -- leadership --------------------------------------------------------------

    def claim_leadership(self, contender: str, *, lease_ms: int | None = None) -> Term:
        """Append a compare-and-set grant for the next epoch; return the :class:`Term`.

        For an external election (ZooKeeper, Kubernetes) that has just chosen
        ``contender``. Raises :class:`~registry.errors.ClaimRejected` if
        another grant got into the log first (the fold's CAS decides). Counted in
        ``jobreg_writes_total`` as a write call.
        """
        check_id("contender", contender)
        return self._claim_leadership(contender, lease_ms, None)

    def _claim_leadership(self, contender: str, lease_ms: int | None,
                          image: Image | None, saw_renewal: int | None = None) -> Term:
        """:meth:`claim_leadership` from ``image`` if it is the image as last folded (an
        election's round has just read the log), else from the log read now.
        ``saw_renewal`` (an election's claim): the highest renewal ordinal of the current
        term in ``image``; the grant is then a compare-and-set on the epoch and on the
        renewals of ``image`` (fold rule 3), whatever the log holds now."""
        with _Meter(self.metrics), self._log.lock:
            if image is None or (image is not self._log.image and saw_renewal is None):
                image = self.sync()
            if self._plain is None:
                self._plain = PlainWriter(self.kafka, self.timeout, self.topic)
            actual = self._plain.partition_count(self.topic)
            if not self._pinned:  # partitions added since this client read the count?
                check_count(self.topic, self.namespace, self.partitions, actual)
            if image.epoch == 0:  # the namespace's first grant: where and under which count
                check_birth(self.kafka, self.topic, self.namespace, self.partitions,
                            self.timeout, codec=self._codec, topic_count=actual)
            return self._claim(contender, image, lease_ms, saw_renewal)

    def _claim(self, contender: str, image: Image, lease_ms: int | None,
               saw_renewal: int | None = None) -> Term:
        with self._log.lock:
            grant = LeadershipGranted(
                event_id=new_event_id(), namespace=self.namespace, epoch=image.epoch + 1,
                writer=contender, created_at=now_ms(), prev_epoch=image.epoch,
                lease_ms=lease_ms, partitions=self.partitions, partition=self.partition,
                saw_renewal=saw_renewal, layout=LAYOUT)
            if self._plain is None:
                self._plain = PlainWriter(self.kafka, self.timeout, self.topic)
            self._log.waiting[grant.event_id] = None
            try:
                offset: int | None = None
                try:
                    offset = self._plain.write(
                        self.topic, self.partition,
                        [(record_key(grant).encode(), self._codec.encode(grant))])[0]
                    self._log.read_until(offset, self.timeout)
                except BrokerError as e:
                    if isinstance(e, NotAuthorized) and offset is None:
                        # The grant itself was refused, so not appended: not accepted.
                        e.event_ids = (grant.event_id,)
                        raise
                    try:
                        self.sync()  # the grant may have landed: read, don't guess
                    except BrokerError as lost:
                        raise OutcomeUnknown(f"the grant to {contender!r} for epoch "
                                             f"{grant.epoch} may or may not be in the log: {e}",
                                             (grant.event_id,)) from lost
                decision = self._log.waiting.get(grant.event_id)
            finally:
                self._log.waiting.pop(grant.event_id, None)
            if decision is None:
                raise OutcomeUnknown(f"the grant to {contender!r} for epoch {grant.epoch} was "
                                     "not confirmed and is not in the log (yet)",
                                     (grant.event_id,))
            if not decision.accepted:
                error = _rejection(decision)
                error.event_ids = (grant.event_id,)
                raise error
            term = Term(self, grant.epoch, contender)
            # The producer a standby made while it waited (prepare_claim), if any.
            term._writes.writer, self._spare = self._spare, None
            self._terms.append(term)
            self._log.note_leading()
            try:
                term._start()
            except RegistryError as e:
                # The grant is accepted: the term is real, and the claim returns it. Its
                # producer and the reassertions are retried by its first write, which
                # also reports a newer term if one came meanwhile.
                _log.warning("term %d of %r starts without its producer or settled keys "
                             "(%s); its first write retries", term.epoch, contender, e)
            return term

    def prepare_claim(self) -> None:
        """Make the producers a claim needs, ahead of it: the grant's, and the next term's
        (:class:`~registry.log.LeaderWriter`), connected and warmed up. They write nothing
        until the claim and its term do, and fence nobody (nothing is fenced at the broker:
        the fold refuses a stale term's records). A standby waiting in :meth:`elect` does
        this while it waits, so that its claim, when it comes, does not wait for producers
        to start. Raises :class:`~registry.errors.BrokerError` if the broker does not answer.
        """
        with self._log.lock:
            need_plain, need_spare = self._plain is None, self._spare is None
        # Made outside the lock (a producer takes a round trip or two to start): the
        # registry's reads go on meanwhile.
        plain = PlainWriter(self.kafka, self.timeout, self.topic) if need_plain else None
        try:
            spare = (LeaderWriter(self.kafka, self.topic, self.partition, self.timeout)
                     if need_spare else None)
        finally:
            with self._log.lock:
                if plain is not None and self._plain is None:
                    self._plain, plain = plain, None
        with self._log.lock:
            if spare is not None and self._spare is None:
                self._spare, spare = spare, None
        for unused in (plain, spare):  # another thread made one meanwhile
            if unused is not None:
                unused.close()

    def elect(self, contender: str, lease: float, *,
              on_revoked: Callable[[Term], object] | None = None,
              on_renewed: Callable[[Term], object] | None = None,
              keep_alive: Callable[[], bool] | None = None,
              clock: Callable[[], float] | None = None) -> Election:
        """Built-in lease election: ``with reg.elect("jm-1", lease=5.0) as term: ...``.

        Blocks on entry until ``contender`` leads, renews the lease (seconds)
        in the background, calls ``on_revoked(term)`` when the term is lost,
        and revokes the term on exit. See :mod:`registry.election`. The
        registry's ``timeout`` must be at most half the lease. ``on_renewed(term)`` after
        each successful renewal; ``keep_alive()``, asked before every claim and renewal,
        lets a contender lead only while the process it leads for is alive. ``clock``: the
        lease clock, :func:`registry.election.lease_clock` by default (it counts a host's
        suspend); injectable for tests.
        """
        check_id("contender", contender)
        return Election(self, contender, lease, on_revoked=on_revoked, on_renewed=on_renewed,
                        keep_alive=keep_alive, clock=clock or lease_clock)

    def close(self) -> None:
        """Release every broker connection of this client and of the terms it granted.

        The terms themselves go on until fenced or revoked; only this
        process's producers are closed.
        """
        with self._log.lock:
            for term in self._terms:
                term.close()
                term._note_leading(None)  # this process holds it no more
            self._terms.clear()
            if self._plain is not None:
                self._plain.close()
                self._plain = None
            if self._spare is not None:
                self._spare.close()
                self._spare = None
            self._log.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Registry({self.bootstrap!r}, namespace={self.namespace!r}, "
                f"topic={self.topic!r}, offset={self._log.image.provenance.last_offset})")


class Term:
    """One leadership term: the only way to write job events.

    Obtained from :meth:`Registry.claim_leadership`. Every method returns
    once the fold has decided on its records (see the module docstring for
    the steps). A term ends when a newer grant is accepted or it is revoked;
    its later writes raise :class:`~registry.errors.Fenced` naming the
    expected and the actual epoch and the leader.
    """

    def __init__(self, registry: Registry, epoch: int, contender: str) -> None:
        self.registry = registry
        self.epoch = epoch
        self.contender = contender
        self.namespace = registry.namespace
        self._writes = TermWrites(registry._log, registry.kafka, registry.topic,
                                  registry.namespace, registry.partition, registry.timeout,
                                  epoch, self.fenced)
        self._groups = GroupCommit(self._run_group)  # concurrent calls share a write
        self._planned: dict[str, tuple[object, object]] = {}
        """Job id -> (the group in flight that planned it, the checkpoint state it left)."""
        # checkpoint records written since the last collection (fold rule 6): each leaves
        # the record before it superseded, so the next settling collects once this many
        # are due (COLLECT_BATCH), without planning the collection after every call
        self._uncollected = 0
        self._in_flight: dict[object, set[str]] = {}
        """A group in flight -> what its records are about: job ids, and ``leader/<component>``
        for leader information (no restatement of them is planned until it is decided)."""
        self._lease_guard: Callable[[], None] | None = None  # guard_writes
        self._metrics = registry.metrics
        self._leading = False  # counted in jobreg_leading
        self._resigned = False  # revoke() was called: no leadership is claimed from it
        self._renewal_sent = 0  # the highest renewal ordinal this term sent (fold rule 3)
        self._renewals_unconfirmed = 0  # its renewals whose call raised (fold rule 3)

    def __repr__(self) -> str:
        return f"Term(namespace={self.namespace!r}, epoch={self.epoch}, contender={self.contender!r})"

    # -- commands ------------------------------------------------------------------

    def submit(self, job_id: str, graph: bytes | InlineGraph | GraphRef, *,
               max_checkpoint_failures: int = 0, retained_checkpoints: int = 1) -> Receipt:
        """Submit a new job with its graph; a known or terminal id is refused by the fold.

        A graph larger than the registry's ``inline_limit`` is written to the
        namespace's space of the blob store first and the event carries its
        reference. A :class:`~registry.events.GraphRef` to a blob anywhere in
        the store (another namespace's or topic's space, or the flat layout
        of old) is read, verified and copied into this namespace's space, and
        the event carries the copy's reference (a missing or corrupt blob
        raises :class:`~registry.errors.BlobError` and nothing is written); a
        ``GraphRef`` outside the store is carried as is and never collected.
        ``max_checkpoint_failures`` is the tolerable number of consecutive failed
        checkpoints; ``retained_checkpoints`` how many completed ones to keep.
        """
        return self.submit_many([(job_id, graph)],
                                max_checkpoint_failures=max_checkpoint_failures,
                                retained_checkpoints=retained_checkpoints)[0]

    def submit_many(self, jobs: Iterable[tuple[str, bytes | InlineGraph | GraphRef]]
                    | Mapping[str, bytes | InlineGraph | GraphRef], *,
                    max_checkpoint_failures: int = 0,
                    retained_checkpoints: int = 1) -> list[Receipt]:
        """Submit several jobs in one call, all or none (fold rule 8); one receipt per job,
        in order. A known or terminal id refuses the whole call."""
        if max_checkpoint_failures < 0 or retained_checkpoints < 1:
            raise ConfigError("max_checkpoint_failures must be >= 0 and retained_checkpoints "
                              ">= 1")
        items = jobs.items() if isinstance(jobs, Mapping) else jobs
        put: dict[str, tuple[GraphRef, bytes]] = {}  # this call's blobs (calls run at once)
        events = [self._event(JobSubmitted, job_id, graph=self._graph(graph, put),
                              max_checkpoint_failures=max_checkpoint_failures,
                              retained_checkpoints=retained_checkpoints)
                  for job_id, graph in items]
        receipts = self._write(events)
        # A blob collector that listed an old copy of a re-put blob may have
        # deleted it meanwhile: the blob must exist now that the event is in. The
        # submit is accepted: a failure here is logged, never raised (the job's
        # recovery reports a missing graph on its own, incident 003).
        for ref, data in put.values():
            try:
                if not self.registry.blob_store.exists(ref):
                    self.registry.blob_store.put(data)
            except RegistryError as e:
                _log.error("job graph %s of an accepted submit could not be re-put: %s",
                           ref.uri, e)
        return receipts

    def adopt(self, *job_ids: str) -> list[Receipt]:
        """Take the lock of the given live jobs for this term: one call, all or none."""
        return self._write([self._event(JobAdopted, self._known(j)) for j in job_ids])

    def release(self, job_id: str) -> Receipt:
        """Let go of a job's lock; the job stays in the registry, live and unowned, for the
        next term's :meth:`recover`. Of a job whose recovery failed (``RECOVERY_FAILED``) a
        release clears the failure and hands the job to the next recovery (the error stays
        in its timeline); :meth:`retry` recovers it in this term."""
        return self._write([self._event(JobLockReleased, self._known(job_id))])[0]

    def cancel(self, job_id: str, reason: str = "") -> Receipt:
        """Cancel a job: terminal for ever (it can never be recovered or resubmitted). Its
        result is dirty until :meth:`mark_clean`: it keeps the graph and the checkpoints
        the job ended with, for cleanup."""
        return self._write([self._event(JobCancelled, self._known(job_id),
                                        reason=reason)])[0]

    def terminate(self, job_id: str, state: str, reason: str = "") -> Receipt:
        """Record that a job reached a terminal ``state`` (``FINISHED`` or ``FAILED``); its
        result is dirty until :meth:`mark_clean`, as after :meth:`cancel`."""
        if state not in (JobStatus.FINISHED, JobStatus.FAILED):
            raise ConfigError(f"terminal state must be FINISHED or FAILED, not {state!r}")
        return self._write([self._event(JobTerminated, self._known(job_id), state=state,
                                        reason=reason)])[0]

    def mark_clean(self, job_id: str) -> Receipt:
        """Record that a terminal job's cleanup is done (its graph, checkpoints and other
        data deleted): the result becomes clean and blob collection may free its graph
        (Flink's ``JobResultStore.markResultAsClean``). Marking a clean result again
        changes nothing. :class:`~registry.errors.UnknownJob` for an unknown id,
        :class:`~registry.errors.ConfigError` for a live job (it has no result)."""
        view = self.registry.image.jobs.get(self._known(job_id)) or self.registry.job(job_id)
        if view.live:
            raise ConfigError(f"job {job_id!r} is {view.status}: only a terminal job has a "
                              "result to clean up")
        return self._write([self._event(JobCleanedUp, job_id, status=view.status,
                                        reason=view.reason, end_event_id=view.ended_by)])[0]

    def cleanup(self, on_cleanup: CleanupHook) -> list[CleanupResult]:
        """Clean up every dirty result: ``on_cleanup(view)`` deletes what the job left (its
        ``graph``, its ``checkpoints.retained`` locations), then the result is marked
        clean. A hook that raises leaves that result dirty (its error in the returned
        :class:`~registry.recovery.CleanupResult`) for a later cleanup, as Flink retries;
        other results go on. Raises :class:`~registry.errors.Fenced` if the term is over
        (or whatever else a write raises); the error's ``cleaned`` then holds the results
        of the jobs before it (their ``JobCleanedUp`` records were accepted)."""
        results: list[CleanupResult] = []
        for view in self.registry.sync().results(dirty=True).values():
            error = clean_one(view, on_cleanup)
            if error is not None:
                results.append(CleanupResult(view.job_id, False, error))
                continue
            try:
                receipt = self.mark_clean(view.job_id)
            except RegistryError as e:
                e.cleaned = tuple(results)  # type: ignore[attr-defined]
                raise
            results.append(CleanupResult(view.job_id, True, None, receipt.offset))
        return results

    def publish_leader(self, component: str, session: str, address: str | None) -> Receipt:
        """Publish who leads ``component`` (Flink's leader information: ``resourcemanager``,
        ``dispatcher``, ``rest_server`` or a job's id) and where: this term's leader
        ``session`` id and ``address``; ``address`` ``None`` deletes the component's
        information. A fenced write like every other (fold rule 9): once a newer term is
        granted or this one is revoked, it raises :class:`~registry.errors.Fenced`.
        Malformed input raises :class:`~registry.errors.ConfigError` before anything is
        sent."""
        error = leader_information_error(component, session, address)
        if error is not None:
            raise ConfigError(error)
        return self._write([LeaderInformationPublished(
            event_id=new_event_id(), namespace=self.namespace, epoch=self.epoch,
            writer=self.contender, created_at=now_ms(), component=component, session=session,
            address=address)])[0]

    @property
    def resigned(self) -> bool:
        """True once :meth:`revoke` was called: the term is being given up, so its election
        no longer says it certainly leads (``Election.valid_for()`` is 0), whether or not the
        revoke has landed yet (once it has, a contender may be granted at once)."""
        return self._resigned

    def revoke(self, reason: str = "") -> Receipt:
        """Give this term up; no later write of it is accepted."""
        self._resigned = True
        return self._write([LeadershipRevoked(
            event_id=new_event_id(), namespace=self.namespace, epoch=self.epoch,
            writer=self.contender, created_at=now_ms(), reason=reason)])[0]

    # -- recovery --------------------------------------------------------------------

    def recover(self, on_recover: RecoveryHook | None = None, *,
                on_cleanup: CleanupHook | None = None,
                batch_size: int = 1000) -> list[RecoveryResult]:
        """Adopt every live job of earlier terms and every released job; one result per job.

        With ``on_cleanup``, then clean up every dirty result as :meth:`cleanup` does
        (what a new leader owes the jobs that ended under an earlier one, as Flink's
        dispatcher does on gaining leadership); each gets a result too, ``CLEANED`` or
        ``CLEANUP_FAILED`` (with the hook's error).

        Each job's graph is loaded and verified and ``on_recover`` (if given) is
        called with a :class:`~registry.recovery.RecoveredJob`. A job whose
        graph is missing or corrupt, or whose hook raises, gets a
        ``JobRecoveryFailed`` record (status ``RECOVERY_FAILED``, its error
        kept) and is not tried again by later recoveries until :meth:`retry`
        or a cancel; every other job is adopted. Never raises for one job's
        fault; raises :class:`~registry.errors.Fenced` if the term is over.
        Records are written in calls of ``batch_size`` jobs, each all-or-nothing;
        if the term ends between two of them, the ``Fenced`` raised for the
        refused one carries in ``recovered`` the results of the calls before it.
        """
        image = self.registry.sync()
        store = self._store_if_needed(image)
        outcomes = [(view.job_id, recover_one(view, store, on_recover))
                    for view in candidates(image, self.epoch)]
        results: list[RecoveryResult] = []
        # The hooks ran above, the collector on; what follows allocates only acyclic
        # records, encodings and verdicts, thousands of them, while the collector would walk
        # the image of every job again and again (measured on 10,000 jobs: 0.60 s -> 0.33 s
        # for the writes below, as for a replay: registry.fold.bulk).
        with bulk():
            for start in range(0, len(outcomes), batch_size):
                chunk = outcomes[start:start + batch_size]
                events = self._recovery_events(chunk)
                with _Meter(self._metrics):
                    decisions = self._commit(events)
                    refused = _refusal(decisions)
                    if refused is not None:
                        # This chunk is not accepted; the chunks before it were, as
                        # separate calls.
                        rejection = _rejection(refused)
                        rejection.event_ids = tuple(e.event_id for e in events)
                        rejection.recovered = tuple(results)  # type: ignore[attr-defined]
                        raise rejection
                for (job_id, error), d in zip(chunk, decisions, strict=True):
                    results.append(RecoveryResult(
                        job_id, "ADOPTED" if error is None else JobStatus.RECOVERY_FAILED,
                        error, d.offset))
        if on_cleanup is not None:
            results += [RecoveryResult(c.job_id, "CLEANED" if c.cleaned else "CLEANUP_FAILED",
                                       c.error, c.offset) for c in self.cleanup(on_cleanup)]
        return results

    def _recovery_events(self, chunk: list[tuple[str, str | None]]) -> list[Event]:
        """One call's records of :meth:`recover`: (job id, error or ``None``) -> a
        ``JobAdopted`` or a ``JobRecoveryFailed``, as :meth:`_event` makes them, with one
        stamp for the call (the ids come from the image: the fold checked them)."""
        ns, epoch, writer, created = self.namespace, self.epoch, self.contender, now_ms()
        return [JobAdopted(event_id=new_event_id(), namespace=ns, epoch=epoch, writer=writer,
                           created_at=created, job_id=job_id) if error is None
                else JobRecoveryFailed(event_id=new_event_id(), namespace=ns, epoch=epoch,
                                       writer=writer, created_at=created, job_id=job_id,
                                       error=error)
                for job_id, error in chunk]

    def retry(self, job_id: str, on_recover: RecoveryHook | None = None) -> RecoveryResult:
        """Recover a job that failed recovery once more (its graph, then the hook).

        Adopts it if that works, records the new error if not.
        :class:`~registry.errors.ConfigError` if the job has not failed recovery.
        """
        view = self.registry.job(job_id)
        if view.status != JobStatus.RECOVERY_FAILED:
            raise ConfigError(f"job {job_id!r} is {view.status}; only a job that failed "
                              "recovery can be retried")
        error = recover_one(view, self._store_if_needed(self.registry.image), on_recover)
        event = (self._event(JobAdopted, job_id) if error is None
                 else self._event(JobRecoveryFailed, job_id, error=error))
        receipt = self._write([event])[0]
        return RecoveryResult(job_id, "ADOPTED" if error is None else JobStatus.RECOVERY_FAILED,
                              error, receipt.offset)

    def recovery_failed(self, job_id: str, error: str) -> Receipt:
        """Record that recovering the job failed where this client could not see it (a host
        that reads the job's graph itself, as Flink's JobManager does through the Flink
        bridge): the same ``JobRecoveryFailed`` record :meth:`recover` writes (status
        ``RECOVERY_FAILED``, ``error`` kept, no owner; :meth:`retry`, a release or a cancel
        moves it on). Raises :class:`~registry.errors.WriteRejected` for an unknown
        (``unknown_job``) or ended (``terminal_job``) job, as every write of a job."""
        return self._write([self._event(JobRecoveryFailed, job_id, error=error)])[0]

    # -- checkpoints -------------------------------------------------------------------

    def checkpoint_triggered(self, job_id: str, checkpoint_id: int) -> Receipt:
        """Checkpoint ``checkpoint_id`` of the job started (ids increase per job)."""
        return self._checkpoint(CheckpointTriggered, job_id, checkpoint_id)

    def checkpoint_completed(self, job_id: str, checkpoint_id: int, location: str, *,
                             retained: int = 0) -> Receipt:
        """Checkpoint ``checkpoint_id`` completed at ``location``: the failure count resets.
        ``retained``: how many completed checkpoints the job keeps with this one, the newest
        (Flink's ``state.checkpoints.num-retained``); 0: the job's ``retained_checkpoints``,
        from its submit."""
        if type(retained) is not int or retained < 0:
            raise ConfigError(f"retained is a count of checkpoints (0: the job's), not "
                              f"{retained!r}")
        return self._checkpoint(CheckpointCompleted, job_id, checkpoint_id, location=location,
                                retained=retained)

    def checkpoint_failed(self, job_id: str, checkpoint_id: int, reason: str,
                          task: str | None = None, *,
                          failure_reason: str = "UNSPECIFIED") -> Receipt:
        """Checkpoint ``checkpoint_id`` failed; ``failure_reason`` is Flink's
        ``CheckpointFailureReason`` name (:data:`~registry.events.CHECKPOINT_FAILURE_REASONS`;
        Flink :data:`~registry.events.FLINK_RELEASE`'s table says which count, and
        ``UNSPECIFIED`` counts; the record carries that decision; a name jobreg does not
        know is a :class:`~registry.errors.ConfigError`), ``reason`` says why for
        people. The receipt's ``ignored`` says why it did not count (a reason Flink does not
        count, a checkpoint discarded, completed, superseded, not pending, or already
        counted); :meth:`Registry.job` shows ``over_budget`` once the job's tolerable
        number is passed: then restart the job (:meth:`job_restarted`) or fail it
        (:meth:`terminate`), as Flink does."""
        return self._checkpoint(CheckpointFailed, job_id, checkpoint_id, reason=reason,
                                task=task, **_failure_reason(failure_reason))

    def checkpoint_trigger_failed(self, job_id: str, failure_reason: str,
                                  reason: str = "") -> Receipt:
        """Triggering a checkpoint failed before it had an id (Flink's trigger phase): counted
        every time if ``failure_reason`` counts (:meth:`checkpoint_failed`)."""
        return self._checkpoint(CheckpointFailed, job_id, UNKNOWN_CHECKPOINT, reason=reason,
                                **_failure_reason(failure_reason))

    def job_restarted(self, job_id: str, reason: str = "") -> Receipt:
        """The job was restarted (failed over) from its newest completed checkpoint, as Flink
        does when the tolerable checkpoint failures are exceeded: the failure count starts
        again, pending checkpoints are discarded, the retained ones are kept."""
        view = self.registry.image.jobs.get(self._known(job_id)) or self.registry.job(job_id)
        return self._checkpoint(JobRestarted, job_id, view.checkpoints.last_completed,
                                reason=reason)

    def rescale(self, job_id: str,
                requirements: Mapping[str, tuple[int, int]] | Iterable[VertexParallelism],
                reason: str = "") -> Receipt:
        """Set the job's resource requirements (Flink's ``putJobResourceRequirements``): a
        :class:`~registry.events.JobRescaled` whose state holds them, a fenced record of its
        own that every later checkpoint record of the job carries on, so a new leader
        recovers them whatever the cleaner removed (fold rule 6). ``requirements``: vertex
        id -> (lower bound, upper bound), or :class:`~registry.events.VertexParallelism`
        values; -1 leaves a bound to the scheduler; empty: none set. Raises
        :class:`~registry.errors.ConfigError` for requirements the fold would refuse
        (:func:`registry.fold.requirements_error`), and as every write of a job."""
        if isinstance(requirements, Mapping):
            try:
                values = [VertexParallelism(v, *bounds) for v, bounds in requirements.items()]
            except TypeError as e:
                raise ConfigError(f"requirements map a vertex id to (lower, upper): {e}") \
                    from None
        else:
            values = list(requirements)
        if not all(isinstance(v, VertexParallelism) for v in values):
            raise ConfigError("requirements are VertexParallelism values or a mapping of "
                              "vertex id -> (lower, upper)")
        ordered = tuple(sorted(values, key=lambda v: str(v.vertex_id)))
        error = requirements_error(ordered)
        if error is not None:
            raise ConfigError(f"cannot rescale job {job_id!r}: {error}")
        return self._checkpoint(JobRescaled, job_id, UNKNOWN_CHECKPOINT, reason=reason,
                                requirements=ordered)

    def checkpoint_discarded(self, job_id: str, checkpoint_id: int, reason: str = "") -> Receipt:
        """The coordinator gave the checkpoint up; later failures of it are ignored."""
        return self._checkpoint(CheckpointDiscarded, job_id, checkpoint_id, reason=reason)

    def reassert(self) -> int:
        """Catch up, then reassert every key a refused record is the newest record of, and
        collect the checkpoint records no state stands on (fold rule 6).

        Returns how many keys were reasserted. Writes do this on their own; a
        leader that may stay idle calls it at least once per
        ``min.compaction.lag.ms``.
        """
        image = self.registry.sync()
        self._writes.collect(plan_collection(image, first=True))
        planned = len(plan_reassertions(self.registry.image, self.epoch, self.contender))
        if planned:
            self._commit([])
        self._uncollected = 0
        self._writes.collect(plan_collection(self.registry.image))
        return planned

    def close(self) -> None:
        """Drop this term's producer (the term itself goes on until fenced or revoked)."""
        self._writes.close()

    def __enter__(self) -> Term:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _event(self, cls: type[JobEvent], job_id: str, **payload: Any) -> Event:
        return cls(event_id=new_event_id(), namespace=self.namespace, epoch=self.epoch,
                   writer=self.contender, created_at=now_ms(),
                   job_id=check_id("job id", job_id), **payload)

    def _graph(self, graph: bytes | InlineGraph | GraphRef,
               put: dict[str, tuple[GraphRef, bytes]]) -> InlineGraph | GraphRef:
        # ``put`` collects the blobs this call wrote, for the submit to check after.
        if isinstance(graph, GraphRef):
            store = self.registry.blob_store
            if not store.contains(graph.uri):
                return graph  # outside the store: referenced as is, never collected
            # In the store, maybe in another space: copy it into ours (a re-put of a blob
            # already in our space only makes it young), so that every blob a job of this
            # namespace references and a collection may delete lives in its own space.
            data = store.get(graph)
            ref = store.put(data)
            put[ref.uri] = (ref, data)
            return ref
        if isinstance(graph, InlineGraph):
            data = graph.data
        elif isinstance(graph, (bytes, bytearray, memoryview)):
            data = bytes(graph)
        else:
            raise ConfigError(f"a job graph is bytes, InlineGraph or GraphRef, not "
                              f"{type(graph).__name__}")
        if len(data) <= self.registry.inline_limit:
            return InlineGraph(data)
        # Too large to travel in the event: the blob is written first, completely.
        ref = self.registry.blob_store.put(data)
        put[ref.uri] = (ref, data)
        return ref

    def _store_if_needed(self, image: Image) -> BlobStore | None:
        if any(isinstance(v.graph, GraphRef) for v in image.jobs.values()):
            return self.registry.blob_store
        return None

    def _checkpoint(self, kind: type[CheckpointEvent], job_id: str, checkpoint_id: int, *,
                    requirements: Any = (),  # tuple[VertexParallelism, ...]: rescale's
                    **payload: object) -> Receipt:
        if type(checkpoint_id) is not int:
            raise ConfigError(f"checkpoint ids are integers, not {checkpoint_id!r}")
        view = self.registry.image.jobs.get(self._known(job_id)) or self.registry.job(job_id)

        retained = checkpoints_retained(payload.get("retained", 0), view.retained_checkpoints)

        def step(before: CheckpointState) -> CheckpointState:
            # The record carries the state after it, computed with the fold's own rule
            # (the fold recomputes it and refuses a record whose state differs).
            try:
                state, _ = checkpoint_step(before, kind, checkpoint_id,
                                           location=str(payload.get("location", "")),
                                           retained=retained,
                                           failure_reason=str(payload.get("failure_reason",
                                                                          "UNSPECIFIED")),
                                           counts=payload.get("reason_counts"),  # type: ignore[arg-type]
                                           requirements=requirements)
            except CheckpointRuleViolation:  # the fold refuses it, with its reason, in the log
                state = replace(before, seq=before.seq + 1)
            return state

        def restate(event: Event, states: dict[str, object]) -> Event:
            # At group assembly: from the state the image holds now, or the one the calls
            # before this one in the group leave.
            now = self.registry.image.jobs.get(job_id)
            before = states.get(job_id) or (now.checkpoints if now is not None
                                            else view.checkpoints)
            state = step(before)  # type: ignore[arg-type]
            states[job_id] = state
            return replace(event, state=state)  # type: ignore[call-arg]

        event = self._event(kind, job_id, checkpoint_id=checkpoint_id,
                            state=step(view.checkpoints), **payload)
        self._uncollected += 1
        return self._write([event], restate=restate)[0]

    def _known(self, job_id: str) -> str:
        # A guard against typos, not a rule: the fold would accept a cancel of an
        # unknown id (after compaction it cannot tell "unknown" from "compacted").
        check_id("job id", job_id)
        if job_id not in self.registry.image.jobs and job_id not in self.registry.sync().jobs:
            raise UnknownJob(self.namespace, job_id)
        return job_id

    def _start(self) -> None:
        # Step 1 of a term: make its producer (unless a newer grant already followed
        # ours), then settle whatever refused records the log holds. From the image the
        # claim has just read (its grant, and the end of the log after it): reading again
        # would only add a round trip to every claim (two did: 23 ms of a 70 ms claim); a
        # refused record that lands later is settled by the next write, as it would be
        # after a read here.
        if self.fenced() is None:
            self._writes.open()
            # (a job's records no state stands on go before anything of it is restated)
            self._writes.collect(plan_collection(self.registry.image, first=True))
            if plan_reassertions(self.registry.image, self.epoch, self.contender):
                self._commit([])

    # -- for an election ----------------------------------------------------------------

    def guard_writes(self, guard: Callable[[], None] | None) -> None:
        """Call ``guard`` before anything of a write is sent; it refuses the write by
        raising (the built-in election raises :class:`~registry.errors.LeaseExpired` while
        the lease is not valid, :class:`~registry.errors.Fenced` once the term is lost).
        Settling keys after a decided write calls it again and, refused, leaves them for the
        next write. ``None`` removes it."""
        self._lease_guard = guard

    def renew_lease(self, renewal: int | None = None, attempts: int | None = None) -> Receipt:
        """Write a :class:`~registry.events.LeaseRenewed` of this term, past the write guard
        (a renewal is what makes a lease valid again). Raises as any write does.
        ``renewal`` and ``attempts`` (fold rule 3, the renewal's key): as the renewer
        planned them (:meth:`plan_renewal`, just before); by default planned now. Renew
        from one thread at a time: the term counts the renewals it sent, and those whose
        call raised, for the keys of the next ones."""
        if renewal is None or attempts is None:
            renewal, attempts = self.plan_renewal()
        event = LeaseRenewed(event_id=new_event_id(), namespace=self.namespace,
                             epoch=self.epoch, writer=self.contender, created_at=now_ms(),
                             renewal=renewal, attempts=attempts)
        self._renewal_sent = max(self._renewal_sent, renewal)
        try:
            return self._write([event], guard=False)[0]
        except BaseException:
            # It may land later (after the next renewal, after a grant): the renewals
            # planned from now on take keys of their own.
            self._renewals_unconfirmed += 1
            raise

    def plan_renewal(self) -> tuple[int, int]:
        """The ordinal and ``attempts`` of this term's next renewal (fold rule 3; they choose
        its key, :func:`~registry.keys.lease_key`), from the image as read so far: one more
        than the highest ordinal folded or sent by this term (whatever became of it: no two
        renewals of a term share an ordinal), and the refused grant attempts against the term
        folded plus the renewals of this term whose call raised (either moves the renewals
        planned after it to keys of their own)."""
        info = self.registry.image.term
        sent, unconfirmed = self._renewal_sent, self._renewals_unconfirmed
        if info is None or info.epoch != self.epoch:
            return sent + 1, unconfirmed
        return max(info.renewal, sent) + 1, info.refused_grants + unconfirmed

    def fenced(self) -> Fenced | None:
        """The :class:`~registry.errors.Fenced` a write of this term would get from the
        fold's fencing rule, asked of the image as read so far (``None``: the term is
        current as far as this client has read). Reads nothing: call
        :meth:`Registry.sync` first for an answer as of now."""
        image = self.registry.image
        reason = fencing_reason(image.epoch, image.leader, image.revoked, self.epoch,
                                self.contender)
        if reason is None:
            return None
        return Fenced(reason, fencing_detail(reason, image.epoch, image.leader, self.epoch,
                                             self.contender),
                      expected_epoch=image.epoch, actual_epoch=self.epoch, leader=image.leader)

    def _write(self, events: list[Event], *, guard: bool = True,
               restate: Restate | None = None) -> list[Receipt]:
        """Write ``events``; a receipt each, or the first refusal raised. Counted in
        ``jobreg_writes_total`` and ``jobreg_write_duration_seconds`` whatever the outcome.
        ``restate``: see :class:`~registry.writes.PendingCall`."""
        with _Meter(self._metrics):
            decisions = self._commit(events, guard=guard, restate=restate)
            refused = _refusal(decisions)
            if refused is not None:
                error = _rejection(refused)
                error.event_ids = tuple(e.event_id for e in events)
                raise error
            return [Receipt(d.offset, self.epoch, d.event_id or "",
                            d.detail if d.outcome == Outcome.IGNORED else None)
                    for d in decisions]

    def _note_leading(self, image: Image | None) -> None:
        """Count this term in ``jobreg_leading`` while ``image`` shows it current (``None``:
        this process lets it go)."""
        leading = image is not None and fencing_reason(
            image.epoch, image.leader, image.revoked, self.epoch, self.contender) is None
        if leading != self._leading:
            self._leading = leading
            if leading:
                self._metrics.leading.inc()
            else:
                self._metrics.leading.dec()

    def _commit(self, events: list[Event], *, guard: bool = True,
                restate: Restate | None = None) -> list[Decision]:
        """Write ``events`` in one write (fold rule 8 makes several one call); the fold's
        decision on each.

        Never raises for a refusal. Raises only before anything was sent
        (:class:`~registry.errors.LeaseExpired` when an elected leader's lease
        was not renewed in time, ``Fenced`` when the image already shows the
        term over) or when nothing can be decided (``Fenced`` when the log
        shows the term ended first, ``OutcomeUnknown``); once the fold has
        decided, the decisions are returned whatever the follow-up does.
        """
        reg = self.registry
        if guard and self._lease_guard is not None:
            self._lease_guard()
        try:  # several records: one call, decided all or none at its commit (fold rule 8)
            call = as_call(events)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not call:  # reassert(): a call of no records, whose group plans the settling
            self._groups.commit(PendingCall([], [], guard, None))
            return []
        # Encoded in the caller's thread: a record that cannot be encoded fails its own
        # call, before it joins a group.
        codec = reg._codec
        pending = PendingCall([(record_key(e), e) for e in call],
                              [codec.encode_as_read(e) for e in call], guard, restate)
        decisions = self._groups.commit(pending)[:len(events)]
        # Step 4: settle any key a refused record landed on meanwhile (ours or anyone's),
        # through the queue like every record of the term. The call is decided: this is
        # best-effort, never a reason to raise; what it leaves the next write settles.
        self._settle(guard)
        return decisions

    def _run_group(self, group: list[PendingCall], produced: Callable[[], None]) -> None:
        """Write the calls of one group (:class:`~registry.writes.GroupCommit`) in one
        write, and give each call its own answer. ``produced`` is called once the group's
        records are handed to the producer: the next group is then formed and written
        while this one is confirmed (its own thread; the log's lock is held only to fold
        and to plan, never across a round trip)."""
        reg = self.registry
        token = object()  # this group, as the owner of the checkpoint states it planned
        try:
            with reg._log.lock:
                # Step 1: settle refused keys first (compaction safety), once for the group,
                # from the image as now read. A job a group still in flight writes is left
                # to the next group: the image does not hold that group's records yet, and
                # a reassertion planned without them would land after them and undo them.
                busy = {s for subjects in self._in_flight.values() for s in subjects}
                pairs: list[tuple[str, Event]] = [
                    (k, e) for k, e in plan_reassertions(reg.image, self.epoch, self.contender)
                    if _subject(e) not in busy]
                # The group's checkpoint calls, and the next groups' while this one is in
                # flight, start from the state its restatements leave (fold rule 6: a
                # floored one raises the seq).
                group = self._assemble(group, token,
                                       restated_states(reg.image, pairs, reg._codec))
                if not group:
                    return
                spans: list[tuple[int, int]] = []
                encoded: dict[str, tuple[bytes, Event]] = {}
                for c in group:
                    spans.append((len(pairs), len(pairs) + len(c.pairs)))
                    pairs += c.pairs
                    encoded.update((e.event_id, enc)
                                   for (_, e), enc in zip(c.pairs, c.encoded, strict=True))
                self._in_flight[token] = {j for _, e in pairs
                                          if (j := _subject(e)) is not None}
            verdicts: list[tuple[Decision | None, tuple[str, ...]]] = []
            failure: RegistryError | None = None
            if not pairs:  # calls of no records with nothing left to settle
                for c in group:
                    c.decisions = []
                return
            stalls.point("write.planned", epoch=self.epoch, records=len(pairs))
            try:
                self._send(pairs, encoded=encoded, verdicts=verdicts, produced=produced)
            except RegistryError as e:
                failure = e
        finally:
            with reg._log.lock:  # decided (or failed): the image holds what it planned
                self._in_flight.pop(token, None)
                for job, (owner, _) in list(self._planned.items()):
                    if owner is token:
                        del self._planned[job]
        if failure is None:  # the group's write is in the log
            calls = [c for c in group if c.pairs]  # not the calls of no records (settling)
            if calls:
                self._metrics.observe_group(len(calls), sum(len(c.pairs) for c in calls))
        if len(verdicts) != len(pairs):  # nothing known of any record
            verdicts = [(None, ())] * len(pairs)
        # Each call's answer: its decisions once the fold decided all its records
        # (whatever became of the others), else the group's error with its own ids.
        for c, (start, end) in zip(group, spans, strict=True):
            mine = verdicts[start:end]
            if all(d is not None for d, _ in mine):
                c.decisions = [d for d, _ in mine]  # type: ignore[misc]
            else:
                assert failure is not None
                c.error = error_for_call(failure, tuple(i for _, ids in mine for i in ids))


    def _assemble(self, group: list[PendingCall], token: object,
                  restated: Mapping[str, object]) -> list[PendingCall]:
        """The calls of ``group`` that are sent, as they are sent: the write guard asked
        again now (a lease that ran out while a call waited for its group refuses it:
        nothing of it is sent), and each checkpoint call's state computed from the image
        as now read, the groups still in flight before it and the calls before it in the
        group (two checkpoint calls of one job in one group, or in overlapping groups, do
        not refuse each other). ``restated``: the states the group's restatements leave
        (:func:`~registry.fold.restated_states`), which it writes before its calls. A call
        refused here is answered here."""
        refusal: RegistryError | None = None
        if self._lease_guard is not None and any(c.guard for c in group):
            try:
                self._lease_guard()
            except RegistryError as e:
                refusal = e
        codec = self.registry._codec
        # Groups in flight planned these states; the image holds them once they are decided.
        states: dict[str, object] = {job: state for job, (_, state) in self._planned.items()}
        states.update(restated)
        sent: list[PendingCall] = []
        for c in group:
            if c.guard and refusal is not None:
                c.error = error_for_call(refusal, ())
                continue
            if c.restate is not None:
                try:
                    events = [c.restate(e, states) for _, e in c.pairs]
                    c.pairs = [(record_key(e), e) for e in events]
                    c.encoded = [codec.encode_as_read(e) for e in events]
                except RegistryError as e:
                    c.error = error_for_call(e, ())
                    continue
            sent.append(c)
        for job, state in states.items():
            if self._planned.get(job, (None, None))[1] is not state:
                self._planned[job] = (token, state)
        return sent

    def _settle(self, guard: bool) -> None:
        """After a decided call: if the image holds keys to settle, a call of no records
        through the group queue (its group plans the reassertions when it is assembled,
        as every group does). Best-effort: a refusal or a failure leaves them for the next
        write."""
        reg = self.registry
        if self._uncollected >= COLLECT_BATCH and self.fenced() is None:
            self._uncollected = 0
            self._writes.collect(plan_collection(reg.image))
        elif reg.image.unsettled and self.fenced() is None:
            # a job's records no state stands on go before anything of it is restated
            self._writes.collect(plan_collection(reg.image, first=True))
        if not reg.image.unsettled or self.fenced() is not None \
                or not plan_reassertions(reg.image, self.epoch, self.contender):
            return
        stalls.point("write.settling", epoch=self.epoch)
        try:
            self._groups.commit(PendingCall([], [], guard, None))
        except Exception as e:  # noqa: BLE001 - the call is decided: never "done, but"
            _log.info("term %d of %r: key(s) left unsettled for the next write (%s)",
                      self.epoch, self.contender, e)

    def _send(self, pairs: list[tuple[str, Event]], **kw: Any) -> list[Decision]:
        """Steps 2 and 3 (:meth:`registry.writes.TermWrites.send`): one decision per pair."""
        return self._writes.send(pairs, **kw)


class _Meter:
    """Times one write call and counts its outcome (``jobreg_writes_total``)."""

    __slots__ = ("metrics", "started")

    def __init__(self, metrics: ClientMetrics) -> None:
        self.metrics = metrics
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: object) -> None:
        seconds = time.perf_counter() - self.started
        outcome, reason = ("accepted", "") if error is None else _outcome_of(error)
        self.metrics.write(outcome, reason, seconds)


def _outcome_of(error: BaseException) -> tuple[str, str]:
    """The (outcome, reason) labels of a write call that raised ``error``."""
    if isinstance(error, Fenced):
        return "fenced", error.reason
    if isinstance(error, WriteRejected):
        return "refused", error.reason
    if isinstance(error, LeaseExpired):
        return "lease_expired", ""
    if isinstance(error, OutcomeUnknown):
        return "unknown", ""
    if isinstance(error, BrokerError):
        return "broker_error", ""
    return "error", type(error).__name__


def _failure_reason(name: object) -> dict[str, object]:
    # The writer decides whether the reason counts, by the fold's table, and records it.
    if not isinstance(name, str):
        raise ConfigError(f"a checkpoint failure reason is a name, not {name!r}")
    return {"failure_reason": name, "reason_counts": failure_reason_counts(name)}


def _subject(event: Event) -> str | None:
    """What a record of a term is about, for the group queue: a job's id, or
    ``leader/<component>`` for a component's leader information (ids hold no slash), or
    ``None``. A group plans no restatement of a subject a group in flight writes (issue 42,
    finding 2: planned from an image without that group's records, it would undo them)."""
    if isinstance(event, LeaderInformationPublished):
        return f"leader/{event.component}"
    return getattr(event, "job_id", None)
