"""Fold rule 3: a grant is a compare-and-set on the term's renewals too (issue 42, finding 3).

A contender's grant says what it saw of the term it replaces (``saw_renewal``: the highest
renewal ordinal it had folded); the fold refuses it (``renewed_since``) if the leader renewed
since. A renewal is keyed ``<ns>/term/<epoch>/lease/<attempts>/<renewal % 2>`` so that the
cleaner never removes the renewal a grant's verdict rests on: the compacted log decides every
grant as the full log does (exhaustively over small histories, and by hypothesis over longer
ones), which one lease key per term does not.
"""

from __future__ import annotations

import itertools
import os
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st
from support.histories import DAY, SETTINGS
from support.model import NS, Rec, Sim, compact, visible

import registry.keys
from registry.codec import encode
from registry.events import LeadershipGranted, LeaseRenewed
from registry.fold import Delta, fencing_reason, fold
from registry.image import Image, LogRecord, Outcome
from registry.keys import lease_key, parse_key, record_key


def _grant(epoch: int, writer: str, saw: int | None, event_id: str | None = None
           ) -> LeadershipGranted:
    return LeadershipGranted(event_id=event_id or f"g{epoch}-{writer}-{saw}", namespace=NS,
                             epoch=epoch, writer=writer, created_at=0, prev_epoch=epoch - 1,
                             lease_ms=2000, saw_renewal=saw)


def _renew(epoch: int, writer: str, renewal: int | None, attempts: int | None = 0,
           event_id: str | None = None) -> LeaseRenewed:
    return LeaseRenewed(event_id=event_id or f"r{epoch}-{writer}-{renewal}-{attempts}",
                        namespace=NS, epoch=epoch, writer=writer, created_at=0,
                        renewal=renewal, attempts=attempts)


def _records(events, keys=None) -> list[LogRecord]:
    keys = keys or {}
    return [LogRecord(i, keys.get(i, record_key(e)).encode(), encode(e), 0)
            for i, e in enumerate(events)]


def _decisions(records: list[LogRecord]):
    delta = Delta(Image.empty(NS))
    return [delta.replay(r) for r in records]


def test_a_grant_that_saw_an_older_renewal_is_refused_and_a_current_one_wins() -> None:
    events = [_grant(1, "jm-1", None), _renew(1, "jm-1", 1), _renew(1, "jm-1", 2),
              _grant(2, "jm-2", 1),   # read before renewal 2 landed
              _renew(1, "jm-1", 3, attempts=1),  # planned after folding the refused grant
              _grant(2, "jm-3", 3)]   # saw the newest renewal: wins
    ds = _decisions(_records(events))
    refused = ds[3]
    assert (refused.outcome, refused.reason) == (Outcome.REJECTED, "renewed_since")
    assert (refused.expected_epoch, refused.actual_epoch) == (2, 1)
    assert "renewed since" in refused.detail
    assert ds[4].outcome == Outcome.ACCEPTED  # the old term went on: it was never lost
    assert ds[5].outcome == Outcome.ACCEPTED
    image = fold(_records(events[:5]), NS)
    assert (image.epoch, image.leader) == (1, "jm-1")
    assert image.term is not None
    assert (image.term.renewal, image.term.renewals, image.term.refused_grants) == (3, 3, 1)
    after = fold(_records(events), NS)
    assert (after.epoch, after.leader) == (2, "jm-3")
    assert after.term is not None and (after.term.renewal, after.term.refused_grants) == (0, 0)


def test_a_grant_without_saw_renewal_compares_the_epoch_only() -> None:
    """An external election's claim (``claim_leadership``) and grants written before the
    field: ``saw_renewal`` ``None``."""
    events = [_grant(1, "jm-1", None), _renew(1, "jm-1", 1), _renew(1, "jm-1", 2),
              _grant(2, "jm-2", None)]
    assert _decisions(_records(events))[-1].outcome == Outcome.ACCEPTED
    # a cas_failed grant counts as a refused attempt too (its renewer keys apart after it)
    stale = [_grant(1, "jm-1", None), _grant(1, "jm-2", 0, event_id="late")]
    ds = _decisions(_records(stale))
    assert ds[-1].reason == "cas_failed"
    term = fold(_records(stale), NS).term
    assert term is not None and term.refused_grants == 1


