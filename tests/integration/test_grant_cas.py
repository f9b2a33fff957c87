"""Fold rule 3 through real elections (issue 42, finding 3): a grant is a compare-and-set on
the term's renewals, so a contender whose read came before the leader's renewal loses, and
the leader, which renewed, keeps its term. On the embedded broker and on Apache Kafka.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from registry import Registry, stalls
from registry.errors import BrokerError, ClaimRejected, ElectionCancelled, OutcomeUnknown
from registry.image import Decision
from registry.log import WriteFailed

pytestmark = pytest.mark.integration

LEASE = 2.0


def connect(broker, topic: str, namespace: str) -> Registry:
    for attempt in range(3):  # a broker just started may not answer within the timeout yet
        try:
            return Registry.connect(broker.bootstrap, namespace, topic=topic,
                                    timeout=LEASE / 2)
        except BrokerError:
            if attempt == 2:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def test_the_write_path_never_re_sends_a_renewal(broker, topic) -> None:
    """A renewal whose write failed is not re-sent (a copy landing before a grant and one
    after it would share a key: fold rule 3 and the cleaner); its call raises
    ``OutcomeUnknown`` and the renewer plans a new one. A job record is re-sent."""
    reg = connect(broker, topic, "resend")
    term = reg.claim_leadership("jm-1")
    writer = term._writes.writer
    assert writer is not None
    real_start, real_wait, starts = writer.start, writer.wait, []
    fail: list[bool] = []
    lost = object()

    def start(records):  # a write that never reaches the broker, and says nothing
        starts.append([k for k, _ in records])
        if fail:
            fail.clear()
            return lost
        return real_start(records)

    def wait(sending):
        if sending is lost:
            raise WriteFailed("planted: no answer", fatal=False)
        return real_wait(sending)

    writer.start, writer.wait = start, wait  # type: ignore[method-assign]
    fail.append(True)
    term.submit("job", b"g")  # the first write fails, the re-sent copy lands
    # (a submit lies under a key of its own, its birth key: re-sent as a fresh event under a
    # fresh birth key of the same job, never the same key twice)
    assert len(starts) == 2 and starts[0] != starts[1]
    assert [k.rsplit("/", 1)[0] for k in starts[0]] == [k.rsplit("/", 1)[0] for k in starts[1]]
    starts.clear()
    fail.append(True)
    with pytest.raises(OutcomeUnknown, match="not re-sent"):
        term.renew_lease()
    assert len(starts) == 1  # nothing was sent again
    term.renew_lease()  # the next one: a new ordinal (2), keys of its own (attempts 1)
    renewals = [d for d in reg.forensics().decisions() if d.event_type == "LeaseRenewed"]
    assert [d.key for d in renewals if d.accepted][-1] == "resend/term/1/lease/1/0"
    reg.close()


class _Gates:
    """Several :class:`~registry.stalls.Gate` s as one controller."""

    def __init__(self, *gates: stalls.Gate) -> None:
        self.gates = gates

    def __call__(self, name: str, **detail: Any) -> None:
        for gate in self.gates:
            gate(name, **detail)

    def open(self) -> None:
        for gate in self.gates:
            gate.open()


def _wait_for(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def _acquire(election, into: list[object]) -> None:
    with contextlib.suppress(ElectionCancelled):
        into.append(election.acquire())


def test_a_renewal_between_a_contenders_read_and_its_grant_makes_the_grant_fail(
        broker, topic) -> None:
    """The leader's renewer stalls for longer than the lease (a GC pause, a descheduled
    thread), so the standby decides to claim; it is held after its read and before its
    grant, the leader renews meanwhile, and then the grant is sent. The fold refuses it
    (``renewed_since``), the standby counts that as progress, the leader keeps its term
    while it renews, and the standby takes over only after a full silent lease."""
    a, b, c = (connect(broker, topic, "cas") for _ in range(3))
    renewing = stalls.Gate("election.renewing",  # the leader's third renewal
                           when=lambda **d: d["contender"] == "jm-a" and d["renewal"] == 3)
    claiming = stalls.Gate("election.claiming", when=lambda **d: d["contender"] == "jm-b")
    revoked: list[object] = []
    renewed: list[float] = []
    with stalls.installed(_Gates(renewing, claiming)):
        lead = a.elect("jm-a", lease=LEASE, on_revoked=revoked.append,
                       on_renewed=lambda _t: renewed.append(time.monotonic()))
        lead.acquire(timeout=LEASE * 10)
        standby = b.elect("jm-b", lease=LEASE)
        won: list[object] = []
        runner = threading.Thread(target=_acquire, args=(standby, won), daemon=True)
        runner.start()
        try:
            renewing.wait_reached(LEASE * 2)   # the leader's renewer is stalled ...
            claiming.wait_reached(LEASE * 5)   # ... so the standby decided to claim: held
            saw = claiming.details[0]["saw_renewal"]
            assert saw == 2 and c.sync().term.renewal == saw
            renewing.open()                    # the leader renews (after reading the log)
            _wait_for("the leader's renewal after the standby's read",
                      lambda: c.sync().term.renewal > saw, LEASE * 3)
            claiming.open()                    # now the standby's grant is sent
            refused: Decision = _wait_for(
                "the standby's grant refused renewed_since",
                lambda: next((d for d in c.sync().rejected
                              if d.event_type == "LeadershipGranted"), None), LEASE * 3)
            assert (refused.reason, refused.writer, refused.actual_epoch) == \
                ("renewed_since", "jm-b", saw)
            assert refused.expected_epoch is not None and refused.expected_epoch > saw
            # The leader goes on renewing and keeps its term; the standby waits.
            time.sleep(LEASE * 2.5)
            image = c.sync()
            assert (image.epoch, image.leader, image.revoked) == (1, "jm-a", False)
            assert not won and not revoked and lead.is_leader and lead.valid_for() > 0
            assert [d.reason for d in image.rejected] == ["renewed_since"]
            # The leader dies silently: the standby takes over after a full silent lease.
            lead._cancelled.set()
            lead._renewer.join(LEASE)
            runner.join(LEASE * 5)
            assert won and won[0].epoch == 2
            assert standby.claim_started - renewed[-1] >= LEASE - 0.25, \
                "the standby took over before a full lease had passed without a renewal"
            assert not revoked  # the leader never learnt of a loss while it renewed
        finally:
            standby.cancel(revoke=True)
            lead.cancel()
    for r in (a, b, c):
        r.close()


def test_an_external_claim_compares_the_epoch_only(broker, topic) -> None:
    """``claim_leadership`` (ZooKeeper, Kubernetes chose the contender) sends no
    ``saw_renewal``: it replaces a renewing leader, as before."""
    a, b = connect(broker, topic, "ext"), connect(broker, topic, "ext")
    lead = a.elect("jm-a", lease=LEASE)
    lead.acquire(timeout=LEASE * 10)
    try:
        _wait_for("a renewal", lambda: a.sync().term.renewal >= 1, LEASE * 2)
        term = b.claim_leadership("jm-x", lease_ms=2000)
        assert term.epoch == 2 and b.leader().contender == "jm-x"
        grant = [d for d in b.forensics().decisions() if d.event_type == "LeadershipGranted"]
        assert [d.outcome for d in grant] == ["ACCEPTED", "ACCEPTED"]
    finally:
        lead.cancel()
    for r in (a, b):
        r.close()


def test_a_claim_from_a_stale_image_is_refused_renewed_since(broker, topic) -> None:
    """The client's claim path: a grant from an image the leader renewed after raises
    :class:`~registry.errors.ClaimRejected` with ``renewed_since``; the renewals' keys
    follow the refused attempt (``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>``)."""
    a, b = connect(broker, topic, "stale"), connect(broker, topic, "stale")
    lead = a.elect("jm-a", lease=LEASE)
    lead.acquire(timeout=LEASE * 10)
    try:
        image = b.sync()
        saw = image.term.renewal
        _wait_for("a renewal after the read", lambda: a.sync().term.renewal > saw, LEASE * 2)
        with pytest.raises(ClaimRejected) as refused:
            b._claim_leadership("jm-b", 2000, image, saw_renewal=saw)
        assert refused.value.reason == "renewed_since"
        assert b.sync().term.refused_grants == 1 and b.leader().contender == "jm-a"
        before = a.sync().term.renewal
        _wait_for("a renewal after the refusal", lambda: a.sync().term.renewal > before + 1,
                  LEASE * 2)
        keys = [d.key for d in b.forensics().decisions() if d.event_type == "LeaseRenewed"]
        assert all(k.startswith("stale/term/1/lease/") for k in keys)
        assert {k.split("/")[4] for k in keys} == {"0", "1"}  # renewals moved on after it
    finally:
        lead.cancel()
    for r in (a, b):
        r.close()
