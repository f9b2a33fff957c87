"""The outcome contract of every write (README "What an answer means", registry/errors.py).

Once the fold has decided a call's records, the call returns those decisions:
follow-up work (settling keys a refused record landed on) never turns a
decided outcome into an exception. An exception means exactly one of *not
accepted* or *unknown*. Each test drives a real broker into the situation at
one raise site and checks the answer against the log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from registry import LeaseExpired, OutcomeUnknown
from registry.codec import default_codec
from registry.dev.broker import EmbeddedBroker
from registry.errors import BrokerError, Fenced, WriteRejected
from registry.events import JobCancelled, new_event_id, now_ms
from registry.image import Outcome
from registry.keys import job_key
from registry.log import LeaderWriter, WriteFailed, write_raw


def _zombie_cancel(reg, job_id: str, epoch: int, writer: str) -> int:
    """A late write of an old term straight onto the job's key (the client never sees it
    coming): refused by the fold, and it leaves the key unsettled."""
    event = JobCancelled(event_id=new_event_id(), namespace=reg.namespace, epoch=epoch,
                         writer=writer, created_at=now_ms(), job_id=job_id)
    return write_raw(reg.bootstrap, reg.topic, reg.partition,
                     job_key(reg.namespace, job_id), default_codec().encode(event))


def _accepted(reg, event_id: str) -> bool:
    reg.sync()
    return any(d.event_id == event_id and d.outcome == Outcome.ACCEPTED
               for d in reg.forensics().decisions())


def _two_terms(connect):
    """Term 1 of jm-0 (a zombie to be), then term 2 of jm-1 with jobs a and b."""
    reg = connect()
    reg.claim_leadership("jm-0")
    term = reg.claim_leadership("jm-1")
    term.submit_many([("job-a", b"a"), ("job-b", b"b")])
    return reg, term


def test_a_decided_cancel_is_returned_though_the_lease_lapses_before_the_follow_up(connect):
    # The reported case: the cancel is accepted, a zombie's record landed meanwhile,
    # and the follow-up reassertion ran the lease guard again and raised LeaseExpired.
    reg, term = _two_terms(connect)
    calls = []

    def guard() -> None:  # the lease is valid for the call (asked when it is made and when
        calls.append(1)   # its group is sent), and lapses right after
        if len(calls) > 2:
            raise LeaseExpired("lease lapsed after the call was sent")

    term.guard_writes(guard)
    _zombie_cancel(reg, "job-b", 1, "jm-0")  # lands before our cancel; we have not read it
    receipt = term.cancel("job-a", reason="done")
    assert _accepted(reg, receipt.event_id)
    assert reg.job("job-a").status == "CANCELLED"


def test_a_decided_cancel_is_returned_though_a_newer_term_fences_the_follow_up(connect,
                                                                                 monkeypatch):
    reg, term = _two_terms(connect)
    other = connect()
    original = type(term)._send
    sends = []

    def send(self, pairs, **kw):
        sends.append(pairs)
        if len(sends) == 2:  # the follow-up: a newer term is granted just before it
            other.claim_leadership("jm-2")
        return original(self, pairs, **kw)

    monkeypatch.setattr(type(term), "_send", send)
    _zombie_cancel(reg, "job-b", 1, "jm-0")
    receipt = term.cancel("job-a")
    assert len(sends) >= 2, "the follow-up reassertion did not run"
    assert _accepted(reg, receipt.event_id)
    with pytest.raises(Fenced):  # and the next call learns the term is over
        term.cancel("job-b")


def test_a_decided_cancel_is_returned_though_the_broker_is_gone_for_the_follow_up(
        connect, monkeypatch):
    reg, term = _two_terms(connect)
    original = type(term)._send
    sends = []

    def send(self, pairs, **kw):
        sends.append(pairs)
        if len(sends) == 2:
            raise OutcomeUnknown("the broker stopped answering", ())
        return original(self, pairs, **kw)

    monkeypatch.setattr(type(term), "_send", send)
    _zombie_cancel(reg, "job-b", 1, "jm-0")
    receipt = term.cancel("job-a")
    assert len(sends) == 2
    assert _accepted(reg, receipt.event_id)
    # The key stays unsettled; the next write settles it.
    monkeypatch.setattr(type(term), "_send", original)
    assert reg.image.unsettled
    term.adopt("job-b")
    assert not reg.sync().unsettled


def test_a_lease_expired_before_sending_sends_nothing(connect):
    reg, term = _two_terms(connect)
    end = reg.sync().provenance.last_offset

    def guard() -> None:
        raise LeaseExpired("not renewed")

    term.guard_writes(guard)
    with pytest.raises(LeaseExpired) as caught:
        term.cancel("job-a")
    assert caught.value.event_ids == ()
    assert reg.sync().provenance.last_offset == end
    assert reg.job("job-a").status == "ACTIVE"


def test_a_fenced_write_names_its_records_and_none_is_accepted(connect):
    reg, term = _two_terms(connect)
    connect().claim_leadership("jm-2")
    with pytest.raises(Fenced) as caught:
        term.cancel("job-a")
    assert (caught.value.expected_epoch, caught.value.actual_epoch) == (3, 2)
    for event_id in caught.value.event_ids:
        assert not _accepted(reg, event_id)
    assert reg.job("job-a").status == "ACTIVE"


def test_a_write_whose_fate_is_unknown_says_which_records_to_look_for(connect, monkeypatch):
    reg, term = _two_terms(connect)
    from registry import log

    def lost(self, records):  # the records are handed over, and no answer ever comes
        return log.Sending(self._producer, log._Delivery(), records, len(records),
                           BrokerError("no answer from the broker"))

    monkeypatch.setattr(log.LeaderWriter, "start", lost)
    monkeypatch.setattr(term._writes, "MAX_RESENDS", 0)
    with pytest.raises(OutcomeUnknown) as caught:
        term.cancel("job-a")
    assert caught.value.event_ids


def test_after_a_fencing_the_next_write_is_fenced_before_sending(connect):
    reg, term = _two_terms(connect)
    connect().claim_leadership("jm-2")
    with pytest.raises(Fenced):
        term.cancel("job-a")
    with pytest.raises(Fenced) as caught:  # the producer is gone; the image says why
        term.cancel("job-b")
    assert caught.value.event_ids == ()


@pytest.mark.embedded_only("stops an EmbeddedBroker of its own under a writer")
@pytest.mark.parametrize("with_producer", [True, False])
def test_a_lost_broker_is_unknown_after_sending_and_not_accepted_before(tmp_path, with_producer):
    from registry import EmbeddedBroker, Registry

    with EmbeddedBroker() as private:
        reg = Registry.connect(private.bootstrap, "prod", timeout=1.0,
                               blob_store=tmp_path / "blobs")
        term = reg.claim_leadership("jm-1")
        term.submit("job-a", b"a")
        if not with_producer:
            term.close()  # the next write must make a producer first
        private.stop()
        with pytest.raises(OutcomeUnknown if with_producer else BrokerError) as caught:
            term.cancel("job-a")
        if with_producer:
            assert caught.value.event_ids
        else:
            assert not isinstance(caught.value, OutcomeUnknown)
            assert caught.value.event_ids == ()
        reg.close()


def test_an_accepted_claim_is_returned_though_its_start_fails(connect, monkeypatch):
    from registry.client import Term

    reg = connect()

    def cannot_settle(self):
        raise BrokerError("the broker went away after the grant")

    monkeypatch.setattr(Term, "reassert", cannot_settle)
    term = reg.claim_leadership("jm-1")  # the grant is accepted: the claim says so
    assert reg.leader() == (1, "jm-1") and term.epoch == 1


def test_a_claim_whose_producer_cannot_start_sends_nothing(connect, monkeypatch):
    """A claim whose producer cannot start (no broker answers it) sends nothing, and says
    so: not accepted, no event ids to look for."""
    from registry import log

    reg = connect()

    def no_producer(self, *args, **kwargs):
        raise BrokerError("no Kafka broker answered: planted")

    monkeypatch.setattr(log.PlainWriter, "__init__", no_producer)
    with pytest.raises(BrokerError) as caught:
        reg.claim_leadership("jm-1")
    assert not isinstance(caught.value, OutcomeUnknown) and caught.value.event_ids == ()
    assert reg.leader() is None and reg.epoch() == 0


@pytest.mark.embedded_only("stops an EmbeddedBroker of its own before or during a claim")
@pytest.mark.parametrize("when", ["before", "during"])
def test_a_claim_with_a_lost_broker_is_not_accepted_before_and_unknown_during(
        tmp_path, monkeypatch, when):
    from registry import EmbeddedBroker, Registry, log

    with EmbeddedBroker() as private:
        reg = Registry.connect(private.bootstrap, "prod", timeout=1.0,
                               blob_store=tmp_path / "blobs")
        reg.sync()
        if when == "before":
            private.stop()
        else:
            original = log.PlainWriter.write

            def write(self, *args, **kwargs):  # the broker dies as the grant is sent
                private.stop()
                return original(self, *args, **kwargs)

            monkeypatch.setattr(log.PlainWriter, "write", write)
        with pytest.raises((BrokerError, OutcomeUnknown)) as caught:
            reg.claim_leadership("jm-1")
        if when == "before":
            # Not accepted, or (if the client's last look at the log still seemed fresh and
            # it tried to send) unknown; never a BrokerError that names records it sent.
            if not isinstance(caught.value, OutcomeUnknown):
                assert caught.value.event_ids == ()
        else:
            assert isinstance(caught.value, OutcomeUnknown)
            assert len(caught.value.event_ids) == 1
        reg.close()


@pytest.mark.integration
def test_a_record_confirmed_without_its_offset_is_found_by_reading_the_log(connect,
                                                                           monkeypatch) -> None:
    """The idempotent producer confirms a retried record the broker already had
    (DUPLICATE_SEQUENCE_NUMBER) without an offset. Seen in the fault campaign (seed 100028):
    a claim then raised TypeError comparing an offset with None. Both writers now say the
    offset is missing, and the client reads the log: the claim and the write are decided."""
    from registry import log

    real = log._Delivery.__call__
    dropped: list[int] = []

    class _NoOffset:
        def __init__(self, msg) -> None:
            self._msg = msg

        def offset(self):
            return None

        def timestamp(self):
            return self._msg.timestamp()

    def first_report_without_offset(self, err, msg) -> None:
        if err is None and len(dropped) < 2 and msg.offset() not in dropped:
            dropped.append(msg.offset())
            return real(self, err, _NoOffset(msg))
        return real(self, err, msg)

    reg = connect("no-offset")
    monkeypatch.setattr(log._Delivery, "__call__", first_report_without_offset)
    term = reg.claim_leadership("jm-1")  # the grant's report has no offset
    assert term.epoch == 1 and reg.leader().contender == "jm-1"
    receipt = term.submit("job", b"g")  # so has the submit's
    monkeypatch.setattr(log._Delivery, "__call__", real)
    assert len(dropped) == 2 and receipt.offset == dropped[1]
    assert reg.job("job").status == "ACTIVE"


def _leader_racing_a_claim(connect, proxy_class):
    """A leader (term 1 of jm-old, its producer made) whose producer is replaced by
    ``proxy_class(real, claim)``; ``claim()`` makes a second client claim the namespace
    (jm-new) and lands its term in ``claimed``."""
    old, new = connect(), connect()
    term = old.claim_leadership("jm-old")
    term.submit("warm", b"g")  # the term's producer exists
    claimed = []
    proxy = proxy_class(term._writes.writer._producer,
                        lambda: claimed.append(new.claim_leadership("jm-new")))
    term._writes.writer._producer = proxy
    return old, new, term, proxy, claimed


class _ClaimBeforeSend:
    """Stands in for a leader's producer: its records are queued, and before they are sent
    another client claims the namespace (its grant lands first)."""

    def __init__(self, real, claim) -> None:
        self._real, self._claim, self.raced = real, claim, False

    def produce_batch(self, *args, **kwargs):
        if self._claim is not None:
            claim, self._claim = self._claim, None
            claim()
            self.raced = True
        return self._real.produce_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.integration
def test_a_write_raced_by_a_claim_never_answers_falsely(connect) -> None:
    """Campaign seed 140180 (transactions then: a claim fenced the producer before its
    commit, and the embedded broker showed the records later, inside the old term). Now
    the grant lands between the call's produce and its send: whatever the broker does with
    the records, the call's answer must be true: Fenced only if the record never counts, a
    receipt only if it does, else OutcomeUnknown."""
    old, new, term, proxy, claimed = _leader_racing_a_claim(connect, _ClaimBeforeSend)
    try:
        term.submit("raced", b"g")
        answer = "ok"
    except OutcomeUnknown:
        answer = "unknown"
    except WriteRejected:  # Fenced included
        answer = "refused"
    assert proxy.raced and claimed, "the race did not happen"
    claimed[0].submit("after", b"g")  # the new leader writes
    fresh = connect()
    counts = "raced" in fresh.sync().jobs
    assert (answer, counts) in {("ok", True), ("unknown", True), ("unknown", False),
                                ("refused", False)}, (answer, counts)
    for reg in (old, new, fresh):
        reg.close()




@pytest.fixture
def paused_broker(broker):
    """``pause()`` stops the embedded broker's process (SIGSTOP) until the test ends."""
    if not isinstance(broker, EmbeddedBroker):
        pytest.skip("pauses the embedded broker's process")
    paused = []

    def pause() -> None:
        os.kill(broker.pid, signal.SIGSTOP)
        paused.append(True)
        # kill() only queues the stop: wait until every thread of the broker is stopped, or
        # one already running may still answer a request sent right after (seen under load:
        # a write the test meant to time out was acknowledged).
        tasks = f"/proc/{broker.pid}/task"
        for _ in range(2000):
            states = []
            for tid in os.listdir(tasks):
                with contextlib.suppress(OSError), open(f"{tasks}/{tid}/stat") as stat:
                    states.append(stat.read().rsplit(")", 1)[1].split()[0])
            if states and all(state in "tT" for state in states):
                return
            time.sleep(0.005)
        raise AssertionError(f"the broker (pid {broker.pid}) did not stop within 10 s")

    yield pause
    if paused:
        os.kill(broker.pid, signal.SIGCONT)


