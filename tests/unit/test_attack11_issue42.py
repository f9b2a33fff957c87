"""The eleventh adversarial read of issue 42 (a helper who did not write the code), its
findings in the fold, each a failing test first, in the bounded checker's ops (every legal
cut at every prefix, every batch split: :func:`check_history`) and at every cut by hand:

- **A1, a dirty result's graph lost.** Junk over a live job's birth key makes the birth due;
  an end landing before the leader restated it (the leader's own cancel, planned from an
  image that had not read the junk: a raw record of the current term) ended the job with the
  graph of the superseded submit and named no record that holds it: the due birth was
  dropped (the job no longer live) and no end was due. A log cleaned past the junk read the
  result without its graph. Now such an end is due from the start, restated whole (graph and
  checkpoints) under a new end key (rule 5, ``Delta._ended``).
- **A2, a cancelled job lost.** The same junk, then the client's re-send of the submit (a
  fresh birth key, refused ``job_exists``) and the end: the leader removes the refused
  re-send (an ABSENT reassertion there, with no ``job_exists`` reason since the job is no
  longer live). In a log cleaned past the junk the re-send reads as the birth, and the
  removal deleted the terminal job: its id unknown, submittable again. Now a removal under a
  birth key never makes a terminal job unknown: the birth is gone, and a dirty result's end
  is due (its graph lay there).
- **A3, junk over a call's commit key.** Garbage over ``<ns>/call/<id>`` after a committed
  ``submit_many`` superseded the commit; nothing was due, and a log cleaned past the junk
  left the members waiting for a commit that is gone: both acknowledged jobs lost. Now a
  record over a committed call's key that is not the commit makes every part of a job an
  accepted member holds due, as junk on the member's own key would (rule 8,
  ``Delta._note_call_keys``; ``Image.call_members`` keeps which keys stand on which commit).

Both A1 and A2 are found by the checker itself below a live job (the tests at the end, on
the rules before the fixes), which no test explored before: the ``ends`` alphabet went only
below a cancelled job, and the ``ci`` alphabet has one raw record per history. A3 is found by
the checker below a committed call (the ``calls`` alphabet, junk over the newest commit's key:
``test_the_checker_finds_a3_when_it_is_put_back``), which no alphabet wrote before.
"""

from __future__ import annotations

import pytest

from registry.dev.exhaustive import (
    NS,
    check_history,
    compacted_indices,
    explore,
    format_report,
    only_junk_classes,
    replay_history,
)
from registry.fold import fold

C = ("claim", "jm-1", "current", False)
LIVE = [C, ("write", "submit", "a", 1)]
JUNK_OVER_BIRTH = ("raw", "garbage", "-", "-", "a", "birth", False)
LEADERS_OWN_CANCEL = ("raw", "JobCancelled", "current", "leader", "a", "own", True)

A1 = [*LIVE, JUNK_OVER_BIRTH, LEADERS_OWN_CANCEL]
A2 = [*LIVE, JUNK_OVER_BIRTH, ("dup", 0, False), LEADERS_OWN_CANCEL]


def _every_cut(ops, alphabet="ends"):
    log = replay_history(ops, alphabet)
    full = fold(log, NS)
    assert not full.unsettled, full.unsettled
    keys, dead = [r.key for r in log], [r.value is None for r in log]
    for cut in range(len(log) + 1):
        kept = [log[i] for i in compacted_indices(keys, dead, cut, len(log))]
        yield cut, full, fold(kept, NS)


@pytest.mark.parametrize("ops", [A1, A2], ids=["A1", "A2"])
def test_the_checker_finds_no_answer_class(ops) -> None:
    report = check_history(ops, "ends")
    assert not {k for k in report.failures if k[0] in ("answer", "batch")}, \
        format_report(report)


def test_a1_a_dirty_result_keeps_its_graph_in_every_compacted_log() -> None:
    for cut, full, compacted in _every_cut(A1):
        assert full.jobs["a"].dirty and full.jobs["a"].graph is not None
        assert compacted.jobs["a"] == full.jobs["a"], cut


def test_a2_a_cancelled_job_is_never_made_unknown() -> None:
    for cut, full, compacted in _every_cut(A2):
        assert full.jobs["a"].status == "CANCELLED"
        assert compacted.jobs.get("a") == full.jobs["a"], cut


