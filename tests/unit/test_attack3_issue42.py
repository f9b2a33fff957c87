"""Third adversarial pass against issue 42's births layout (0190592): submits under
<ns>/job/<id>/birth/<event_id>, grant layout 1, rule 8 all-or-none over present members,
_holds, the due-birth restatement (a helper that did not write the change).

Each test failed on 0190592 as written by the attacker. Fixed since: a call is re-sent
verbatim, records and commit (``registry.writes._own_key``), and a verbatim copy of a birth
makes the birth due again (it moved it later); a refused submit of a job whose birth lies
under no birth key yet is removed (ABSENT) by the leader; a reassertion restating a result
takes the checkpoints it carries (a result's never grow)."""

from __future__ import annotations

import dataclasses

from support.histories import DAY, build
from support.model import NS, Sim, compact, visible

from registry.codec import default_codec, encode
from registry.events import (
    CallCommitted,
    InlineGraph,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold, plan_collection, plan_reassertions
from registry.image import Outcome
from registry.keys import job_key, record_key

CODEC = default_codec()


def _legal_cuts(log):
    """Every cut the cleaner may have made at some time: for each prefix, cuts up to the
    first record whose offset an unsettled key of that prefix's fold names (README
    assumption 1); a cut legal at a prefix is legal for the whole log (compaction looks at
    [0, cut) only)."""
    best = 0
    for p in range(len(log) + 1):
        img = fold(visible(log[:p]), NS)
        offs = set(img.unsettled.values())
        bound = min((i for i, r in enumerate(log[:p]) if r.offset in offs), default=p)
        best = max(best, bound)
    return range(best + 1)


def _compacted(log, c):
    return visible(compact(log, log[-1].timestamp + 40 * DAY, upto=c))


def _decisions(records):
    """offset -> final outcome (call members: their decision at the commit)."""
    from registry.fold import fold_batches
    from registry.image import Image
    out = {}
    fold_batches([records], Image.empty(NS), on_decision=lambda d: out.__setitem__(d.offset, d))
    return out


def _check_every_cut(log):
    """Assert (a) answer equality and (b) no refusal becomes an acceptance at every legal cut;
    returns the list of failures (cut, what)."""
    full_records = visible(log)
    full = fold(full_records, NS)
    full_d = _decisions(full_records)
    bad = []
    for c in _legal_cuts(log):
        recs = _compacted(log, c)
        img = fold(recs, NS)
        if img.answer() != full.answer():
            bad.append((c, "answer", {k: (full.jobs.get(k), img.jobs.get(k))
                                      for k in sorted(set(full.jobs) | set(img.jobs))
                                      if full.jobs.get(k) != img.jobs.get(k)}))
        for off, d in _decisions(recs).items():
            f = full_d.get(off)
            if f is not None and f.outcome == Outcome.REJECTED and d.outcome == Outcome.ACCEPTED:
                bad.append((c, "refusal_accepted", off, f.event_type, f.reason))
    return bad


def _append_event(sim: Sim, key: str, ev) -> None:
    sim.append(key, encode(ev))


# ---------------------------------------------------------------------------------------------


def test_a_resent_call_of_submits_loses_its_jobs_once_the_first_commit_is_cleaned() -> None:
    """History (honest: the client's own re-send, registry/writes.py): the leader (layout 1)
    calls submit_many(a, b). The write times out, the sync does not see the records yet (in
    flight), and the client re-sends the call: each submit under a key of its own gets a fresh
    event id and a fresh birth key (``_own_key``), but keeps ``call_id`` X; the commit
    (``call/X``, not an own key) is re-sent verbatim. Both copies land, the first first:
    m_a (Ba), m_b (Bb), commit X, m_a' (Ba'), m_b' (Bb'), commit X (copy).

    Full fold: X commits a and b (acknowledged: the client's ``decided`` takes the accepted
    copy); the commit copy is a DUPLICATE, m_a' and m_b' wait on X (PENDING) until the next
    grant refuses them (call_not_committed). Nothing is unsettled (the call key is never
    tracked; the refused copies are on birth keys of jobs that exist).

    Broken: (a) and (d), live jobs lost. The cleaner keeps the newest record of call/X, the
    copy: the compacted fold never sees the first commit, so all four members wait on X and
    the copy commits them: 4 records for size 2, m_a and m_b are applied, m_a' is refused
    (call_size_mismatch, or job_exists) and sinks the call all-or-none: a and b do not exist.
    Before births had keys of their own the copies were verbatim on the same keys (and
    superseded the first copies), so this is new with births under fresh keys.

    Fix: re-send the members of a call under their old birth keys and ids (a call member's
    birth key is not "its own" for re-sending: the verbatim copy is a duplicate while the
    window lasts and the cleaner keeps one), or re-send the commit under a fresh id too
    (a fresh call: fresh call_id in every member), or have the fold ignore members of a call
    whose commit it already applied / bind a commit to its member event ids."""
    sim = build([("claim", "jm-1"), ("write", "jm-1", "submit_many", "a", False, 2)],
                settle=False)
    call = [(r.key.decode(), CODEC.decode(r.value)) for r in sim.log
            if r.value is not None and getattr(CODEC.decode(r.value), "call_id", None)
            or (r.value is not None and isinstance(CODEC.decode(r.value), CallCommitted))]
    assert [type(e).__name__ for _, e in call] == ["JobSubmitted", "JobSubmitted",
                                                    "CallCommitted"]
    # the client's re-send of the whole call (writes.py: a call of submits as a fresh call,
    # its records, keys and commit fresh)
    fresh_call = new_event_id()
    for key, ev in call:
        fresh = fresh_call if isinstance(ev, CallCommitted) else new_event_id()
        changes = {"event_id": fresh} if isinstance(ev, CallCommitted) else {
            "event_id": fresh, "call_id": fresh_call}
        _append_event(sim, key.replace(ev.event_id, fresh), dataclasses.replace(ev, **changes))
    full = fold(visible(sim.log), NS)
    # the copy is a call of its own, sunk (job_exists) and standing under its own keys
    assert set(full.jobs) == {"a", "b"} and not full.unsettled
    sim.settle()  # a leader within the lag; its grant refuses the copies (call_not_committed)
    full = fold(visible(sim.log), NS)
    assert set(full.jobs) == {"a", "b"} and not full.unsettled, full.unsettled
    bad = _check_every_cut(sim.log)
    assert not bad, bad[:3]


def _grant(epoch, writer, layout):
    return LeadershipGranted(event_id=new_event_id(), namespace=NS, epoch=epoch, writer=writer,
                             created_at=0, prev_epoch=epoch - 1, saw_renewal=None,
                             layout=layout)


def _settle(sim: Sim, epoch, writer):
    """The leader reads everything and writes what plan_reassertions plans (Term.reassert)."""
    for _ in range(5):
        for key in plan_collection(fold(visible(sim.log), NS), first=True):
            sim.append(key, None)  # fold rule 6: collected before anything is restated
        pairs = plan_reassertions(fold(visible(sim.log), NS), epoch, writer)
        if not pairs:
            return
        for k, e in pairs:
            _append_event(sim, k, e)
    raise AssertionError("plan_reassertions keeps planning")


def test_a_raw_submit_before_a_legacy_jobs_birth_is_restated_is_accepted_after_compaction(
) -> None:
    """History (legacy, then layout 1; one raw record with the leader's credentials, as the
    checker's raw alphabet draws): a jobreg of layout 0 (grant epoch 1) submits a under its
    job key. Grant epoch 2 of layout 1: a is due (``unsettled`` holds prod/job/a/birth/).
    Before the leader's restatement lands, a raw JobSubmitted of a (epoch 2, the leader's
    name: finding 2's write planned from an older image) lands under its own birth key Bz:
    refused job_exists (a exists, born under its job key). The leader settles: a's birth is
    restated under a fresh birth key Bn. Later a raw junk record on a's job key makes it
    unsettled, and the leader reasserts a's whole state there (R), which supersedes the
    legacy submit. Nothing is unsettled.

    Broken: (b) a refusal becomes an acceptance. In every log cleaned past R, a's legacy
    submit is gone and Bn and R come after Bz: at Bz the compacted fold knows no a and
    accepts the raw submit (a ACTIVE with the raw graph until Bn restates it). The answer is
    repaired by Bn (whole state), so only the verdict differs; but a refused birth key now
    reads as a's birth in the compacted log, and every verdict between Bz and Bn on a's
    other keys is taken against the raw submit's state.

    Fix: a job known by its job-key birth only (born_by None) is known through its job key,
    which the cleaner can supersede: refuse (``wrong_key`` / ``job_exists``-proof) a submit
    under a birth key while any job is due (births_keyed and some live job with born_by
    None), or keep the "birth/" due key and the refused birth's key unsettled until the
    restatement (so no cut passes Bz while the legacy submit is what it rests on), or
    restate due births in the grant's own transaction (the grant record itself could carry
    the restated births)."""
    sim = Sim()
    _append_event(sim, *(lambda g: (record_key(g), g))(_grant(1, "jm-1", 0)))
    legacy = JobSubmitted(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",
                          created_at=0, job_id="a", graph=InlineGraph(b"graph-a"))
    _append_event(sim, job_key(NS, "a"), legacy)  # layout 0: submits under the job key
    g2 = _grant(2, "jm-1", 1)
    _append_event(sim, record_key(g2), g2)
    assert "prod/job/a/birth/" in fold(visible(sim.log), NS).unsettled
    raw = JobSubmitted(event_id=new_event_id(), namespace=NS, epoch=2, writer="jm-1",
                       created_at=0, job_id="a", graph=InlineGraph(b"raw"))
    _append_event(sim, record_key(raw), raw)
    _settle(sim, 2, "jm-1")  # Bn: a's birth restated under a fresh birth key
    sim.append(job_key(NS, "a"), b"\x00\x00\x00\x00\x63not avro at all")  # junk on the job key
    _settle(sim, 2, "jm-1")  # R: a's whole state on its job key
    full = fold(visible(sim.log), NS)
    assert not full.unsettled and full.jobs["a"].live
    bad = _check_every_cut(sim.log)
    assert not bad, bad[:3]


def test_a_refused_trigger_on_a_legacy_ended_job_is_taken_once_its_job_key_end_is_cleaned(
) -> None:
    """History (found by a random search of layout-0 then layout-1 histories; the end under
    the job key is a jobreg of layout 0's, here without a copy of the result, as a raw or
    older writer's): grant epoch 1 (layout 0), submit a; a's cancel under its job key
    (accepted, its copy differs: the job key is to be restated, and a's end is due under an
    end key); a trigger of checkpoint 4 on a's checkpoints key: refused terminal_job, and,
    a dirty result's checkpoints key being held (``_holds``), unsettled. The leader settles
    in plan_reassertions' order: R_job (job key, CANCELLED, checkpoints seq 0), R_cp
    (checkpoints key), R_end (a fresh end key). Nothing is unsettled.

    Broken: (a) and (b). A cut between R_job and R_cp (legal once all is settled: the cleaner
    cleans any prefix of records older than the lag) drops the cancel (superseded by R_job)
    and keeps the refused trigger (R_cp is at the cut). The compacted fold sees a live a at the
    trigger and accepts it (seq 1, pending (4,)); R_job and R_cp then keep that state, since
    ``_restated_checkpoints`` takes a carried state only if it is not older than the fold's
    (seq 0 < 1, newest id -1 < 4): a's result holds checkpoint 4, which was never accepted.

    Fix: plan the due end (``<ns>/job/<id>/end/``) and due births before the keys they are
    restated from (R_end before R_job, so no cut removes the legacy end before its
    restatement lies under an end key); or, for a terminal job, take a reassertion's carried
    checkpoints (no checkpoint record is accepted after an end, so the fold's newer state
    can only come from a record the full fold refused)."""
    from support.model import checkpoint_event

    from registry.events import CheckpointTriggered, JobCancelled
    sim = Sim()
    g1 = _grant(1, "jm-1", 0)
    _append_event(sim, record_key(g1), g1)
    common = lambda: dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1",  # noqa: E731
                          created_at=0)
    sub = JobSubmitted(job_id="a", graph=InlineGraph(b"graph-a"), **common())
    _append_event(sim, record_key(sub), sub)
    live = fold(visible(sim.log), NS).jobs["a"]
    cancel = JobCancelled(job_id="a", **common())  # under the job key, no copy of the result
    _append_event(sim, job_key(NS, "a"), cancel)
    trig = checkpoint_event(live, CheckpointTriggered, 4, common())  # from a view before it
    _append_event(sim, record_key(trig), trig)
    full = fold(visible(sim.log), NS)
    assert full.jobs["a"].status == "CANCELLED" and full.jobs["a"].checkpoints.seq == 0
    _settle(sim, 1, "jm-1")
    full = fold(visible(sim.log), NS)
    assert not full.unsettled, full.unsettled
    assert full.jobs["a"].checkpoints.pending == ()
    bad = _check_every_cut(sim.log)
    # The answer holds at every cut. The trigger's verdict does not: an end under the job's
    # key (a jobreg before ends had keys of their own) is a fact the cleaner can remove until
    # the leader restates it under an end key (README, the table of refusals), and a record
    # between the two reads as a live job's there.
    restated = max(i for i, r in enumerate(sim.log) if b"/end/" in r.key)
    assert [b for b in bad if b[1] != "refusal_accepted"
            or b[2] >= sim.log[restated].offset] == [], bad[:3]