def test_the_renewals_keys_and_the_old_one() -> None:
    assert lease_key(NS, 4, 2, 7) == f"{NS}/term/4/lease/2/1"
    assert lease_key(NS, 4, 0, 8) == f"{NS}/term/4/lease/0/0"
    assert lease_key(NS, 4) == f"{NS}/term/4/lease"
    assert record_key(_renew(4, "jm-1", 7, 2)) == f"{NS}/term/4/lease/2/1"
    assert record_key(_renew(4, "jm-1", None, None)) == f"{NS}/term/4/lease"
    parsed = parse_key(f"{NS}/term/4/lease/2/1")
    assert parsed is not None and parsed.kind == "term"
    # A renewal written before ordinals: on the term's one lease key, accepted, and it
    # raises no ordinal (a grant that saw 0 still wins after it).
    old = [_grant(1, "jm-1", None), _renew(1, "jm-1", None, None), _grant(2, "jm-2", 0)]
    assert [d.outcome for d in _decisions(_records(old))] == [Outcome.ACCEPTED] * 3
    # A renewal with an ordinal is accepted under its own key only.
    wrong = [_grant(1, "jm-1", None), _renew(1, "jm-1", 1)]
    ds = _decisions(_records(wrong, {1: f"{NS}/term/1/lease"}))
    assert ds[1].reason == "wrong_key"


def test_a_renewals_verdict_never_depends_on_its_ordinal() -> None:
    """Fencing only: a renewal whose ordinal is lower than the term's highest (or repeats
    it) is accepted, and the highest stays."""
    events = [_grant(1, "jm-1", None), _renew(1, "jm-1", 5), _renew(1, "jm-1", 2),
              _renew(1, "jm-2", 9), _renew(0, "jm-1", 9)]
    ds = _decisions(_records(events))
    assert [d.outcome for d in ds[1:3]] == [Outcome.ACCEPTED] * 2
    assert [d.reason for d in ds[3:]] == ["not_leader", "stale_epoch"]
    term = fold(_records(events), NS).term
    assert term is not None and term.renewal == 5


# -- compaction: the compacted log decides every grant as the full log does ----------------

LEADER, CONTENDER, OTHER = "jm-1", "jm-2", "jm-3"
ALPHABET = (
    ("write", LEADER, "renew", None),  # the leader renews, planned from what it had read
    ("sync", LEADER),                  # the leader reads (its renewer after a failure)
    ("sync", CONTENDER),               # a contender reads ...
    ("claim", CONTENDER),              # ... and claims from what it read
    ("write", CONTENDER, "renew", None),  # (once it leads, it renews too)
    ("sync", OTHER),
    ("claim", OTHER),
)


def _history(ops) -> Sim:
    sim = Sim()
    sim.claim(LEADER)
    sim.write(LEADER, "renew", None)
    for o in ops:
        if o[0] == "sync":
            sim.sync(o[1])
        elif o[0] == "claim":
            sim.claim(o[1], external=len(o) > 2)
        else:
            sim.write(o[1], o[2], o[3])
    return sim


def _grant_verdicts(records: list[LogRecord]) -> dict[str, tuple[str, str | None]]:
    return {d.event_id: (d.outcome, d.reason) for d in _decisions(records)
            if d.event_type == "LeadershipGranted" and d.event_id is not None}


def _divergence(log: list[Rec], now: int) -> str | None:
    """How some compaction of ``log`` decides a grant (or the answer) unlike the full log,
    or ``None``: every cut of the cleaner (each prefix it may clean) agrees."""
    whole = visible(log)
    grants, answer = _grant_verdicts(whole), fold(whole, NS).answer()[1:]
    for upto in range(len(log) + 1):
        cut = visible(compact(log, now, upto))
        got = _grant_verdicts(cut)
        if got != grants:
            return f"cut {upto}: grants {got} against {grants}"
        if fold(cut, NS).answer()[1:] != answer:
            return f"cut {upto}: the answer differs"
    return None


def _all_histories(length: int):
    for n in range(1, length + 1):
        yield from itertools.product(ALPHABET, repeat=n)


EXHAUSTIVE_LENGTH = int(os.environ.get("JOBREG_GRANT_CAS_LENGTH", "4"))