@pytest.mark.parametrize("depth, below", [(4, LIVE), (5, [*LIVE, JUNK_OVER_BIRTH])],
                         ids=["live-4", "junk-over-the-birth-5"])
def test_below_a_live_job_no_answer_class(depth, below) -> None:
    """Every history of the ``ends`` alphabet below a live job, of up to 4 ops, and of up to
    5 below junk over its birth (where the checker finds A1 and A2 on the rules before their
    fixes; about 10 s together): no answer or batch class; the verdict and path classes are
    junk over one of the job's keys (the README's table of refusals). All of depth 5 below a
    live job (``jobreg exhaustive --alphabet ends --depth 5 --below
    '[["claim","jm-1","current",false],["write","submit","a",1]]'``: 201,007 histories,
    1.96 million cuts, 252 s here) has none either."""
    report = explore(depth, "ends", below=below)
    print(format_report(report))
    assert report.histories > 1_000
    failed = only_junk_classes(report)
    assert failed is None, failed



A3 = [C, ("write", "submit_many", "a", 1)]
JUNK_OVER_CALL = ("raw", "garbage", "-", "-", "a", "call", True)


@pytest.mark.parametrize("between", [
    [], [("write", "cancel", "a", 1)], [("write", "trigger", "a", 1),
                                        ("write", "complete", "a", 1)],
    [("write", "recfail", "b", 1)], [("write", "adopt", "a", 1)],
], ids=["at-once", "cancelled", "checkpointed", "recovery-failed", "adopted"])
def test_a3_junk_over_a_calls_commit_never_loses_its_jobs(between) -> None:
    """Junk over a committed ``submit_many``'s commit key makes every part of a job an
    accepted member holds due (rule 8, ``Delta._note_call_keys``): once the leader settled,
    every cut of the log folds the jobs as the full log does (before the fix: both jobs
    waiting for a commit that is gone)."""
    ops = [*A3, *between, JUNK_OVER_CALL]
    for cut, full, compacted in _every_cut(ops, "calls"):
        assert set(full.jobs) == {"a", "b"}
        assert dict(compacted.jobs) == dict(full.jobs), cut
    report = check_history(ops, "calls")
    assert not {k for k in report.failures if k[0] in ("answer", "batch")}, \
        format_report(report)


def test_below_a_committed_call_no_answer_class() -> None:
    """Every history of the ``calls`` alphabet of up to 4 ops below a committed
    ``submit_many`` (3,016 histories, about 7 s): no answer or batch class, and every verdict
    or path class is junk (over the call's commit, the classes a re-sent call read as the
    births leaves). Depth 5 (``jobreg exhaustive --alphabet calls --depth 5 --below
    '[["claim","jm-1","current",false],["write","submit_many","a",1]]'``) has none either:
    the figures are in the module's docstring."""
    report = explore(4, "calls", below=[list(o) for o in A3])
    print(format_report(report))
    assert report.histories > 1_000
    failed = only_junk_classes(report)
    assert failed is None, failed


def test_the_checker_finds_a3_when_it_is_put_back(monkeypatch) -> None:
    """The rule put back (a record over a commit's key leaves nothing due), the checker
    reports A3 as an answer class: both members read PENDING after compaction."""
    from registry.rules import Delta

    monkeypatch.setattr(Delta, "_note_call_keys", lambda self, key, kind, decision: None)
    report = check_history([*A3, JUNK_OVER_CALL[:-1] + (False,)], "calls")
    assert {k[0] for k in report.failures} == {"answer"}, format_report(report)


def test_call_members_are_bounded_by_the_keys_and_survive_a_snapshot() -> None:
    """``Image.call_members`` holds one entry per member key whose newest record is an
    accepted member: however many calls adopt the same jobs (a recovery batch at every
    failover), two jobs keep four entries (their births and locks); a snapshot keeps them."""
    from registry.snapshot import decode_image, encode_image

    ops = [*A3, *[("write", "adopt_many", "a", 1)] * 5]
    image = fold(replay_history(ops, "calls"), NS)
    kinds = sorted(k.split("/")[3] for k in image.call_members)
    assert kinds == ["birth", "birth", "lock", "lock"], dict(image.call_members)
    assert len(set(image.call_members.values())) == 2  # the submit's commit, the last adopt's
    assert decode_image(encode_image(image)) == image
