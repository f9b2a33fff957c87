"""The demo's sentences about a write (``registry.dev.demo.fate``) say what happened to it:
the fold's verdict on its record when the log holds one, else whether the client sent it at
all, never one answer for both (issue 29 §2: "the late release and terminate were both
refused" when only one record reached the log)."""

from __future__ import annotations

from registry.dev.demo import fate
from registry.image import Decision, Outcome

REFUSED = Decision(offset=8, outcome=Outcome.REJECTED, event_type="JobLockReleased",
                   event_id="e-8", job_id="job-a", epoch=1, writer="jm-1", reason="stale_epoch")
ACCEPTED = Decision(offset=5, outcome=Outcome.ACCEPTED, event_type="JobAdopted", event_id="e-5",
                    job_id="job-a", epoch=2, writer="jm-2")
IGNORED = Decision(offset=13, outcome=Outcome.IGNORED, event_type="CheckpointFailed",
                   event_id="e-13", job_id="job", epoch=1, writer="jm-1",
                   detail="checkpoint 5 was discarded")
LOG = [ACCEPTED, REFUSED, IGNORED]
FENCED = {"ok": False, "error": "Fenced", "reason": "stale_epoch", "offset": None}


def test_a_write_refused_before_sending_never_reached_the_log() -> None:
    assert fate({**FENCED, "event_ids": []}, LOG) == \
        "refused by its own client before sending (stale_epoch): it never reached the log"


def test_a_write_sent_that_the_log_does_not_hold_is_said_so() -> None:
    assert fate({**FENCED, "event_ids": ["e-lost"]}, LOG) == \
        "sent, but the log never held it (its client answered Fenced: stale_epoch)"


def test_a_record_the_fold_refused_is_named_with_its_offset() -> None:
    # found by the event id the client sent, or by the offset the rejection names
    assert fate({**FENCED, "event_ids": ["e-8"]}, LOG) == \
        "refused by the fold at offset 8 (stale_epoch)"
    assert fate({**FENCED, "offset": 8, "event_ids": ["e-8"]}, LOG) == \
        "refused by the fold at offset 8 (stale_epoch)"


def test_a_raw_write_is_told_by_the_folds_verdict_on_its_offset() -> None:
    assert fate({"ok": True, "offset": 8}, LOG) == "refused by the fold at offset 8 (stale_epoch)"
    assert fate({"ok": True, "offset": 5}, LOG) == "accepted at offset 5"


def test_an_accepted_or_ignored_write_says_so() -> None:
    assert fate({"ok": True, "offset": 5, "epoch": 2, "ignored": None}, LOG) == \
        "accepted at offset 5"
    assert fate({"ok": True, "offset": 13, "ignored": "checkpoint 5 was discarded"}, LOG) == \
        "ignored by the fold at offset 13 (checkpoint 5 was discarded)"


def test_a_record_that_landed_although_the_client_raised_says_both() -> None:
    unknown = {"ok": False, "error": "OutcomeUnknown", "reason": None, "offset": None,
               "event_ids": ["e-5"]}
    assert fate(unknown, LOG) == "accepted at offset 5 (its client answered OutcomeUnknown)"
