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
