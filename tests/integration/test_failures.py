"""Writes whose fate is unknown are resolved by reading the log, never by guessing."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from registry import EmbeddedBroker, OutcomeUnknown, Registry, WriteRejected

pytestmark = pytest.mark.integration


@pytest.mark.embedded_only("freezes a broker of its own with SIGSTOP")
def test_a_write_during_a_broker_freeze_is_resolved_from_the_log() -> None:
    """The broker freezes (SIGSTOP) during a fenced submit, longer than the client's timeout.

    Whatever the call reported, the log afterwards holds the job at most once,
    a retry of the same submit cannot add it twice, and every client agrees.
    """
    with EmbeddedBroker() as broker:
        reg = Registry.connect(broker.bootstrap, "frozen", timeout=1.5)
        term = reg.claim_leadership("jm-1")
        term.submit("before", b"g")
        os.kill(broker.pid, signal.SIGSTOP)
        thawed = threading.Timer(2.5, os.kill, (broker.pid, signal.SIGCONT))
        thawed.start()
        try:
            try:
                outcome = ("accepted", term.submit("during", b"g"))
            except OutcomeUnknown as e:
                outcome = ("unknown", e.event_ids)
        finally:
            thawed.join()
            os.kill(broker.pid, signal.SIGCONT)
        # Ask the log, then retry the same command: at most one submit of the job is accepted.
        try:
            term.submit("during", b"g")
        except WriteRejected as e:
            assert e.reason == "job_exists"  # the first attempt had landed after all
        timeline = reg.timeline("during")
        accepted = [d for d in timeline if d.accepted and d.event_type == "JobSubmitted"]
        assert len(accepted) == 1
        # a re-sent copy of the first attempt, if any, was folded as a duplicate
        assert all(d.event_id != accepted[0].event_id for d in timeline
                   if d.event_type == "JobSubmitted" and not d.accepted and d.reason != "duplicate")
        assert not reg.sync().unsettled  # the leader settled every refused key
        if outcome[0] == "accepted":
            assert accepted[0].event_id == outcome[1].event_id
        assert set(reg.jobs()) == {"before", "during"}
        fresh = Registry.connect(broker.bootstrap, "frozen")
        assert fresh.sync() == reg.sync()
        for r in (reg, fresh):
            r.close()
