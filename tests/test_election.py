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

from registry import ConfigError, Registry

pytestmark = pytest.mark.integration

LEASE = 2.0
WORKER = Path(__file__).resolve().parent / "procs" / "elect_worker.py"


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
        assert reg.sync().terms[1].renewals >= 2
        assert reg.sync().terms[1].lease_ms == LEASE * 1000
    assert reg.leader() is None  # leaving the block revoked the term
    reg.close()


def test_a_contender_waits_while_the_leader_renews_and_takes_over_when_it_stops(broker, topic):
    a, b = connect_fast(broker, topic, "e2"), connect_fast(broker, topic, "e2")
    lead = a.elect("jm-a", lease=LEASE)
    lead.acquire(timeout=LEASE * 10)
    wait = b.elect("jm-b", lease=LEASE)
    with pytest.raises(TimeoutError):
        wait.acquire(timeout=LEASE * 2.5)  # renewals keep coming: no takeover
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


class Worker:
    """A coordinator process running tests/procs/elect_worker.py; its JSON lines on a queue."""

    def __init__(self, broker, topic: str, contender: str, seconds: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), broker.bootstrap, topic, "ns-proc", contender,
             str(LEASE), str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def wait_for(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(msg)
            if msg["event"] == event:
                return msg
        raise AssertionError(f"no {event!r} within {timeout} s; saw {self.seen[-5:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        self.proc.wait(15)


def test_a_paused_leader_is_replaced_and_every_late_write_is_refused(broker, topic) -> None:
    """SIGSTOP the leading process longer than its lease; a contender process takes over;
    the resumed leader learns it lost, and nothing it writes afterwards is accepted."""
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
        leader.wait_for("revoked", LEASE * 15)
        late = [leader.wait_for("write", 30) for _ in range(3)]
        assert all(not w["ok"] for w in late), late
        assert {w["error"] for w in late} <= {"LeaseExpired", "Fenced"}
    finally:
        leader.stop()
        if contender is not None:
            contender.stop()
    # The log agrees: no record of jm-1 was accepted after the epoch-2 grant.
    reg = Registry.connect(broker.bootstrap, "ns-proc", topic=topic)
    image = reg.sync()
    grant2 = image.terms[2].granted_offset
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


@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_a_network_interruption_shorter_than_the_lease_causes_no_failover(topic, mode) -> None:
    """Incident 001: Flink's leader gave up on a transient disconnect. Here every client reaches
    the broker through a fault-injecting proxy; the network fails for 30% of a lease (well
    inside the tolerance registry.election states); the leader keeps its term, its renewals
    resume, no contender takes over, and it writes on."""
    from faultproxy import FaultProxy

    from registry import EmbeddedBroker

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
        renewals_before = leader_reg.sync().terms[1].renewals
        proxy.interrupt(lease * 0.3, mode).join()  # the network is back after 0.9 s
        waiting.join(lease * 5)
        assert outcome and isinstance(outcome[0], TimeoutError), outcome  # no takeover
        image = leader_reg.sync()
        assert image.epoch == 1 and image.active_leader.contender == "jm-1"
        assert image.terms[1].renewals > renewals_before  # renewals resumed after the fault
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
