"""One namespace's log as a client has folded it: the reader, the image, and the verdicts
its writers wait for.

:class:`~registry.client.Registry` reads through it and :mod:`registry.writes` (a term's
write protocol) reads its own records back through it; neither reaches into the other.
Every method that changes it runs under :attr:`FoldedLog.lock` (re-entrant), so a sync
and a write of the same client never fold at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .events import Event
from .fold import bulk, fold_batches
from .image import Decision, Image, LogRecord, Outcome
from .log import LogReader
from .metrics import ClientMetrics
from .wire import Codec

__all__ = ["FoldedLog"]


class FoldedLog:
    """A reader of one partition and the image of one namespace folded from it."""

    def __init__(self, reader: LogReader, namespace: str, codec: Codec,
                 metrics: ClientMetrics | None = None) -> None:
        self.reader = reader
        self.metrics = metrics
        """Where the fold's counts, the epoch and the lag are reported (``None``: nowhere)."""
        self.on_folded: Callable[[Image], None] | None = None
        """Called with the image after every fold (the client notes which terms lead)."""
        self.codec = codec
        self.lock = threading.RLock()
        self.image = Image.empty(namespace)
        """The image as last folded (no catching up; see :meth:`sync`)."""
        self.waiting: dict[str, Decision | None] = {}
        """Event ids whose verdict a writer waits for -> the verdict, once folded."""
        self.copies: dict[str, int] = {}
        """Event ids of :attr:`waiting` -> how many records of that id the fold decided
        (a duplicate included, a call's member once, when its call decides it)."""
        self._members: dict[int, Event] = {}  # rule 8: waiting call members, decoded once

    def fold(self, batches: Iterable[list[LogRecord]],
             known: dict[int, Event] | None = None) -> None:
        """Fold what the reader returned; ``known``: offset -> event of records this
        client just wrote (encoded from those events, so not decoded again)."""
        waiting, copies = self.waiting, self.copies

        def note(d: Decision) -> None:  # the fate of this client's own records
            # A record's verdict is the fold's decision on its first copy, unless a later
            # copy is accepted: fold rule 1 takes a verbatim copy of an accepted record for
            # a duplicate (no second effect) and decides a copy of a refused one by the
            # rules. A duplicate is no verdict, and neither is a member's PENDING: it may
            # still wait for its call's commit when a re-sent copy lands (fault campaign
            # seed 8024).
            if d.event_id not in waiting or d.outcome == Outcome.PENDING:
                return
            copies[d.event_id] = copies.get(d.event_id, 0) + 1
            if d.outcome == Outcome.DUPLICATE:
                return
            first = waiting[d.event_id]
            if first is None or (d.accepted and not first.accepted):
                waiting[d.event_id] = d

        metrics = self.metrics
        with self.lock, bulk():
            try:
                for batch in batches:  # one image per batch, so a failure keeps what was folded
                    before = self.image
                    self.image = fold_batches([batch], before, self.codec,
                                              note if waiting else None, known=known,
                                              members=self._members)
                    if metrics is not None:
                        _count(metrics, before, self.image)
            finally:
                if metrics is not None:
                    metrics.epoch.set(self.image.epoch)
                    metrics.log_lag.set(self.reader.lag())
                if self.on_folded is not None:
                    self.on_folded(self.image)

    def note_leading(self) -> None:
        """Call :attr:`on_folded` with the image as it is (a term was just granted)."""
        with self.lock:
            if self.on_folded is not None:
                self.on_folded(self.image)

    def sync(self, timeout: float) -> Image:
        """Fold every record committed before this call; return the image."""
        with self.lock:
            self.fold(self.reader.sync(timeout))
            return self.image

    def catch_up(self, timeout: float) -> None:
        """Fold to the end of the log; ``timeout`` bounds the time without progress."""
        with self.lock:
            self.fold(self.reader.read_to_end(timeout))

    def read_until(self, offset: int, timeout: float,
                   known: dict[int, Event] | None = None) -> None:
        """Fold until the record at ``offset`` (and the end after it) was read."""
        with self.lock:
            self.fold(self.reader.read_until(offset, timeout), known)

    def read_back(self, written: list[LogRecord], known: dict[int, Event],
                  timeout: float) -> None:
        """Fold records this client just wrote: as they are when nothing can lie before
        them and every reader can read them (:meth:`~registry.log.LogReader.take_own`),
        else by reading them back."""
        with self.lock:
            if self.reader.take_own(written):
                self.fold([written], known)
            else:
                self.read_until(written[-1].offset, timeout, known)

    def start_at(self, image: Image) -> None:
        """Continue from ``image`` (a snapshot's): read from the offset after it."""
        with self.lock:
            self.image = image
            self._members.clear()
            self.reader.seek(image.provenance.last_offset + 1)

    def close(self) -> None:
        """Leave the broker."""
        with self.lock:
            self.reader.close()


def _added(old: tuple[Decision, ...], new: tuple[Decision, ...]) -> tuple[Decision, ...]:
    """The decisions a fold step appended to one of the image's kept lists (which keep the
    newest :data:`~registry.rules.HISTORY_KEPT`: a step of more refusals than that reports
    the kept ones)."""
    if new is old:
        return ()
    if not old:
        return new
    last = old[-1]
    for i in range(len(new) - 1, -1, -1):
        if new[i] is last:  # the lists share the decisions they keep
            return new[i + 1:]
    return new


def _count(metrics: ClientMetrics, before: Image, after: Image) -> None:
    """Count the records one fold step refused, ignored and quarantined, each once: a
    record of this namespace that another client of the process (or this one, reading a
    span again) counted already is not counted again."""
    if after.rejected is before.rejected and after.ignored is before.ignored \
            and after.quarantined is before.quarantined:
        return  # the common step: every record accepted
    start = before.provenance.last_offset
    claimed = metrics.claim_folded(start, after.provenance.last_offset)
    if claimed >= after.provenance.last_offset:
        return

    def fresh(kept: tuple[Decision, ...]) -> tuple[Decision, ...] | list[Decision]:
        # A call refused at its commit refuses its earlier records too, at their offsets:
        # in a step counted whole they all count.
        return kept if claimed <= start else [d for d in kept if d.offset > claimed]

    for d in fresh(_added(before.rejected, after.rejected)):
        metrics.refused(d.reason or "")
    ignored = len(fresh(_added(before.ignored, after.ignored)))
    if ignored:
        metrics.ignored(ignored)
    for d in fresh(_added(before.quarantined, after.quarantined)):
        metrics.quarantined(d.reason or "")
