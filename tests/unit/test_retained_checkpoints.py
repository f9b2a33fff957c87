"""Retained checkpoints as Flink keeps them (issue 43, item 2; fold rule 6).

Flink's ``DefaultCompletedCheckpointStore`` keeps the newest ``state.checkpoints.num-retained``
completed checkpoints: after each add, ``CheckpointSubsumeHelper.subsume`` removes the oldest
while more than that many are left (2.3.0: it never removes the newest, nor the newest that is
not a savepoint; savepoints never reach the store, since ``CheckpointCoordinator
.completePendingCheckpoint`` adds a completed checkpoint only if ``!props.isSavepoint()``, so
for what the store holds that is "keep the newest N"). The count is the store's, fixed when
the JobMaster builds it (``createRecoveredCompletedCheckpointStore(jobId,
maxNumberOfCheckpointsToRetain, ...)``), and can differ between runs of one job. A
``CheckpointCompleted`` carries it (``retained``); the fold keeps that many, so a new leader
recovers what the old one's store held, whatever the cleaner removed.

:func:`flink_subsume` below is written from Flink's helper, not from jobreg's rule.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.model import encode_with
from test_checkpoint_keys_issue42 import Log as KeysLog

from registry.errors import ConfigError
from registry.events import (
    LAYOUT,
    CheckpointCompleted,
    CheckpointFailed,
    CheckpointState,
    CheckpointTriggered,
    InlineGraph,
    JobRestarted,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import (
    checkpoint_step,
    checkpoints_retained,
    fold,
)
from registry.image import LogRecord
from registry.keys import record_key
from registry.wire import default_codec

NS = "prod"
CODEC = default_codec()


def flink_subsume(store: deque[int], num_retain: int) -> list[int]:
    """Flink 2.3.0's ``CheckpointSubsumeHelper.subsume`` for a store of checkpoints (no
    savepoints): walk from the oldest, removing each that is not the newest, while more than
    ``num_retain`` are left. Returns the ids removed (what ``releaseAndTryRemove`` is asked)."""
    if not store or len(store) <= num_retain:
        return []
    latest = store[-1]
    removed = []
    for cp in list(store):
        if len(store) <= num_retain:
            break
        if cp != latest:
            store.remove(cp)
            removed.append(cp)
    return removed


def _common(epoch: int = 1) -> dict:
    return dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer="jm-1",
                created_at=0)


class Log(KeysLog):
    """The checkpoint-keys tests' log (its leader's settling, its legal cuts), with records
    written as the leader writes them."""

    def put(self, event, key: str | None = None, value: bytes | None = None) -> LogRecord:
        r = LogRecord(2 * len(self.records), (key or record_key(event)).encode(),
                      value or CODEC.encode(event), 1_000_000 + len(self.records))
        self.records.append(r)
        return r

    def state(self, job: str = "a"):
        return fold(self.records, NS).jobs[job].checkpoints

    def write(self, kind, cp: int, **payload) -> None:
        """A record as the leader writes it: the state after it by the fold's own rule."""
        view = fold(self.records, NS).jobs["a"]
        state, _ = checkpoint_step(view.checkpoints, kind, cp,
                                   location=payload.get("location", ""),
                                   retained=checkpoints_retained(payload.get("retained", 0),
                                                                 view.retained_checkpoints),
                                   failure_reason=payload.get("failure_reason",
                                                              "UNSPECIFIED"))
        self.put(kind(job_id="a", checkpoint_id=cp, state=state, **payload, **_common()))


def _submitted(retained: int = 1) -> Log:
    log = Log()
    log.put(LeadershipGranted(prev_epoch=0, saw_renewal=None, layout=LAYOUT, **_common()))
    log.put(JobSubmitted(job_id="a", graph=InlineGraph(b"g"), retained_checkpoints=retained,
                         **_common()))
    return log


def _ids(state) -> list[int]:
    return [c.checkpoint_id for c in state.retained]


@pytest.mark.parametrize("n", [1, 3])
def test_the_newest_n_survive_as_flinks_store_keeps_them(n: int) -> None:
    """Flink's store at N = 1 and N = 3 against the fold's retained checkpoints after each of
    six completions, and in every compacted log of the history."""
    log = _submitted()
    flink: deque[int] = deque()
    for cp in range(1, 7):
        log.write(CheckpointTriggered, cp)
        log.write(CheckpointCompleted, cp, location=f"loc-{cp}", retained=n)
        flink.append(cp)
        flink_subsume(flink, n)
        assert _ids(log.state()) == list(flink)
        assert [c.location for c in log.state().retained] == [f"loc-{i}" for i in flink]
    log.settle()
    full = fold(log.records, NS).answer()
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == full
        assert _ids(fold(compacted, NS).jobs["a"].checkpoints) == list(flink)


