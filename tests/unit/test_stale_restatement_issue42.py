"""A restatement carrying an older checkpoint state than the fold's undoes acknowledged
checkpoint records (issue 42, finding 2: "a reassertion cannot undo a newer accepted
record").

``rules._restated_checkpoints`` takes a reassertion's carried checkpoint state when it is
newer in ``seq`` or when its ids are not older than the fold's. A restatement planned before
a checkpoint record that landed first (a group planned while the one before it is in flight,
``max_in_flight`` > 1), or a raw one of the current term, carries the state before that
record: its ``seq`` is older, its ids are the same (a failure or a discard of a pending
checkpoint adds no id). It is accepted, and the acknowledged failure (the budget's count) or
discard is undone: checkpoint 1 is pending again, so a later completion of it is accepted,
in the full fold, with nothing left for the leader to settle.

Why the ids clause is there: after the cleaner, a checkpoint record the full fold refused
(``checkpoint_state_mismatch``, ``checkpoint_id_not_increasing``) is taken as carrying the
state (rule 6's jump) with the ``seq`` its writer gave it, one above the fold's; the leader's
restatement after it carries the fold's ``seq``, one lower, and must win (the exhaustive
checker finds that class, ``CheckpointTriggered checkpoint_id_not_increasing -> ACCEPTED``,
as soon as the clause is dropped). A fix must tell the two apart: for example the leader's
restatement carrying a ``seq`` at least that of every refused record on the key.
"""

from __future__ import annotations

import pytest
from support.model import NS, checkpoint_event

from registry.events import (
    CheckpointDiscarded,
    CheckpointFailed,
    CheckpointTriggered,
    InlineGraph,
    JobReasserted,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold
from registry.image import LogRecord
from registry.keys import checkpoints_key, record_key
from registry.wire import default_codec

CODEC = default_codec()


def _common() -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1", created_at=0)


@pytest.mark.xfail(strict=True, reason="open: rules._restated_checkpoints takes a state older "
                   "in seq whose ids are not older (see the module docstring)")
@pytest.mark.parametrize("kind", [CheckpointFailed, CheckpointDiscarded])
def test_a_stale_restatement_does_not_undo_an_acknowledged_checkpoint_record(kind) -> None:
    records: list[LogRecord] = []

    def put(event, key: str | None = None) -> None:
        records.append(LogRecord(len(records), (key or record_key(event)).encode(),
                                 CODEC.encode(event), 1_000_000))

    put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=1, **_common()))
    put(JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **_common()))
    put(checkpoint_event(fold(records, NS).jobs["a"], CheckpointTriggered, 1, _common()))
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