def test_every_small_history_decides_every_grant_alike_after_compaction() -> None:
    """Exhaustive up to ``$JOBREG_GRANT_CAS_LENGTH`` operations (default 4: 2,800 histories,
    each at every cleaner cut) after a grant and a first renewal: contenders that read and
    claim from stale reads, renewals planned before and after folding a refused grant, a
    deposed leader's (a zombie's) renewal after an accepted grant, the winner's renewals."""
    now = 10**12  # everything is older than the compaction lag
    explored = refused = 0
    for ops in _all_histories(EXHAUSTIVE_LENGTH):
        sim = _history(ops)
        assert (why := _divergence(sim.log, now)) is None, (ops, why)
        explored += 1
        refused += any(v == (Outcome.REJECTED, "renewed_since")
                       for v in _grant_verdicts(visible(sim.log)).values())
    assert explored == sum(len(ALPHABET) ** n for n in range(1, EXHAUSTIVE_LENGTH + 1))
    assert refused >= explored // 40, "the histories must exercise renewed_since"
    print(f"{explored} histories (up to {EXHAUSTIVE_LENGTH} operations), {refused} with a "
          "grant refused renewed_since: every cleaner cut agrees")


grant_cas_ops = st.lists(st.sampled_from(ALPHABET + (("claim", CONTENDER, "external"),)),
                         min_size=1, max_size=40)


@SETTINGS
@given(grant_cas_ops, st.integers(0, 40), st.sampled_from([0, 30 * DAY]))
def test_long_histories_decide_every_grant_alike_after_compaction(ops, upto, later) -> None:
    sim = _history(ops)
    whole = visible(sim.log)
    cut = visible(compact(sim.log, sim.now + later, upto))
    assert _grant_verdicts(cut) == _grant_verdicts(whole)
    assert fold(cut, NS).answer() == fold(whole, NS).answer()


def test_with_one_lease_key_per_term_the_cleaner_changes_a_grants_verdict() -> None:
    """Why renewals moved off ``<ns>/term/<epoch>/lease``: with one key per term, a renewal
    after a refused grant (the term goes on) is all the cleaner keeps of the renewals before
    it, and the compacted log accepts the grant the full log refused."""
    ops = [("sync", CONTENDER), ("write", LEADER, "renew", None), ("claim", CONTENDER),
           ("write", LEADER, "renew", None)]
    assert _divergence(_history(ops).log, 10**12) is None
    with mock.patch.object(registry.keys, "lease_key",
                           lambda ns, epoch, *_: f"{ns}/term/{epoch}/lease"):
        sim = _history(ops)
        assert {r.key for r in sim.log if b"lease" in (r.key or b"")} == {b"prod/term/1/lease"}
        assert _divergence(sim.log, 10**12) is not None
    # and so do the exhaustive histories: some of them diverge (4 operations suffice)
    with mock.patch.object(registry.keys, "lease_key",
                           lambda ns, epoch, *_: f"{ns}/term/{epoch}/lease"):
        assert any(_divergence(_history(o).log, 10**12) for o in _all_histories(4))


def test_a_renewal_resent_verbatim_around_a_grant_would_change_the_grants_verdict() -> None:
    """Why the write path never re-sends a renewal (``TermWrites.send``; the renewer plans a
    new one instead): a first copy whose write timed out lands before a grant, the re-sent
    copy after it, on the same key; the cleaner removes the first, which the grant's
    refusal rests on, and the compacted log accepts the grant."""
    r2 = _renew(1, "jm-1", 2)
    events = [_grant(1, "jm-1", None), _renew(1, "jm-1", 1),
              r2,                     # the first copy: its write timed out, unseen
              _grant(2, "jm-2", 1),   # a contender that read before it: refused
              r2]                     # a verbatim re-send: a duplicate, on r2's key
    log = [Rec(r.offset, r.key, r.value, 0) for r in _records(events)]
    whole = _grant_verdicts(visible(log))
    assert whole[events[3].event_id] == (Outcome.REJECTED, "renewed_since")
    assert _divergence(log, 10**12) is not None


def _history_in_doubt(ops, count_failures: bool = True) -> Sim:
    """:func:`_history` with renewals whose outcome is unknown: ``("send",)`` is a renewal
    the leader plans and sends (its ordinal counts as sent) whose write fails without an
    answer, so the leader reads nothing through it; ``("land",)`` is the oldest such
    renewal reaching the log after all, later (as an in-doubt record can). The renewer
    counts each such renewal (``unconfirmed``) in the ``attempts`` of the ones it plans
    after it, as :class:`registry.election.Election` does."""
    sim = Sim()
    sim.claim(LEADER)
    sim.write(LEADER, "renew", None)
    flying: list[tuple[str, bytes]] = []
    for o in ops:
        if o[0] == "send":
            a = sim.actors[LEADER]
            if a.term is None:
                continue
            view = sim.image(a.seen)
            if fencing_reason(view.epoch, view.leader, view.revoked, a.term, LEADER):
                continue  # the client sends nothing once its image shows the term over
            info = view.term if view.term is not None and view.term.epoch == a.term else None
            a.renewal = max(info.renewal if info else 0, a.renewal) + 1
            e = _renew(a.term, LEADER, a.renewal,
                       a.unconfirmed + (info.refused_grants if info else 0),
                       event_id=f"doubt-{a.renewal}")
            flying.append((record_key(e), encode(e)))
            a.unconfirmed += count_failures
        elif o[0] == "land":
            if flying:
                sim.append(*flying.pop(0))
        elif o[0] == "sync":
            sim.sync(o[1])
        elif o[0] == "claim":
            sim.claim(o[1])
        else:
            sim.write(o[1], o[2], o[3])
    return sim


