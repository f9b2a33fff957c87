"""Lease election: on the embedded broker, in-process and with real coordinator processes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from registry import ConfigError, ElectionTimeout, Registry, RegistryError

pytestmark = pytest.mark.integration

LEASE = 2.0
WORKER = Path(__file__).resolve().parents[1] / "support" / "procs" / "elect_worker.py"


def connect_fast(broker, topic: str, namespace: str) -> Registry:
    return Registry.connect(broker.bootstrap, namespace, topic=topic, timeout=LEASE / 2)


def test_a_lone_contender_leads_and_renews(broker, topic) -> None:
    reg = connect_fast(broker, topic, "e1")
    election = reg.elect("jm-1", lease=LEASE)
    with election:
        term = election.term
        assert term.epoch == 1
        time.sleep(LEASE * 1.2)
        term.submit("job", b"g")
        assert reg.sync().term.renewals >= 2
        assert reg.sync().term.lease_ms == LEASE * 1000
    assert reg.leader() is None  # leaving the block revoked the term
    reg.close()


def test_a_term_being_given_up_is_never_said_to_lead(broker, topic) -> None:
    """Once its own revoke() is called, a term's election says it does not lead (valid_for 0,
    what the Flink bridge hands to hasLeadership): the revoke may land at once and a
    contender be granted without waiting for the lease. (The campaign's two_leaders rule
    found an election still certain 0.4 s after its term's revoke had landed and a newer
    grant after it.)"""
    reg = connect_fast(broker, topic, "e-resign")
    election = reg.elect("jm-1", lease=LEASE)
    term = election.acquire()
    assert election.valid_for() > 0 and election.is_leader
    term.revoke("giving up")
    assert term.resigned
    assert election.valid_for() == 0 and not election.is_leader
    other = connect_fast(broker, topic, "e-resign")
    assert other.claim_leadership("jm-2").epoch == term.epoch + 1  # at once: no lease to wait
    election.cancel()
    other.close()
    reg.close()


def test_a_contender_waits_while_the_leader_renews_and_takes_over_when_it_stops(broker, topic):
    a, b = connect_fast(broker, topic, "e2"), connect_fast(broker, topic, "e2")
    lead = a.elect("jm-a", lease=LEASE)
    lead.acquire(timeout=LEASE * 10)
    wait = b.elect("jm-b", lease=LEASE)
    with pytest.raises(ElectionTimeout) as waited:
        wait.acquire(timeout=LEASE * 2.5)  # renewals keep coming: no takeover
    assert isinstance(waited.value, (TimeoutError, RegistryError))  # either way to catch it
    lead._cancelled.set()  # the leader dies silently (no revoke): renewals stop
    stopped = time.monotonic()
    term = wait.acquire(timeout=LEASE * 10)
    took = time.monotonic() - stopped
    assert term.epoch == 2 and took >= LEASE * 0.5  # it waited for the lease, not less
    wait.cancel(revoke=True)
    for r in (a, b):
        r.close()


def test_leaving_the_block_hands_over_at_once(broker, topic) -> None:
    a, b = connect_fast(broker, topic, "e3"), connect_fast(broker, topic, "e3")
    first = a.elect("jm-a", lease=LEASE)
    first.acquire(timeout=LEASE * 10)
    first.cancel(revoke=True)  # what leaving the with-block does
    assert a.sync().revoked
    # With a clock that never moves, a contender can only take over a term that is not
    # active: so this proves a revoked term's lease is not waited out.
    second = b.elect("jm-b", lease=LEASE, clock=lambda: 0.0)
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(second.acquire()), daemon=True)
    runner.start()
    runner.join(LEASE * 10)
    if not result:
        second.cancel()  # stops the acquire loop before failing
    assert result and result[0].epoch == 2, "the contender waited for a revoked term"
    second.cancel(revoke=True)
    for r in (a, b):
        r.close()


def test_the_timeout_must_fit_in_the_lease(broker, topic) -> None:
    reg = Registry.connect(broker.bootstrap, "e4", topic=topic, timeout=10)
    with pytest.raises(ConfigError, match="half the lease"):
        reg.elect("jm-1", lease=5)
    reg.close()


_BAD_LINE, _ENDED = "<not one JSON object>", "<stdout ended>"


class Worker:
    """A coordinator process running tests/support/procs/elect_worker.py; its JSON lines on a
    queue. A line that is not one JSON object, or the end of its stdout, fails the next
    :meth:`wait_for` at once, naming it (a reader that died on one bad line, as this one did
    before issue 42's finding 8, left the test waiting in silence)."""

    def __init__(self, broker, topic: str, contender: str, seconds: float) -> None:
        import tempfile

        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), broker.bootstrap, topic, "ns-proc", contender,
             str(LEASE), str(seconds)], stdout=subprocess.PIPE, stderr=self.stderr,
            text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for number, line in enumerate(self.proc.stdout, 1):
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict) or "event" not in msg:
                    raise ValueError(line)
            except ValueError:
                msg = {"event": _BAD_LINE, "number": number, "line": line}
            self.lines.put(msg)
        self.lines.put({"event": _ENDED})

    def wait_for(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg["event"] == _BAD_LINE:
                raise AssertionError(f"the worker's stdout line {msg['number']} is not one "
                                     f"JSON object: {msg['line']!r}; saw {self.seen[-5:]}")
            if msg["event"] == _ENDED:
                self.lines.put(msg)  # every later wait fails at once too
                raise AssertionError(f"the worker's stdout ended before {event!r}; saw "
                                     f"{self.seen[-5:]}; {self.stacks()}")
            self.seen.append(msg)
            if msg["event"] == event:
                return msg
        raise AssertionError(f"no {event!r} within {timeout} s; saw {self.seen[-5:]}; "
                             f"{self.stacks()}")

    def writes(self, after: int) -> list[dict]:
        """The ``write`` lines read so far of the write calls numbered above ``after``."""
        return [m for m in self.seen if m["event"] == "write" and m["n"] > after]

    def stacks(self) -> str:
        """The process's state, and its threads' stacks (faulthandler, SIGUSR1) if it runs."""
        if self.proc.poll() is not None:
            state = f"exited with {self.proc.returncode}"
        else:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
            state = "running"
        self.stderr.seek(0)
        return f"the worker {state}; its stderr ends:\n" + self.stderr.read()[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        self.proc.wait(15)
        self.stderr.close()


def test_a_paused_leader_is_replaced_and_every_late_write_is_refused(broker, topic) -> None:
    """SIGSTOP the leading process longer than its lease; a contender process takes over;
    the resumed leader learns it lost, and nothing it writes afterwards is accepted.

    Strict since issue 42 (finding 8): its "open defect" (the resumed leader reported nothing
    for 30 s in 2 of 3 full-suite runs) was the worker's two threads printing to one stdout
    without a lock; after SIGCONT the ``revoked`` and a ``write`` line merged and this
    test's reader died on it (tests/unit/test_line_writers.py)."""
    leader = Worker(broker, topic, "jm-1", seconds=60)
    contender = None
    try:
        assert leader.wait_for("leader", 60)["epoch"] == 1
        leader.wait_for("write", 30)
        contender = Worker(broker, topic, "jm-2", seconds=60)
        contender.wait_for("contending", 60)
        os.kill(leader.proc.pid, signal.SIGSTOP)  # a long GC pause
        took_over = contender.wait_for("leader", LEASE * 15)
        assert took_over["epoch"] == 2
        os.kill(leader.proc.pid, signal.SIGCONT)
        # The resumed leader reads the log in its renewer's first round and learns at once
        # (registry.election: within the timeout + 0.1 s of reaching the broker); the bound
        # here only guards against a hang. Before the fix the renewer could die on an error
        # of the fenced producer and never learn.
        begun = leader.wait_for("revoked", LEASE * 15)["writes_begun"]
        # Every write call begun after the revocation is refused before anything is sent
        # (Fenced). The one in flight across the pause, begun before, may be reported after
        # the revocation whatever the order the two threads run in on resuming: its verdict
        # is the fold's, checked against the log below. Three late ones, in order.
        while len(leader.writes(after=begun)) < 3:
            leader.wait_for("write", 30)
        late = leader.writes(after=begun)
        assert [(w["ok"], w.get("error")) for w in late] == [(False, "Fenced")] * len(late), late
        assert [w["n"] for w in late] == list(range(begun + 1, begun + 1 + len(late))), late
    finally:
        leader.stop()
        if contender is not None:
            contender.stop()
    # The log agrees: no record of jm-1 was accepted after the epoch-2 grant.
    reg = Registry.connect(broker.bootstrap, "ns-proc", topic=topic)
    image = reg.sync()
    grant2 = image.term.granted_offset
    from registry.fold import fold_batches
    from registry.image import Image
    from registry.log import LogReader

    decisions = []
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    fold_batches(reader.sync(10), Image.empty("ns-proc"), None, decisions.append)
    reader.close()
    assert not [d for d in decisions if d.writer == "jm-1" and d.accepted and d.offset > grant2]
    reg.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.embedded_only("puts a fault proxy in front of an embedded broker of its own")
@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_a_network_interruption_shorter_than_the_lease_causes_no_failover(topic, mode) -> None:
    """Incident 001: Flink's leader gave up on a transient disconnect. Here every client reaches
    the broker through a fault-injecting proxy; the network fails for 30% of a lease (well
    inside the tolerance registry.election states); the leader keeps its term, its renewals
    resume, no contender takes over, and it writes on."""
    from registry import EmbeddedBroker
    from registry.dev.torture.proxy import FaultProxy

    lease = 3.0
    listen, advertised = _free_port(), _free_port()
    with EmbeddedBroker(port=listen, advertised_port=advertised) as broker, \
            FaultProxy(("127.0.0.1", listen), port=advertised) as proxy:
        leader_reg = Registry.connect(broker.bootstrap, "flaky", topic=topic, timeout=lease / 3)
        rival_reg = Registry.connect(broker.bootstrap, "flaky", topic=topic, timeout=lease / 3)
        election = leader_reg.elect("jm-1", lease=lease)
        term = election.acquire(timeout=lease * 10)
        time.sleep(lease / 2)
        rival = rival_reg.elect("jm-2", lease=lease)
        outcome: list[object] = []
        waiting = threading.Thread(
            target=lambda: outcome.append(_try(lambda: rival.acquire(timeout=lease * 3))))
        waiting.start()
        time.sleep(lease / 3)
        renewals_before = leader_reg.sync().term.renewals
        proxy.interrupt(lease * 0.3, mode).join()  # the network is back after 0.9 s
        waiting.join(lease * 5)
        assert outcome and isinstance(outcome[0], TimeoutError), outcome  # no takeover
        image = leader_reg.sync()
        assert image.epoch == 1 and image.active_leader.contender == "jm-1"
        assert image.term.renewals > renewals_before  # renewals resumed after the fault
        assert election.is_leader and term.submit("after-the-fault", b"g").epoch == 1
        rival.cancel()
        election.cancel(revoke=True)
        for r in (leader_reg, rival_reg):
            r.close()


def _try(fn):
    try:
        return fn()
    except Exception as e:  # the outcome is what the test inspects
        return e


# -- issue 10, defect 5: a resumed leader must learn promptly that it lost ----------------------
#
# These tests freeze the leader explicitly instead of racing a pause against timeouts: its
# clock is injected (its lease expires when the test says so) and its renewer runs one round
# at a time (it is frozen until the test lets it run one round).


class Rounds:
    """Runs an :class:`~registry.election.Election`'s renewer one round at a time.

    It stands in for the event the renewer waits on between rounds: the renewer is frozen
    there (as a paused process is) until :meth:`step`. Only the renewer is held; ``acquire``
    waits as usual, and ``cancel`` ends the renewer as usual.
    """

    def __init__(self, election) -> None:
        self._election = election
        self._event = election._cancelled
        self._go = threading.Semaphore(0)
        self._changed = threading.Condition()
        self.waits = 0  # how many times the renewer came back to wait between rounds
        election._cancelled = self

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        self._go.release()

    def wait(self, timeout: float | None = None) -> bool:
        if not threading.current_thread().name.startswith("jobreg-lease-"):
            return self._event.wait(timeout)
        with self._changed:
            self.waits += 1
            self._changed.notify_all()
        self._go.acquire()
        return self._event.is_set()

    def _renewer_alive(self) -> bool:
        renewer = self._election._renewer
        return renewer is not None and renewer.is_alive()

    def ready(self) -> None:
        """Wait until the renewer waits for its first round."""
        self._until(lambda: self.waits > 0 or not self._renewer_alive())

    def step(self) -> None:
        """Let the renewer run one round; return when it waits again or has ended."""
        with self._changed:
            before = self.waits
        self._go.release()
        self._until(lambda: self.waits > before or not self._renewer_alive())

    def _until(self, done) -> None:
        hang = time.monotonic() + 120  # a guard against a hung test, not a timing margin
        with self._changed:
            while not done():
                assert time.monotonic() < hang, "the renewer's round never ended"
                self._changed.wait(0.05)


def _records_of(bootstrap: str, topic: str, namespace: str, writer: str, after: int) -> list:
    """The fold's decision on every record of ``writer`` at an offset past ``after``."""
    from registry.fold import fold_batches
    from registry.image import Image
    from registry.log import LogReader

    reg = Registry.connect(bootstrap, namespace, topic=topic)
    decisions: list = []
    reader = LogReader(reg.bootstrap, reg.topic, reg.partition)
    try:
        fold_batches(reader.sync(10), Image.empty(namespace), None, decisions.append)
    finally:
        reader.close()
        reg.close()
    return [d for d in decisions if d.writer == writer and d.offset > after]


@pytest.mark.parametrize("lease_run_out", [True, False], ids=["lease-run-out", "lease-left"])
def test_a_resumed_leader_learns_in_its_first_round_that_it_lost(broker, topic,
                                                                 lease_run_out) -> None:
    """The failed run, made certain: the leader is frozen; a newer term is granted and
    writes; the leader resumes (then with the fencing's fatal error pending in its
    transactional producer; nothing is fenced at the broker now, README "The write path").
    Its first round must read the log and call ``on_revoked`` exactly once;
    user writes raise ``LeaseExpired`` before (nothing sent) and ``Fenced`` after.
    ``lease-left``: the leader's own clock says its lease still runs (a slow clock, or a
    takeover by an external election), so its first round does try to renew."""
    from registry import Fenced, LeaseExpired

    namespace = "resume-" + ("out" if lease_run_out else "left")
    now = [0.0]
    a, b = connect_fast(broker, topic, namespace), connect_fast(broker, topic, namespace)
    revoked: list = []
    election = a.elect("jm-a", lease=LEASE, clock=lambda: now[0], on_revoked=revoked.append)
    rounds = Rounds(election)
    term = election.acquire()
    rounds.ready()
    rounds.step()  # one ordinary round: a renewal
    assert a.sync().term.renewals == 1 and election.is_leader

    # Frozen from here. A newer term is granted and writes.
    if lease_run_out:
        now[0] = LEASE  # past 0.9 x lease since the last renewal was sent
    newer = b.claim_leadership("jm-b", lease_ms=round(LEASE * 1000))
    newer.submit("b-1", b"g")
    grant2 = b.sync().term.granted_offset
    if lease_run_out:
        with pytest.raises(LeaseExpired) as expired:
            term.submit("a-late", b"g")
        assert expired.value.event_ids == ()
    assert not revoked and a.image.epoch == 1  # it has not read the log since

    rounds.step()  # it resumes: one round
    assert revoked == [term], "the resumed leader did not learn it lost in its first round"
    assert a.image.epoch == 2 and not election.is_leader
    with pytest.raises(Fenced) as fenced:
        term.submit("a-later", b"g")
    assert fenced.value.expected_epoch == 2 and fenced.value.actual_epoch == 1
    assert fenced.value.event_ids == ()
    for _ in range(3):
        rounds.step()  # the renewer has stopped: no second on_revoked
    assert revoked == [term]
    election.cancel(revoke=True)
    assert newer.submit("b-2", b"g").epoch == 2  # the newer term writes on
    assert not [d for d in _records_of(broker.bootstrap, topic, namespace, "jm-a", grant2)
                if d.accepted]
    if lease_run_out:  # it read before sending: nothing of it reached the log at all
        assert _records_of(broker.bootstrap, topic, namespace, "jm-a", grant2) == []
    for r in (a, b):
        r.close()


@pytest.mark.embedded_only("puts a fault proxy in front of an embedded broker of its own")
def test_a_resumed_leader_that_cannot_read_the_log_keeps_trying_and_learns_when_it_can(
        topic) -> None:
    """The leader resumes, its lease run out, while it cannot reach the broker: it cannot know
    whether it lost, so it keeps its term, writes nothing and keeps trying. The first round in
    which it reads the log is the round it learns it lost; it never sends a renewal (which would
    fence the new leader's producer at the broker) nor any other record."""
    from registry import EmbeddedBroker, Fenced, LeaseExpired
    from registry.dev.torture.proxy import FaultProxy

    listen, advertised = _free_port(), _free_port()
    with EmbeddedBroker(port=listen, advertised_port=advertised) as broker, \
            FaultProxy(("127.0.0.1", listen), port=advertised) as proxy:
        now = [0.0]
        a, b = connect_fast(broker, topic, "cut"), connect_fast(broker, topic, "cut")
        revoked: list = []
        election = a.elect("jm-a", lease=LEASE, clock=lambda: now[0],
                           on_revoked=revoked.append)
        rounds = Rounds(election)
        term = election.acquire()
        rounds.ready()
        rounds.step()  # one ordinary round: a renewal
        assert a.sync().term.renewals == 1

        now[0] = LEASE  # frozen past its lease; a newer term is granted meanwhile
        newer = b.claim_leadership("jm-b", lease_ms=round(LEASE * 1000))
        grant2 = b.sync().term.granted_offset
        proxy.cut()
        try:
            for _ in range(2):  # it resumes unable to read: it learns nothing, keeps trying
                rounds.step()
                assert not revoked and a.image.epoch == 1 and election.term is term
                with pytest.raises(LeaseExpired):
                    term.submit("a-late", b"g")
        finally:
            proxy.heal()
        # The broker is reachable again: the first round that reads the log decides.
        for _ in range(30):
            rounds.step()
            assert bool(revoked) == (a.image.epoch == 2), \
                "a round that read the newer grant did not revoke (or one that did not, did)"
            if revoked:
                break
        assert revoked == [term]
        with pytest.raises(Fenced):
            term.submit("a-later", b"g")
        election.cancel(revoke=True)
        assert newer.submit("b-1", b"g").epoch == 2
        assert _records_of(broker.bootstrap, topic, "cut", "jm-a", grant2) == []
        for r in (a, b):
            r.close()


_DIES_MID_CALL = r'''
import os, signal, sys
from registry import Registry
from registry.log import LeaderWriter
bootstrap, topic, ns = sys.argv[1:4]
reg = Registry.connect(bootstrap, ns, topic=topic)
term = reg.claim_leadership("jm-dead")
term.submit("committed", b"g")
start = LeaderWriter.start

def first_record_then_die(self, records):
    self.wait(start(self, records[:1]))  # the call's first record lands, its commit never
    print("sent", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

LeaderWriter.start = first_record_then_die
term.submit_many([("half-a", b"g"), ("half-b", b"g")])
'''


def test_a_leader_killed_mid_call_does_not_block_the_next_one(broker, topic) -> None:
    """A leader SIGKILLed after the first record of a call of several landed and before
    its ``CallCommitted``: nothing is left open at the broker (no transaction), the next
    leader takes over at once, the half call is refused at its grant
    (``call_not_committed``, fold rule 8) and everything decided before stays."""
    reg = Registry.connect(broker.bootstrap, "killed", topic=topic)  # before the dead leader
    dead = subprocess.run([sys.executable, "-c", _DIES_MID_CALL, broker.bootstrap,
                           topic, "killed"], capture_output=True, text=True, timeout=120)
    assert dead.returncode == -signal.SIGKILL and "sent" in dead.stdout, dead.stderr[-2000:]
    term = reg.claim_leadership("jm-next")
    term.submit("after", b"g")
    fresh = Registry.connect(broker.bootstrap, "killed", topic=topic)
    assert (fresh.leader().epoch, fresh.leader().contender) == (term.epoch, "jm-next")
    assert fresh.job("committed").status == fresh.job("after").status == "ACTIVE"
    assert "half-a" not in fresh.jobs() and "half-b" not in fresh.jobs()
    assert any(d.reason == "call_not_committed" for d in fresh.rejected())
    fresh.close()
    reg.close()


# -- keep_alive: a contender that leads for another process (the Flink bridge) -----------------


def test_a_leader_whose_owner_is_not_alive_stops_renewing_and_gives_the_term_up(broker,
                                                                                topic) -> None:
    """``keep_alive`` says no: the renewer sends nothing; once the lease has run out on the
    election's (injected) clock the term is given up (``on_revoked``, reason ``not_alive``)
    and writes are refused; while it says no the contender does not claim either; when it
    says yes again the contender claims again (after a silent lease of the old term)."""
    from registry import Fenced

    now, alive = [0.0], [True]
    a = connect_fast(broker, topic, "keep-alive")
    revoked: list = []
    renewed: list = []
    election = a.elect("jm-a", lease=LEASE, clock=lambda: now[0], on_revoked=revoked.append,
                       on_renewed=renewed.append, keep_alive=lambda: alive[0])
    rounds = Rounds(election)
    term = election.acquire()
    assert election.valid_for() == pytest.approx(0.9 * LEASE)
    rounds.ready()
    rounds.step()  # alive: an ordinary renewal, reported
    assert renewed == [term] and a.sync().term.renewals == 1

    alive[0] = False
    rounds.step()  # not alive, lease still valid: nothing sent
    assert a.sync().term.renewals == 1 and not revoked and election.is_leader
    now[0] = LEASE  # the lease runs out
    rounds.step()
    assert revoked == [term] and not election.is_leader
    assert a.sync().term.renewals == 1 and a.image.active_leader is not None  # nothing written
    with pytest.raises(Fenced) as e:
        term.submit("late", b"g")
    assert e.value.reason == "not_alive" and e.value.event_ids == ()
    assert renewed == [term]
    election.cancel()

    # Not alive: a new contender claims for nobody, even once the old term is silent.
    again = a.elect("jm-a", lease=LEASE, clock=lambda: now[0], keep_alive=lambda: alive[0])
    with pytest.raises(ElectionTimeout):
        again.acquire(timeout=0.0)
    assert a.sync().epoch == 1
    again.cancel()

    def ticking() -> float:  # a lease passes between any two looks at the clock
        now[0] += LEASE
        return now[0]

    for owner in (False, True):
        alive[0] = owner
        third = a.elect("jm-a", lease=LEASE, clock=ticking, keep_alive=lambda: alive[0])
        if not owner:  # the old term is silent for a lease each round: still no claim
            with pytest.raises(ElectionTimeout):
                third.acquire(timeout=4 * LEASE)
            assert a.sync().epoch == 1
        else:
            assert third.acquire(timeout=60 * LEASE).epoch == 2  # claimed once alive
        third.cancel(revoke=True)
    a.close()
