"""Flink's leader information on a real broker (fold rule 9): the new leader's publication
is what every reader sees; a deposed leader's is refused, visibly, and raises Fenced."""

from __future__ import annotations

import pytest

from registry import ConfigError, Fenced
from registry.image import LeaderInfo, Outcome


def test_a_deposed_leaders_publication_is_fenced_and_the_new_leaders_is_seen(connect) -> None:
    old_reg, new_reg, reader = connect(), connect(), connect()
    old = old_reg.claim_leadership("jm-1")
    old.publish_leader("dispatcher", "s-1", "pekko.tcp://flink@jm-1:6123/user/rpc/dispatcher_1")
    assert dict(reader.leaders()) == {
        "dispatcher": LeaderInfo("s-1", "pekko.tcp://flink@jm-1:6123/user/rpc/dispatcher_1")}

    new = new_reg.claim_leadership("jm-2")
    assert dict(reader.leaders()) == {}  # the new leader has published nothing yet
    new.publish_leader("dispatcher", "s-2", "pekko.tcp://flink@jm-2:6123/user/rpc/dispatcher_1")
    new.publish_leader("rest_server", "s-2", "http://jm-2:8081")

    # The old leader has not read the new grant: its record reaches the log and is refused.
    with pytest.raises(Fenced) as raised:
        old.publish_leader("dispatcher", "s-1", "pekko.tcp://flink@jm-1:6123/stale")
    assert (raised.value.reason, raised.value.expected_epoch, raised.value.actual_epoch,
            raised.value.leader) == ("stale_epoch", 2, 1, "jm-2")

    leaders = reader.leaders()
    assert leaders["dispatcher"].session == "s-2"
    assert leaders["dispatcher"].address == "pekko.tcp://flink@jm-2:6123/user/rpc/dispatcher_1"
    assert leaders["rest_server"] == LeaderInfo("s-2", "http://jm-2:8081")
    assert reader.image.leaders == leaders  # Image.leaders is what leaders() returns
    refused = [d for d in reader.rejected() if d.event_type == "LeaderInformationPublished"]
    assert [(d.reason, d.expected_epoch, d.actual_epoch) for d in refused] == [
        ("stale_epoch", 2, 1)]
    assert refused[0].outcome == Outcome.REJECTED and "old term" in refused[0].detail

    # Flink's deleteLeaderInformation, then the term's end empties the rest.
    new.publish_leader("rest_server", "s-2", None)
    assert set(reader.leaders()) == {"dispatcher"}
    new.revoke("shutting down")
    assert dict(reader.leaders()) == {}
    with pytest.raises(Fenced):
        new.publish_leader("dispatcher", "s-2", "x")


def test_malformed_leader_information_is_refused_before_anything_is_sent(connect) -> None:
    reg = connect()
    term = reg.claim_leadership("jm-1")
    end = reg.sync().provenance.last_offset
    for component, session, address in [("a/b", "s", "x"), ("", "s", "x"),
                                        ("dispatcher", "s" * 201, "x"),
                                        ("dispatcher", "s", "line\nbreak"),
                                        ("dispatcher", "", "x")]:
        with pytest.raises(ConfigError) as raised:
            term.publish_leader(component, session, address)
        assert "\n" not in str(raised.value)
    assert reg.sync().provenance.last_offset == end