_OPS = st.lists(st.one_of(st.tuples(st.just("complete"), st.integers(0, 4)),
                          st.tuples(st.just("fail"), st.booleans()),
                          st.tuples(st.just("restart"), st.none())), max_size=12)


@given(submitted=st.integers(1, 3), ops=_OPS)
def test_any_history_keeps_what_flinks_store_keeps(submitted: int, ops) -> None:
    """Completions with counts that change between runs (0: the submit's), failures that
    count or not, and restarts, in any order: the fold's retained ids are the ones Flink's
    store holds after the same adds, at the end and in every compacted log."""
    log = _submitted(submitted)
    flink: deque[int] = deque()
    cp = 0
    for op, arg in ops:
        cp += 1
        if op == "restart":
            log.write(JobRestarted, log.state().last_completed)
            continue
        log.write(CheckpointTriggered, cp)
        if op == "fail":
            log.write(CheckpointFailed, cp, reason="declined",
                      failure_reason="CHECKPOINT_DECLINED" if arg else "JOB_FAILOVER_REGION")
            continue
        log.write(CheckpointCompleted, cp, location=f"loc-{cp}", retained=arg)
        flink.append(cp)
        flink_subsume(flink, arg or submitted)
        assert _ids(log.state()) == list(flink)
    log.settle()
    image = fold(log.records, NS)
    assert not image.rejected and _ids(image.jobs["a"].checkpoints) == list(flink)
    for compacted in log.cuts():
        assert fold(compacted, NS).answer() == image.answer()


def test_a_record_whose_state_kept_another_count_is_refused() -> None:
    """The count is the record's: a completion saying 3 whose state kept only 1 (a writer
    that ignored it) is refused, as any record whose state the fold does not compute."""
    log = _submitted()
    for cp in (1, 2):
        log.write(CheckpointTriggered, cp)
        log.write(CheckpointCompleted, cp, location=f"loc-{cp}", retained=3)
    log.write(CheckpointTriggered, 3)
    before = log.state()
    wrong, _ = checkpoint_step(before, CheckpointCompleted, 3, location="loc-3", retained=1)
    log.put(CheckpointCompleted(job_id="a", checkpoint_id=3, location="loc-3", retained=3,
                                state=wrong, **_common()))
    image = fold(log.records, NS)
    assert [d.reason for d in image.rejected] == ["checkpoint_state_mismatch"]
    assert _ids(image.jobs["a"].checkpoints) == [1, 2]


def test_a_record_of_the_schema_before_keeps_the_jobs_count() -> None:
    """A ``CheckpointCompleted`` of schema version 2 (no ``retained``, written before it
    existed) reads as 0, so the fold keeps the submit's ``retained_checkpoints``, as it did."""
    log = _submitted(retained=2)
    for cp in (1, 2, 3):
        log.write(CheckpointTriggered, cp)
        state, _ = checkpoint_step(log.state(), CheckpointCompleted, cp, location=f"l{cp}",
                                   retained=2)
        event = CheckpointCompleted(job_id="a", checkpoint_id=cp, location=f"l{cp}",
                                    state=state, **_common())
        log.put(event, value=encode_with(event, 23))  # CheckpointCompleted version 2
    image = fold(log.records, NS)
    assert not image.rejected and _ids(image.jobs["a"].checkpoints) == [2, 3]
    assert CODEC.decode(log.records[-1].value).retained == 0


def test_the_client_refuses_a_count_that_is_not_one() -> None:
    from registry.client import Term

    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ConfigError, match="retained is a count"):
            Term.checkpoint_completed(object.__new__(Term), "a", 1, "loc",  # type: ignore[arg-type]
                                      retained=bad)


def test_the_count_is_carried_in_the_record() -> None:
    event = CheckpointCompleted(job_id="a", checkpoint_id=1, location="l", retained=3,
                                state=CheckpointState(), **_common())
    assert CODEC.decode(CODEC.encode(event)).retained == 3
