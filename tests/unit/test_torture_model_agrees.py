"""The fault campaign's model of the documented rules (:mod:`registry.dev.torture.model`)
is a second reading of the README, and the campaign reports every record where it and the
fold disagree (``fold_disagrees``). A model that falls behind a rule change reports the
fold wrong on a campaign run whose timing happens to make the case: stop 56's CI did
(seed 7: a verbatim re-send of a checkpoint record, junk to its key since fold rule 1 was
reworked, then the leader's collection of that key, ``COLLECTED`` in the fold and
``QUARANTINED`` in a model that still took a copy for nothing). So the two are held to
each other here on every log the exhaustive checker writes, each compacted at every cut,
not on the logs a campaign's timing happens to write."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from registry.dev.exhaustive import NS, compacted_indices, histories, replay_history
from registry.dev.torture.model import NamespaceModel
from registry.fold import Delta
from registry.image import Image, LogRecord, Outcome


def _disagreements(log: Sequence[LogRecord]) -> list[str]:
    """Where the model and the fold differ on a record, as the campaign's checker compares
    them: accepted or not, quarantined or not, collected or not."""
    model, fold = NamespaceModel(NS), Delta(Image.empty(NS))
    out = []
    for r in log:
        m, f = model.apply(r.offset, r.key, r.value, r.timestamp), fold.replay(r)
        if m.outcome == "SKIPPED":
            continue
        ours = (m.outcome in ("ACCEPTED", "IGNORED"), m.outcome == "QUARANTINED",
                m.outcome == "COLLECTED")
        theirs = (f.accepted, f.outcome == Outcome.QUARANTINED,
                  f.outcome == Outcome.COLLECTED)
        if ours != theirs:
            out.append(f"offset {r.offset} {r.key!r}: the model {m.outcome} ({m.reason}), "
                       f"the fold {f.outcome} ({f.reason})")
    return out


def _every_cut(log: list[LogRecord]) -> list[list[LogRecord]]:
    keys = [r.key or b"" for r in log]
    tombstones = [r.value is None for r in log]
    return [log] + [[log[i] for i in compacted_indices(keys, tombstones, cut, len(log))]
                    for cut in range(1, len(log) + 1)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("alphabet", "depth"), [("ci", 3), ("ends", 3), ("copies", 4),
                                                 ("calls", 4)])
def test_the_campaigns_model_and_the_fold_agree_on_every_log_the_checker_writes(
        alphabet: str, depth: int) -> None:
    found: list[str] = []
    count = 0
    for ops, log in histories(depth, alphabet):
        count += 1
        for cut in _every_cut(log):
            diff = _disagreements(cut)
            if diff:
                found.append(f"{ops}: {diff[0]}")
                break
        if len(found) >= 5:
            break
    assert count > 500  # it explored
    assert not found, "\n".join(found)


def test_a_copy_of_the_checkpoint_record_the_state_stands_on_is_junk_to_the_model_too() -> None:
    """Stop 56's CI, as a log: the raw copy of an accepted checkpoint record under its key,
    the leader's restatement and then its collection of that key."""
    ops = (("claim", "jm-1", "current", False), ("write", "submit", "a", 1),
           ("raw", "CheckpointCompleted", "current", "leader", "a", "own", False),
           ("raw", "copy", "-", "-", "a", "same", True))
    log = replay_history(ops, "copies")
    assert any(r.value is None for r in log)  # the leader collected the copied key
    assert _disagreements(log) == []


def test_a_refused_member_reusing_an_accepted_records_id_and_key_forgets_only_itself() -> None:
    """The fifteenth read's G3: a call member with the id and key of an accepted record but
    other bytes (it names a call) is never remembered by rule 1; its refusal at the commit
    forgot the accepted record instead, and a verbatim copy of that record took effect a
    second time (a re-adopt after the release) where the model said DUPLICATE."""
    import dataclasses

    import registry.dev.exhaustive as ex
    from registry.events import CallCommitted, JobAdopted

    w = ex._World.empty()
    lead = w.actors["jm-1"]
    w.claim(lead, False)
    for cmd, job in (("submit", "a"), ("submit", "b"), ("cancel", "b")):
        w.client_write(lead, cmd, job, 1, jobs=2)
    common = dict(namespace=NS, epoch=lead.term, writer=lead.name, created_at=0)
    call = "22222222-2222-2222-2222-222222222222"
    adopt = JobAdopted(event_id="11111111-1111-1111-1111-111111111111", job_id="a", **common)
    lock_a = f"{NS}/job/a/lock"
    value, read = ex._CODEC.encode_as_read(adopt)
    w.append(lock_a, value, read, False)  # accepted, remembered
    members = (dataclasses.replace(adopt, call_id=call),  # same id and key, other bytes
               JobAdopted(event_id="33333333-3333-3333-3333-333333333333", job_id="b",
                          call_id=call, **common))  # b is cancelled: sinks the call
    for key, e in ((lock_a, members[0]), (f"{NS}/job/b/lock", members[1]),
                   (f"{NS}/call/{call}", CallCommitted(event_id=call, size=2, **common))):
        v, r = ex._CODEC.encode_as_read(e)
        w.append(key, v, r, False)
    ex._settle_after(w)
    w.client_write(lead, "release", "a", 1, jobs=2)
    w.append(lock_a, value, read, False)  # a verbatim copy of the accepted adopt
    log = [r.log_record() for r in w.log]
    assert _disagreements(log) == []
    decisions = []
    fold = Delta(Image.empty(NS))
    for r in log:
        decisions.append(fold.replay(r))
    assert decisions[-1].outcome == Outcome.DUPLICATE
