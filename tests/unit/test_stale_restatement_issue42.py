"""A restatement carrying an older checkpoint state than the fold's undid acknowledged
checkpoint records (issue 42, finding 2: "a reassertion cannot undo a newer accepted
record"); fixed.

``rules._restated_checkpoints`` took a reassertion's carried checkpoint state when it was
newer in ``seq`` or when its ids were not older than the fold's. A restatement planned before
a checkpoint record that landed first (a group planned while the one before it is in flight,
``max_in_flight`` > 1), or a raw one of the current term, carries the state before that
record: its ``seq`` is older, its ids are the same (a failure or a discard of a pending
checkpoint adds no id). It was accepted, and the acknowledged failure (the budget's count) or
discard undone: checkpoint 1 pending again, so a later completion of it accepted, in the full
fold, with nothing left for the leader to settle.

Why the ids clause was there: after the cleaner, a checkpoint record the full fold refused
(``checkpoint_state_mismatch``, ``checkpoint_id_not_increasing``) is taken as carrying the
state (rule 6's jump) with the ``seq`` its writer gave it, one above the fold's; the leader's
restatement after it carried the fold's ``seq``, one lower, and had to win (the exhaustive
checker finds that class, ``CheckpointTriggered checkpoint_id_not_increasing -> ACCEPTED``,
as soon as the clause alone is dropped). The fix tells the two apart: a reassertion older in
``seq`` is stale, whatever its ids; and the leader's restatement carries a ``seq`` at least
that of every record of the job the fold did not take (``Image.checkpoint_floors``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from support.model import NS, checkpoint_event

from registry.dev.exhaustive import compacted_indices
from registry.events import (
    CheckpointDiscarded,
    CheckpointEvent,
    CheckpointFailed,
    CheckpointTriggered,
    InlineGraph,
    JobReasserted,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold, plan_reassertions
from registry.image import LogRecord
from registry.keys import checkpoints_key, record_key
from registry.wire import default_codec

CODEC = default_codec()


def _common() -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1", created_at=0)


def _triggered() -> tuple[list[LogRecord], Callable[..., None]]:
    """A log of a jobreg of layout 1 (checkpoint records under the job's one checkpoints
    key, where a stale restatement could supersede an accepted record): a grant, job a's
    submit, a trigger of checkpoint 1; and how to append."""
    records: list[LogRecord] = []

    def put(event, key: str | None = None) -> None:
        key = key or (checkpoints_key(NS, event.job_id) if isinstance(event, CheckpointEvent)
                      else record_key(event))
        records.append(LogRecord(len(records), key.encode(), CODEC.encode(event), 1_000_000))

    put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=1, **_common()))
    put(JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common()))
    put(checkpoint_event(fold(records, NS).jobs["a"], CheckpointTriggered, 1, _common()))
    return records, put


@pytest.mark.parametrize("kind", [CheckpointFailed, CheckpointDiscarded])
def test_a_stale_restatement_does_not_undo_an_acknowledged_checkpoint_record(kind) -> None:
    records, put = _triggered()
    planned = fold(records, NS).jobs["a"]  # what a restatement planned now carries
    put(checkpoint_event(planned, kind, 1, _common()))
    image = fold(records, NS)
    acknowledged = image.jobs["a"].checkpoints
    assert not image.rejected and 1 not in acknowledged.pending  # accepted: failed/discarded
    put(JobReasserted(job_id="a", status=planned.status, owner_epoch=planned.owner_epoch,
                      graph=planned.graph, checkpoints=planned.checkpoints, **_common()),
        checkpoints_key(NS, "a"))
    now = fold(records, NS)
    assert now.jobs["a"].checkpoints == acknowledged, (
        f"the stale restatement undid the acknowledged {kind.__name__}: "
        f"{acknowledged} -> {now.jobs['a'].checkpoints}")


def test_the_leaders_restatement_carries_the_seq_of_a_refused_record() -> None:
    """Why a stale restatement can be refused on ``seq`` alone: a trigger of an id not above
    the newest, refused ``checkpoint_id_not_increasing``, carries the next ``seq``; in a log
    the cleaner cleaned up to it (the records before it on the checkpoints key gone) it is
    taken as carrying the state (rule 6's jump). The leader's restatement after it carries
    that ``seq`` (``Image.checkpoint_floors``), so it wins there too; once it landed the
    floor is forgotten and the job continues from it."""
    records, put = _triggered()
    put(checkpoint_event(fold(records, NS).jobs["a"], CheckpointTriggered, 1, _common()))
    image = fold(records, NS)
    assert [d.reason for d in image.rejected] == ["checkpoint_id_not_increasing"]
    assert image.jobs["a"].checkpoints.seq == 1 and image.checkpoint_floors["a"] == 2
    ((key, restatement),) = plan_reassertions(image, 1, "jm-1")
    assert key == checkpoints_key(NS, "a") and restatement.checkpoints.seq == 2
    records.append(LogRecord(len(records), key.encode(), CODEC.encode(restatement),
                             1_000_000))
    full = fold(records, NS)
    assert not full.unsettled and "a" not in full.checkpoint_floors
    assert full.jobs["a"].checkpoints == dataclasses.replace(
        image.jobs["a"].checkpoints, seq=2)
    keys = [r.key for r in records]
    for cut in range(len(records) + 1):
        kept = compacted_indices(keys, [False] * len(records), cut, len(records))
        assert fold([records[i] for i in kept], NS).answer() == full.answer(), cut
