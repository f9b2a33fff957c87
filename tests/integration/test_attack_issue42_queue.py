"""Adversarial reproducers against issue 42, finding 2's fix (every record of a term through
the group queue; reassertions skip the jobs of groups in flight), with overlapping groups."""

from __future__ import annotations

import threading

from registry import stalls
from registry.codec import default_codec
from registry.events import LeaderInformationPublished, new_event_id, now_ms
from registry.keys import leader_key
from registry.log import write_raw
from registry.writes import GroupCommit


def test_an_overlapping_group_never_restates_leader_information_a_group_in_flight_publishes(
        connect) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    term.publish_leader("dispatcher", "s-1", "addr-1")
    # a malformed publication on the term's own key (a raw writer): refused, the key unsettled
    key = leader_key(reg.namespace, term.epoch, "jm-1", "dispatcher")
    bad = LeaderInformationPublished(event_id=new_event_id(), namespace=reg.namespace,
                                     epoch=term.epoch, writer="jm-1", created_at=now_ms(),
                                     component="dispatcher", session="", address="bad")
    write_raw(reg.bootstrap, reg.topic, reg.partition, key, default_codec().encode(bad))
    reg.sync()
    assert key in reg.image.unsettled
    # what registry.writes.MAX_IN_FLIGHT = 4 would give (patching the constant does not reach
    # GroupCommit, whose default is bound when the class is defined)
    term._groups = GroupCommit(term._run_group, max_in_flight=4)

    gate = stalls.Gate("write.sent")
    errors: list[BaseException] = []
    receipts = []

    def publish() -> None:
        try:
            receipts.append(term.publish_leader("dispatcher", "s-1", "addr-2"))
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    with stalls.installed(gate):
        first = threading.Thread(target=publish)
        first.start()
        gate.wait_reached()  # group 1 (restatement of addr-1, then addr-2) handed on, held
        term.submit("b", b"graph")  # group 2, assembled while group 1 is in flight
        gate.open()
        first.join()
    assert not errors, errors
    assert receipts and receipts[0].offset is not None  # the call returned: acknowledged
    fresh = connect()
    assert fresh.image.leaders["dispatcher"].address == "addr-2", fresh.image.leaders
