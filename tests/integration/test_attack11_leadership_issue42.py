"""The eleventh adversarial read of issue 42 (a helper who did not write the code), its three
findings in leadership, each a failing test first (on a real broker, the session's):

- **B1, a stale lease line** (two JVMs leading at once). The Flink bridge told its JVM how long
  its lease was valid *from now* (``valid_for_ms``), and the JVM counted it from the line's
  receipt: a line held on its way (a full pipe, the bridge descheduled or stopped) extended
  the JVM's belief by the delay, past a standby's grant. Now every ``granted`` and ``lease``
  line also carries the lease's end as absolute deadlines (``deadline_mono_ns`` on the
  host's ``CLOCK_MONOTONIC``, which ``System.nanoTime()`` reads; ``deadline_wall_ms``), and
  the JVM takes the earliest (``JobregLeaderElectionDriver.takeLease``).
- **B2, a host suspend.** The lease clock was ``time.monotonic`` (``CLOCK_MONOTONIC``), which
  stops while the host is suspended: a leader resumed after more than a lease still said it
  certainly led (and renewed without reading the log) while the standby led. The lease
  clock is now ``CLOCK_BOOTTIME`` (:func:`registry.election.lease_clock`), and the JVM also
  checks the wall-clock deadline (the wall clock counts a suspend).
- **B3, no leader at all.** ``Term.revoke()`` marks the term given up before its write; when
  the write failed (a lapsed lease, an unknown outcome) the renewer kept renewing the term for
  ever: the process said it did not lead, the log said it did, and no standby was granted.
  Now a given-up term is never renewed again: its lease runs out and a standby takes over.

Deterministic: stall gates, an injected clock, a held pipe; no timing margin.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from registry import stalls
from registry.election import Election, lease_clock
from registry.errors import ElectionTimeout, LeaseExpired
from registry.flink_bridge import Bridge

pytestmark = pytest.mark.integration


class Stepped:
    """A lease clock a test steps forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return lease_clock() + self.offset


def test_b3_a_term_given_up_is_never_renewed_even_when_its_revoke_failed(connect) -> None:
    # (a lease of seconds, and the timeout at most half of it: stop 56's CI, loaded, took
    # more than a 0.5 s timeout to read the topic's partitions at connect)
    lease = 6.0
    reg_a, reg_b = connect("resign", timeout=3.0), connect("resign", timeout=3.0)
    clock = Stepped()
    ea = reg_a.elect("jm-a", lease, clock=clock)
    term = ea.acquire(timeout=30)
    gate = stalls.Gate("election.renewing", when=lambda contender, **_: contender == "jm-a")
    with stalls.installed(gate):
        gate.wait_reached()
        clock.offset += lease  # the lease lapsed on A's clock (a disconnect, a pause)
        with pytest.raises(LeaseExpired):
            term.revoke("stepping down")  # given up; the revoke is refused by the guard
        assert term.resigned and ea.valid_for() == 0
        gate.open()
    eb = reg_b.elect("jm-b", lease)
    got: list = []

    def contend() -> None:
        with contextlib.suppress(ElectionTimeout):
            got.append(eb.acquire(timeout=30 * lease))

    tb = threading.Thread(target=contend, daemon=True)
    tb.start()
    tb.join(60 * lease)
    try:
        image = reg_b.sync()
        assert got, (f"no leader: A gave its term {term.epoch} up, yet it is renewed "
                     f"({image.term.renewals if image.term else None} renewals) and B was "
                     "never granted")
        assert image.epoch == term.epoch + 1 and image.leader == "jm-b"
        assert ea._lost.is_set() and ea.valid_for() == 0
    finally:
        eb.cancel()
        ea.cancel()


class Host:
    """The clocks of a host that is suspended and resumed: ``boottime`` runs through the
    suspend (the lease clock now), ``monotonic`` stops (the lease clock before B2's fix)."""

    def __init__(self) -> None:
        self._lost = 0.0
        self._since: float | None = None

    def boottime(self) -> float:
        return lease_clock()

    def monotonic(self) -> float:
        now = lease_clock()
        return (self._since if self._since is not None else now) - self._lost

    def suspend(self) -> None:
        self._since = lease_clock()

    def resume(self) -> None:
        assert self._since is not None
        self._lost += lease_clock() - self._since
        self._since = None


def test_b2_the_lease_clock_counts_a_suspend_of_the_host() -> None:
    import inspect

    for default in (inspect.signature(Election).parameters["clock"].default,
                    inspect.signature(Bridge).parameters["clock"].default):
        assert default is lease_clock
    if hasattr(time, "CLOCK_BOOTTIME"):
        a = time.clock_gettime(time.CLOCK_BOOTTIME)
        b = lease_clock()
        c = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert a <= b <= c


