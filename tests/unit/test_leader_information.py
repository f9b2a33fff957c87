"""Fold rule 9: Flink's leader information, a fenced write of the current term (no broker).

A unit test per clause of the rule, and property tests over random histories of
contenders, deposed leaders and zombies publishing, compacted by the model of Kafka's
cleaner (:mod:`support.model`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from support.histories import DAY, SETTINGS, build, contender, tick
from support.model import NS, TOPIC, Sim, compact, visible

from registry.events import (
    Event,
    LeaderInformationPublished,
    LeadershipGranted,
    LeadershipRevoked,
    new_event_id,
)
from registry.fold import DUPLICATE_WINDOW_MS, Delta, fold, leader_information_error
from registry.image import Image, LeaderInfo, LogRecord, Outcome
from registry.keys import leader_key, parse_key, record_key
from registry.snapshot import decode_image, encode_image
from registry.wire import encode


def _env(epoch: int, writer: str) -> dict[str, object]:
    return dict(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer,
                created_at=0)


def _grant(epoch: int, writer: str) -> LeadershipGranted:
    return LeadershipGranted(**_env(epoch, writer), prev_epoch=epoch - 1)


def _publish(epoch: int, writer: str, component: str = "dispatcher",
             address: str | None = "akka://flink@jm:6123", session: str = "s") -> Event:
    return LeaderInformationPublished(**_env(epoch, writer), component=component,
                                      session=session, address=address)


def _fold(*events: Event) -> tuple[Image, list]:
    delta = Delta(Image.empty(NS))
    decisions = [delta.replay(LogRecord(i, record_key(e).encode(), encode(e), 1000 + i))
                 for i, e in enumerate(events)]
    return delta.apply(), decisions


def test_the_current_leader_publishes_and_deletes() -> None:
    image, ds = _fold(_grant(1, "jm-1"), _publish(1, "jm-1", session="s1"),
                      _publish(1, "jm-1", "rest_server", "http://jm:8081", "s1"))
    assert [d.outcome for d in ds] == [Outcome.ACCEPTED] * 3
    assert dict(image.leaders) == {"dispatcher": LeaderInfo("s1", "akka://flink@jm:6123"),
                             "rest_server": LeaderInfo("s1", "http://jm:8081")}
    assert ds[2].detail == "rest_server: session s1 at http://jm:8081"
    image, ds = _fold(_grant(1, "jm-1"), _publish(1, "jm-1", session="s1"),
                      _publish(1, "jm-1", address=None, session="s1"))
    assert ds[2].accepted and ds[2].detail == "dispatcher: deleted"
    assert dict(image.leaders) == {}
    # deleting what was never published is accepted and changes nothing
    image, ds = _fold(_grant(1, "jm-1"), _publish(1, "jm-1", "rm", None))
    assert ds[1].accepted and dict(image.leaders) == {}


def test_a_grant_and_a_revoke_clear_the_information() -> None:
    image, _ = _fold(_grant(1, "jm-1"), _publish(1, "jm-1"), _grant(2, "jm-2"))
    assert dict(image.leaders) == {}
    image, _ = _fold(_grant(1, "jm-1"), _publish(1, "jm-1"),
                     LeadershipRevoked(**_env(1, "jm-1")))
    assert dict(image.leaders) == {}
    # a refused grant (a lost compare-and-set) clears nothing
    image, ds = _fold(_grant(1, "jm-1"), _publish(1, "jm-1"), _grant(1, "jm-2"))
    assert ds[2].reason == "cas_failed" and "dispatcher" in image.leaders


def test_a_deposed_leaders_publication_is_refused_with_its_reason() -> None:
    image, ds = _fold(_grant(1, "jm-1"), _publish(1, "jm-1", session="s1"),
                      _grant(2, "jm-2"), _publish(2, "jm-2", session="s2"),
                      _publish(1, "jm-1", address="stale:1", session="s1"))
    late = ds[4]
    assert late.outcome == Outcome.REJECTED and late.reason == "stale_epoch"
    assert (late.expected_epoch, late.actual_epoch, late.leader) == (2, 1, "jm-2")
    assert late in image.rejected
    assert dict(image.leaders) == {"dispatcher": LeaderInfo("s2", "akka://flink@jm:6123")}


def test_only_the_current_unrevoked_terms_leader_publishes() -> None:
    cases = {
        "no_leader": [_publish(0, "jm-1")],
        "future_epoch": [_grant(1, "jm-1"), _publish(2, "jm-1")],
        "not_leader": [_grant(1, "jm-1"), _publish(1, "jm-2")],
        "term_revoked": [_grant(1, "jm-1"), LeadershipRevoked(**_env(1, "jm-1")),
                         _publish(1, "jm-1")],
    }
    for reason, events in cases.items():
        image, ds = _fold(*events)
        assert ds[-1].outcome == Outcome.REJECTED and ds[-1].reason == reason, reason
        assert dict(image.leaders) == {}


def test_malformed_information_is_refused_after_fencing() -> None:
    for bad in (dict(component="a/b"), dict(component=""), dict(session="x" * 201),
                dict(address=""), dict(address="a\nb"), dict(session="")):
        kw = dict(component="dispatcher", session="s", address="jm:1") | bad
        assert leader_information_error(kw["component"], kw["session"], kw["address"])
        event = _publish(1, "jm-1", **kw)  # type: ignore[arg-type]
        image, ds = _fold(_grant(1, "jm-1"), event)
        assert ds[1].reason == "bad_leader_information", bad
        assert dict(image.leaders) == {}
        # a stale one is fenced first: the deposed leader learns it is deposed
        _, ds = _fold(_grant(1, "jm-1"), _grant(2, "jm-2"), _publish(1, "jm-1", **kw))  # type: ignore[arg-type]
        assert ds[2].reason == "stale_epoch"
    assert leader_information_error("0123456789abcdef0123456789abcdef", "", None) is None


def test_the_key_is_per_term_writer_and_component() -> None:
    event = _publish(7, "jm-1", "rest_server")
    assert record_key(event) == leader_key(NS, 7, "jm-1", "rest_server") \
        == f"{NS}/leader/7/jm-1/rest_server"
    parsed = parse_key(record_key(event))
    assert parsed is not None and (parsed.namespace, parsed.kind, parsed.job_id) == (
        NS, "leader", None)
    # a publication under another key is refused
    delta = Delta(Image.empty(NS))
    delta.replay(LogRecord(0, record_key(_grant(1, "jm-1")).encode(), encode(_grant(1, "jm-1"))))
    wrong = _publish(1, "jm-1")
    d = delta.replay(LogRecord(1, f"{NS}/leader/1/jm-1/other".encode(), encode(wrong)))
    assert d.reason == "wrong_key"


# -- properties over random histories ---------------------------------------------

_component = st.sampled_from(["a", "b"])  # few components, so publications collide
_write = st.tuples(st.just("write"), st.sampled_from(["leader"] * 3 + ["jm-1", "jm-2"]),
                   st.sampled_from(["publish", "publish", "publish", "unpublish", "revoke",
                                    "renew"]),
                   _component, st.sampled_from([False] * 7 + [True]), st.integers(1, 6))
_raw = st.tuples(st.just("raw"), st.sampled_from(["publish", "publish", "revoke"]),
                 st.integers(0, 4), contender, _component, st.integers(0, 2))
# Late copies often: a copy of an older publication landing after a newer one is the
# hazard fold rule 9 settles.
_op = st.sampled_from([_write] * 6 + [st.tuples(st.just("claim"), contender)] * 2
                      + [st.tuples(st.just("sync"), contender), _raw]
                      + [st.tuples(st.just("dup"), st.integers(0, 50))] * 2 + [tick]).flatmap(
    lambda s: s)


def _build(ops) -> Sim:
    """The history, then the current leader (if any) writes once more within the lag: it
    settles what landed on its keys last (a new claim, as ``build`` ends with, would
    empty the leader information and prove nothing)."""
    sim = build(ops, settle=False)
    _settle_leader(sim)
    return sim


leader_histories = st.lists(_op, min_size=3, max_size=60).map(_build)


def _oracle(records: list[LogRecord]) -> dict[str, LeaderInfo]:
    """Rule 9 written out plainly from the fold's decisions: the accepted publications
    since the last accepted grant or revoke, the newest per component."""
    delta = Delta(Image.empty(NS))
    leaders: dict[str, LeaderInfo] = {}
    for r in records:
        d = delta.replay(r)
        e = delta.last_event
        if not d.accepted:
            continue
        if d.event_type in ("LeadershipGranted", "LeadershipRevoked"):
            leaders = {}
        elif isinstance(e, LeaderInformationPublished):
            assert e.epoch == delta.epoch and e.writer == delta.leader and not delta.revoked
            if e.address is None:
                leaders.pop(e.component, None)
            else:
                leaders[e.component] = LeaderInfo(e.session, e.address)
    return leaders


@SETTINGS
@given(leader_histories)
def test_the_image_holds_the_current_terms_newest_publications(sim) -> None:
    records = visible(sim.log)
    image = fold(records, NS)
    assert dict(image.leaders) == _oracle(records)
    # every publication of an older term than the current is refused, with its reason
    delta = Delta(Image.empty(NS))
    for r in records:
        d = delta.replay(r)
        if d.event_type == "LeaderInformationPublished" and d.epoch != delta.epoch:
            assert d.outcome in (Outcome.REJECTED, Outcome.DUPLICATE)
            assert d.reason in ("stale_epoch", "future_epoch", "no_leader", "duplicate")


@SETTINGS
@given(leader_histories, st.data())
def test_compaction_keeps_the_leader_information(sim, data) -> None:
    expected = fold(visible(sim.log), NS).answer()
    log, now = sim.log, sim.now
    for _ in range(data.draw(st.integers(1, 3), label="passes")):
        now += data.draw(st.sampled_from([0, TOPIC.min_compaction_lag_ms, 30 * DAY]),
                         label="advance")
        log = compact(log, now, data.draw(st.integers(0, len(log)), label="upto"))
    assert fold(visible(log), NS).answer() == expected


def _settle_leader(sim: Sim) -> None:
    image = sim.image()
    if image.leader is not None and not image.revoked \
            and sim.actors[image.leader].term == image.epoch:
        sim.sync(image.leader)
        sim.write(image.leader, None, None)


@SETTINGS
@given(leader_histories, st.data())
def test_a_late_copy_of_a_publication_changes_nothing_even_compacted(sim, data) -> None:
    """A re-sent publication whose first copy landed after all (within one duplicate
    window, fold rule 1's assumption) lands late, after newer ones: no effect, and once
    the leader has written again, none after compaction either."""
    window = sim.now // DUPLICATE_WINDOW_MS
    copies = [i for i in sim.client_records
              if sim.log[i].key.startswith(f"{NS}/leader/".encode())
              and sim.log[i].timestamp // DUPLICATE_WINDOW_MS + 1 >= window]
    if not copies:
        return
    r = sim.log[data.draw(st.sampled_from(copies))]
    expected = sim.image().answer()
    sim.append(r.key, r.value)
    assert sim.image().answer() == expected
    _settle_leader(sim)
    assert sim.image().answer() == expected
    assert fold(visible(compact(sim.log, sim.now + 30 * DAY)), NS).answer() == expected


def test_a_late_copy_of_an_older_publication_is_restated_by_the_leader() -> None:
    """The hazard: publications A then B of one component, then a late copy of A (a
    re-send that landed after all) is the key's newest record. The copy has no effect
    (rule 1), but once the cleaner removed A and B the copy alone would say A. The fold
    leaves the key unsettled and the leader restates B on it."""
    ops = [("claim", "jm-1"), ("write", "jm-1", "publish", "a", False, 1),
           ("write", "jm-1", "publish", "a", False, 2)]
    sim = build(ops, settle=False)
    first = sim.log[sim.client_records[0]]
    sim.append(first.key, first.value)  # the late copy of A
    image = sim.image()
    assert dict(image.leaders) == {"a": LeaderInfo("session-1", "addr-2")}
    assert list(image.unsettled) == [f"{NS}/leader/1/jm-1/a"]
    unsettled = sim.log[:]
    assert dict(fold(visible(compact(unsettled, sim.now + 30 * DAY)), NS).leaders) == {
        "a": LeaderInfo("session-1", "addr-1")}  # what the restatement prevents
    sim.sync("jm-1")
    sim.write("jm-1", None, None)  # the leader's next write restates the key
    assert not sim.image().unsettled
    compacted = compact(sim.log, sim.now + 30 * DAY)
    assert dict(fold(visible(compacted), NS).leaders) == {"a": LeaderInfo("session-1", "addr-2")}
    # a new term forgets the old term's unsettled leader keys (and their information)
    sim2 = build(ops, settle=False)
    own = sim2.log[sim2.client_records[0]]
    sim2.append(own.key, own.value)
    assert sim2.image().unsettled
    sim2.sync("jm-2")
    sim2.claim("jm-2")
    assert not sim2.image().unsettled and not sim2.image().leaders


@SETTINGS
@given(st.lists(_op, min_size=3, max_size=40).map(lambda ops: build(ops, settle=False)),
       st.data())
def test_a_snapshot_keeps_the_leader_information(sim, data) -> None:
    records = visible(sim.log)
    cut = data.draw(st.integers(0, len(records)))
    prefix = fold(records[:cut], NS)
    restored = decode_image(encode_image(prefix))
    assert restored == prefix and restored.leaders == prefix.leaders
    assert fold(records[cut:], restored) == fold(records, NS)