@pytest.mark.integration
@pytest.mark.embedded_only("freezes the session's broker with SIGSTOP")
def test_a_write_that_times_out_leaves_its_records_in_doubt(broker, topic, paused_broker
                                                           ) -> None:
    """No delivery report, no offset: records sent and never answered are in doubt (the
    writer cannot say they were not appended), records still queued when it gave up are
    purged unsent (not appended: under load they may not have left yet), none is placed;
    and it retires its producer (nothing of the write is sent after the answer)."""
    writer = LeaderWriter(broker.bootstrap, topic, 0, timeout=1.0)
    try:
        writer.write([("doubt/job/warm", b"w")])
        paused_broker()
        with pytest.raises(WriteFailed) as failed:
            writer.write([("doubt/job/a", b"a"), ("doubt/job/b", b"b")])
        assert (failed.value.fatal, failed.value.appended) == (True, ())
        assert 0 <= failed.value.in_doubt <= 2
        assert not writer.usable
    finally:
        os.kill(broker.pid, signal.SIGCONT)
        writer.close()


class _SendTimesOutAfterAClaim:
    """Stands in for a leader's producer whose records are sent but never reported, and
    whose flush times out (campaign seed 150081: the leader was paused past its lease
    between produce and commit, in a transaction then). Before the timeout is raised,
    another client claims the namespace. The records are dropped here, so the log never
    holds them: what matters is the answer, which is not Fenced, because a broker may yet
    show such a record (the embedded broker did, before the grant, with transactions):
    OutcomeUnknown is true whatever it does."""

    def __init__(self, real, claim) -> None:
        self._real, self._claim, self.timed_out, self._served = real, claim, False, False

    def produce_batch(self, topic, messages, **kwargs) -> int:
        if self._claim is None:
            return self._real.produce_batch(topic, messages, **kwargs)
        claim, self._claim = self._claim, None  # "queued", never sent
        claim()
        self.timed_out = True
        return len(messages)

    def poll(self, *args):
        if self.timed_out and self._claim is None and not self._served:
            self._served = True
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no report in time",
                                            retriable=True))
        return self._real.poll(*args)

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.integration
def test_records_in_doubt_when_the_term_ends_are_unknown_not_fenced(connect) -> None:
    """The term ended and the log does not hold the call's records, but their write
    failed without a delivery report for them: the answer is OutcomeUnknown naming them."""
    old, new, term, proxy, claimed = _leader_racing_a_claim(connect, _SendTimesOutAfterAClaim)
    with pytest.raises(OutcomeUnknown) as unknown:
        term.submit("raced", b"g")
    assert proxy.timed_out and claimed, "the race did not happen"
    assert "may have placed" in str(unknown.value) and len(unknown.value.event_ids) == 1
    assert "raced" not in connect().sync().jobs
    for reg in (old, new):
        reg.close()


