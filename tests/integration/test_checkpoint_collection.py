"""Checkpoint records under keys of their own, and the leader's collection of the ones no
state stands on (fold rule 6, layout 2), on a real broker (the embedded one, and Apache Kafka
when the suite runs there): the tombstones land, every reader folds them alike, and the log
keeps of a job's checkpoint records only the one its state stands on.

Why the keys are per record: on one checkpoints key, a stale record (one the fold refuses,
``stale_checkpoint_seq``) superseded the accepted record its refusal rested on, and once the
cleaner removed that record, it read as accepted (issue 42, the bounded checker's eight
checkpoint classes). Under a key of its own no record supersedes another; the leader removes
the refused ones first, then the ones a newer state superseded.
"""

from __future__ import annotations

import pytest

from registry.events import CheckpointEvent
from registry.keys import checkpoint_key, is_checkpoint_key
from registry.log import LogReader
from registry.wire import default_codec

pytestmark = pytest.mark.integration


def _records(broker, topic: str, partition: int) -> list:
    reader = LogReader(broker.bootstrap, topic, partition)
    try:
        return [r for batch in reader.read_to_end(10.0) for r in batch]
    finally:
        reader.close()


def test_a_term_collects_superseded_checkpoint_records_and_readers_agree(
        connect, broker, topic) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("a", b"graph")
    for cp in range(1, 6):
        term.checkpoint_triggered("a", cp)
        term.checkpoint_completed("a", cp, f"file:///chk-{cp}")
    term.reassert()  # an idle leader's settling: it collects everything due
    image = reg.sync()
    rec = image.checkpoint_records["a"]
    # Only the record the state stands on is left, and it is the newest completion's.
    assert [k for k, _ in rec.keys] == [rec.holder]
    assert image.jobs["a"].checkpoints.last_completed == 5
    codec = default_codec()
    records = _records(broker, topic, reg.partition)
    checkpoint_records = [r for r in records if r.key is not None and is_checkpoint_key(r.key)]
    values = [r for r in checkpoint_records if r.value is not None]
    tombstones = [r for r in checkpoint_records if r.value is None]
    # ten checkpoint records, each under its own key; nine of them collected
    assert len(values) == 10 and len({r.key for r in values}) == 10
    assert len(tombstones) == 9
    assert {r.key for r in tombstones} == {r.key for r in values} - {rec.holder.encode()}
    # each tombstone follows the record it removes
    first = {r.key: r.offset for r in values}
    assert all(first[t.key] < t.offset for t in tombstones)
    assert all(isinstance(codec.decode(r.value), CheckpointEvent) for r in values)
    # A fresh reader folds the same answer and the same records left.
    other = connect().sync()
    assert other.answer() == image.answer()
    assert other.checkpoint_records["a"] == rec


def test_the_fold_reads_the_leaders_tombstones_as_collections_not_as_quarantine(
        connect) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("a", b"graph")
    term.checkpoint_triggered("a", 1)
    term.checkpoint_completed("a", 1, "file:///chk-1")
    term.reassert()
    image = reg.sync()
    assert not image.quarantined, image.quarantined
    assert not image.unsettled
    holder = image.checkpoint_records["a"].holder
    assert holder is not None and holder.startswith(checkpoint_key("prod", "a", ""))
    # The leader's next records go on: ids increase, the state is the completion's.
    receipt = term.checkpoint_triggered("a", 2)
    assert receipt.offset > 0
    assert reg.sync().jobs["a"].checkpoints.newest_id == 2


def test_a_busy_term_collects_on_its_own(connect, broker, topic) -> None:
    """Without ``reassert()``: after ``COLLECT_BATCH`` checkpoint records the settling after
    a call collects what is due, so a job that checkpoints for ever keeps a bounded number
    of records in the log."""
    from registry.client import COLLECT_BATCH

    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.submit("a", b"graph")
    for cp in range(1, COLLECT_BATCH // 2 + 2):
        term.checkpoint_triggered("a", cp)
        term.checkpoint_completed("a", cp, f"file:///chk-{cp}")
    image = reg.sync()
    assert len(image.checkpoint_records["a"].keys) < COLLECT_BATCH // 2
    tombstones = [r for r in _records(broker, topic, reg.partition)
                  if r.key is not None and is_checkpoint_key(r.key) and r.value is None]
    assert len(tombstones) >= COLLECT_BATCH - 1