def test_renewals_in_doubt_keep_every_grants_verdict() -> None:
    """Exhaustive up to ``$JOBREG_GRANT_CAS_DOUBT_LENGTH`` operations (default 5: 9,330
    histories, each at every cleaner cut): renewals whose write failed and that land later
    (after the next renewal, after a grant) never remove the renewal a grant's refusal
    rests on, because the renewer moves the renewals it plans after a failure to keys of
    their own (found by this test: with ``attempts`` counting refused grants only, 72 of
    the histories of up to 6 operations diverged, the shortest of 5: the contender reads,
    the leader renews (2), a renewal (3) fails unseen, the contender's grant is refused,
    and the leader's next renewal (4) lands on renewal 2's key)."""
    alphabet = (("send",), ("land",), ("write", LEADER, "renew", None), ("sync", LEADER),
                ("sync", CONTENDER), ("claim", CONTENDER))
    length = int(os.environ.get("JOBREG_GRANT_CAS_DOUBT_LENGTH", "5"))
    explored = 0
    for n in range(1, length + 1):
        for ops in itertools.product(alphabet, repeat=n):
            assert (why := _divergence(_history_in_doubt(ops).log, 10**12)) is None, (ops, why)
            explored += 1
    print(f"{explored} histories with renewals in doubt (up to {length} operations): every "
          "cleaner cut agrees")

    # Counting refused grants only (failures not counted), the search finds divergences.
    assert any(_divergence(_history_in_doubt(ops, count_failures=False).log, 10**12)
               for ops in itertools.product(alphabet, repeat=5))


def test_a_snapshot_keeps_the_terms_renewal_and_refused_grants() -> None:
    from registry.snapshot import decode_image, encode_image

    events = [_grant(1, "jm-1", None), _renew(1, "jm-1", 1), _renew(1, "jm-1", 2),
              _grant(2, "jm-2", 1), _renew(1, "jm-1", 3, attempts=1)]
    image = fold(_records(events), NS)
    back = decode_image(encode_image(image))
    assert back == image
    assert back.term is not None and (back.term.renewal, back.term.refused_grants) == (3, 1)
    # folding on from the snapshot decides the next grants as a full fold does
    more = _records(events + [_grant(2, "jm-3", 2), _grant(2, "jm-3", 3, event_id="g3")])
    on = fold(more[len(events):], back)
    assert on.answer() == fold(more, NS).answer() and on.leader == "jm-3"
    assert on.rejected[-1].reason == "renewed_since"


def test_records_written_before_rule_3_fold_as_they_did() -> None:
    """A grant of ``LeadershipGranted`` v2 and a renewal of ``LeaseRenewed`` v1 (no
    ``saw_renewal``, no ordinal, the term's one lease key) decode with the new fields
    ``None`` and fold as before: the grant compares epochs only."""
    from support.model import encode_with

    from registry.wire import default_codec

    codec = default_codec()
    ids = {(e.type, e.version): e.id for e in codec.catalog.entries()}
    renew = _renew(1, "jm-1", None, None)
    grant = _grant(2, "jm-2", None)
    old = [encode(_grant(1, "jm-1", None)), encode_with(renew, ids[("LeaseRenewed", 1)]),
           encode_with(grant, ids[("LeadershipGranted", 2)])]
    decoded = [codec.decode(v) for v in old[1:]]
    assert decoded[0].renewal is None and decoded[0].attempts is None
    assert decoded[1].saw_renewal is None
    keys = [record_key(_grant(1, "jm-1", None)), f"{NS}/term/1/lease", record_key(grant)]
    records = [LogRecord(i, k.encode(), v, 0) for i, (k, v) in enumerate(zip(keys, old, strict=True))]
    assert [d.outcome for d in _decisions(records)] == [Outcome.ACCEPTED] * 3