class _OtherTransactionOpensBeforeSend:
    """Stands in for a leader's producer: before its records are sent, another
    transactional producer (a tool's on the same partition) appends a record and leaves
    its transaction open. The leader's records then lie after that record, below the high
    watermark once acknowledged but above the last stable offset (campaign seed 180083,
    then with transactions of two leaders)."""

    def __init__(self, real, other) -> None:
        self._real, self._other = real, other

    def produce_batch(self, *args, **kwargs):
        if self._other is not None:
            other, self._other = self._other, None
            other()
        return self._real.produce_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.integration
def test_a_write_is_acknowledged_only_once_every_reader_can_read_it(connect) -> None:
    """An acknowledgement does not make records readable to read_committed readers while a
    transaction of another producer is open before them (the last stable offset stays at
    its first record). An acknowledged write must be in what any reader reads from then
    on."""
    import threading

    from confluent_kafka import Producer

    reg = connect()
    term = reg.claim_leadership("jm-0")
    term.submit("warm", b"g")  # the term's producer exists; the reader is at the end
    other = Producer({"bootstrap.servers": reg.bootstrap,
                      "transactional.id": f"other-{new_event_id()}"})
    other.init_transactions(10)

    def open_other() -> None:
        other.begin_transaction()
        other.produce(reg.topic, key=b"other", value=b"x", partition=reg.partition)
        other.flush(10)

    term._writes.writer._producer = _OtherTransactionOpensBeforeSend(term._writes.writer._producer,
                                                                open_other)
    answers: list[object] = []

    def call() -> None:
        try:
            answers.append(term.submit("acked", b"g"))
        except Exception as e:  # the answer, whatever it is, is checked below
            answers.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(1.0)  # either branch below must hold; the wait only picks one
    if not caller.is_alive() and not isinstance(answers[0], Exception):
        # Acknowledged while the other transaction is still open: a reader must see it.
        assert "acked" in connect().sync().jobs, "an acknowledged write is not readable"
    other.commit_transaction(10)
    caller.join(60)
    assert not caller.is_alive()
    if not isinstance(answers[0], Exception):
        assert "acked" in connect().sync().jobs
    else:
        assert isinstance(answers[0], OutcomeUnknown), answers[0]
    other.flush(10)