@pytest.mark.parametrize("clock", ["boottime", "monotonic"])
def test_b2_a_leader_resumed_from_a_suspend_does_not_say_it_leads(connect, clock) -> None:
    """The suspend modelled: the leader's renewer is held (a suspended host runs no thread)
    while the standby waits out a silent lease and is granted; then the host resumes. On the
    lease clock (``boottime``) the resumed leader's lease has run out: it says it does not
    lead and reads the log before it sends anything. On ``CLOCK_MONOTONIC`` (the clock
    before the fix) it says it certainly leads beside the standby: the finding."""
    lease = 2.0
    reg_a, reg_b = connect("susp", timeout=1.0), connect("susp", timeout=1.0)
    host = Host()
    ea = reg_a.elect("jm-a", lease, clock=getattr(host, clock))
    ea.acquire(timeout=30)
    eb = reg_b.elect("jm-b", lease)
    got_b: list = []
    tb = threading.Thread(target=lambda: got_b.append(eb.acquire(timeout=60)), daemon=True)
    gate = stalls.Gate("election.renewing", when=lambda contender, **_: contender == "jm-a")
    try:
        with stalls.installed(gate):
            tb.start()
            gate.wait_reached()  # A's renewer is about to renew, and the host is suspended
            host.suspend()
            tb.join(60)
            assert got_b and eb.valid_for() > 0, "B was not granted"
            host.resume()
            both = ea.valid_for() > 0 and eb.valid_for() > 0
            assert both == (clock == "monotonic"), (ea.valid_for(), eb.valid_for())
    finally:
        gate.open()
        eb.cancel()
        ea.cancel()


class HeldPipe:
    """A bridge's stdout as its JVM reads it: each line with the ``CLOCK_MONOTONIC`` time of
    its receipt (the JVM's ``System.nanoTime()`` on the same host). The first ``lease``
    line's write blocks until :attr:`release` is set (a full pipe, a stopped bridge)."""

    def __init__(self, hold_lease: bool = False) -> None:
        self.lines: list[tuple[int, dict]] = []
        self.cond = threading.Condition()
        self.hold_lease = hold_lease
        self.holding = threading.Event()
        self.release = threading.Event()

    def write(self, line: str) -> int:
        msg = json.loads(line)
        if self.hold_lease and msg.get("event") == "lease":
            self.hold_lease = False
            self.holding.set()
            self.release.wait(60)
        with self.cond:
            self.lines.append((time.monotonic_ns(), msg))
            self.cond.notify_all()
        return len(line)

    def flush(self) -> None:
        pass

    def event(self, kind: str, timeout: float = 60.0) -> tuple[int, dict]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for t, m in self.lines:
                    if m.get("event") == kind:
                        return t, m
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind!r} line; lines: {self.lines}"
                self.cond.wait(left)


def jvm_deadline_ns(received_ns: int, line: dict) -> int:
    """``JobregLeaderElectionDriver.takeLease`` on ``CLOCK_MONOTONIC``: ``valid_for_ms`` from
    the receipt, never past ``deadline_mono_ns`` (the wall-clock deadline is the same end on
    the wall clock: checked for agreement below)."""
    deadline = received_ns + line["valid_for_ms"] * 1_000_000
    if line.get("deadline_mono_ns") is not None:
        deadline = min(deadline, line["deadline_mono_ns"])
    return deadline


def test_b1_a_lease_line_held_on_its_way_never_outlives_a_standbys_grant(connect) -> None:
    lease = 2.0
    reg_a, reg_b = connect("br", timeout=1.0), connect("br", timeout=1.0)
    out_a, out_b = HeldPipe(hold_lease=True), HeldPipe()
    a = Bridge(reg_a, "jm-a", lease, out=out_a)
    b = Bridge(reg_b, "jm-b", lease, out=out_b)
    stop = threading.Event()

    def beat() -> None:  # both JVMs alive: their `alive` lines
        while not stop.is_set():
            a._last_heard, b._last_heard = a._clock(), b._clock()
            stop.wait(0.05)

    threading.Thread(target=beat, daemon=True).start()
    try:
        a.op_contend()
        _, granted_a = out_a.event("granted")
        assert {"valid_for_ms", "deadline_mono_ns", "deadline_wall_ms"} <= set(granted_a)
        b.op_contend()
        assert out_a.holding.wait(60)  # A renewed and its `lease` line is held in the pipe
        b_granted, _ = out_b.event("granted")  # A renews nothing while it is held: B leads
        out_a.release.set()  # the pipe drains: A's JVM reads the line now
        received, line = out_a.event("lease")
        assert received > b_granted and line["valid_for_ms"] > 0  # the late line, as before
        wall_ms = time.time_ns() // 1_000_000
        assert abs((line["deadline_wall_ms"] - wall_ms) * 1_000_000
                   - (line["deadline_mono_ns"] - time.monotonic_ns())) < 50_000_000
        assert jvm_deadline_ns(received, line) <= b_granted, (
            f"A's JVM takes its lease of epoch {line['epoch']} as valid for "
            f"{(jvm_deadline_ns(received, line) - b_granted) / 1e9:.3f} s after B's grant")
    finally:
        out_a.release.set()
        stop.set()
        a.close()
        b.close()
