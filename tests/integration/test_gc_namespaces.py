"""Issue 10, defect 3: one blob store shared by several namespaces and topics.

The default blob store is one directory for every namespace and topic. A
namespace's garbage collection must never delete a blob that a live job of
another namespace (or of the same namespace name on another topic) references:
incident 000's crash, a recovery failing with ``BlobMissing``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry import BlobMissing, EmbeddedBroker, GraphRef, JobStatus, Registry
from registry.blobs import FileBlobStore, collect
from registry.codec import encode
from registry.events import (
    JobCancelled,
    JobCleanedUp,
    JobSubmitted,
    JobTerminated,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold
from registry.image import LogRecord
from registry.keys import record_key

LIMIT = 64  # graphs over 64 bytes go to the blob store


@pytest.fixture
def shared(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Callable[..., Registry]]:
    """Factory ``shared(namespace, topic_index=0)``: registries on two fresh topics, one store."""
    topics = [f"jobreg-gcns-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    made: list[Registry] = []

    def make(namespace: str, topic_index: int = 0) -> Registry:
        reg = Registry.connect(broker.bootstrap, namespace, topic=topics[topic_index],
                               blob_store=tmp_path / "blobs", inline_limit=LIMIT)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def _path(ref: GraphRef) -> str:
    return ref.uri.removeprefix("file://")


@pytest.mark.integration
def test_gc_of_one_namespace_never_deletes_another_namespaces_live_graph(shared) -> None:
    """A cancels its job and collects with no grace; B's (and B-on-topic-2's) graphs survive."""
    a, b, b2 = shared("A"), shared("B"), shared("B", 1)
    ta, tb, tb2 = (r.claim_leadership("jm-1") for r in (a, b, b2))
    ta.submit("job-a", b"A" * 1000)
    ta.submit("same-a", b"S" * 1000)  # the same content as B's second job
    tb.submit("job-b", b"B" * 1000)
    tb.submit("same-b", b"S" * 1000)
    tb2.submit("job-b", b"T" * 1000)  # same namespace name, another topic
    refs = {name: reg.job(job).graph for name, reg, job in
            [("a", a, "job-a"), ("same-a", a, "same-a"), ("b", b, "job-b"),
             ("same-b", b, "same-b"), ("b2", b2, "job-b")]}
    assert all(isinstance(r, GraphRef) for r in refs.values())
    ta.cancel("job-a")
    ta.cancel("same-a")
    ta.cleanup(lambda view: None)  # their results are clean: the graphs may go
    time.sleep(0.01)  # every blob is older than the collection's "now"

    report = a.collect_garbage(0)

    # B's next recovery (a restart of B's coordinator) adopts its jobs with their graphs.
    for reg, expected in ((shared("B"), {"job-b": b"B" * 1000, "same-b": b"S" * 1000}),
                          (shared("B", 1), {"job-b": b"T" * 1000})):
        loaded: dict[str, bytes] = {}
        results = reg.claim_leadership("jm-2").recover(
            lambda job, loaded=loaded: loaded.__setitem__(job.job_id, job.graph))
        assert [r.error for r in results if not r.ok] == []
        assert loaded == expected
    for name in ("b", "same-b", "b2"):
        assert os.path.exists(_path(refs[name])), f"A's GC deleted {name}'s live graph"
    assert sorted(x.uri for x in report.deleted) == sorted([refs["a"].uri, refs["same-a"].uri])
    assert b.job("job-b").owner_epoch == 2 and b.job("same-b").owner_epoch == 2
    assert b2.job("job-b").owner_epoch == 2
    assert b.job("job-b").status == JobStatus.ACTIVE
    # B's and B-on-topic-2's own collections keep their live graphs and delete nothing of A's.
    assert b.collect_garbage(0).deleted == ()
    assert b2.collect_garbage(0).deleted == ()


@pytest.mark.integration
def test_a_foreign_graph_ref_is_copied_into_the_submitters_space(shared, tmp_path) -> None:
    """A GraphRef into another namespace's space (or the flat layout) is copied on submit,
    so the other namespace's GC cannot take it; one outside the store is carried as is."""
    a, b = shared("A"), shared("B")
    ta, tb = a.claim_leadership("jm-1"), b.claim_leadership("jm-1")
    tb.submit("job-b", b"G" * 1000)
    foreign = b.job("job-b").graph
    ta.submit("job-a", foreign)  # A reuses B's graph by reference
    mine = a.job("job-a").graph
    assert isinstance(mine, GraphRef) and mine.uri != foreign.uri
    assert (mine.sha256, mine.size) == (foreign.sha256, foreign.size)
    assert mine.uri in {x.uri for x in a.blob_store.list()}  # in A's own space
    # B drops its job and collects: its copy goes, A's stays and recovers.
    tb.cancel("job-b")
    tb.mark_clean("job-b")
    time.sleep(0.01)
    assert [x.uri for x in b.collect_garbage(0).deleted] == [foreign.uri]
    assert not os.path.exists(_path(foreign))
    loaded: list[bytes] = []
    results = shared("A").claim_leadership("jm-2").recover(lambda job: loaded.append(job.graph))
    assert [r.ok for r in results] == [True] and loaded == [b"G" * 1000]

    # A GraphRef of the flat layout of old is copied too; the old blob is left alone.
    flat = FileBlobStore(tmp_path / "blobs")
    old = flat.put(b"O" * 1000)
    tb.submit("from-old", old)
    copied = b.job("from-old").graph
    assert copied.uri != old.uri and b.blob_store.get(copied) == b"O" * 1000
    # A reference to a blob of the store that is not there is refused before any write.
    gone = flat.scoped(b.topic, "C").put(b"C" * 1000)
    flat.scoped(b.topic, "C").delete(gone.uri)
    with pytest.raises(BlobMissing):
        tb.submit("dangling", gone)
    assert "dangling" not in b.jobs(include_terminal=True)
    # A GraphRef outside the store is carried as is and never collected by jobreg.
    elsewhere = FileBlobStore(tmp_path / "elsewhere").put(b"E" * 1000)
    tb.submit("outside", elsewhere)
    assert b.job("outside").graph == elsewhere
    tb.cancel("outside")
    tb.mark_clean("outside")
    time.sleep(0.01)
    assert elsewhere.uri not in {x.uri for x in b.collect_garbage(0).deleted}
    assert os.path.exists(_path(elsewhere)) and os.path.exists(_path(old))


# -- the property: several namespaces on two topics share one store (no broker) ------------

SPACES = [(t, ns) for t in ("t1", "t2") for ns in ("A", "B", "C")]
space = st.integers(0, len(SPACES) - 1)
job = st.integers(0, 1)
content = st.integers(0, 2)  # few contents: the same bytes in several namespaces
pick = st.integers(0, 100)  # the n-th (mod count) existing job, in any space
grace = st.sampled_from([0, 10, 3600])
ns_op = st.one_of(
    st.tuples(st.just("submit"), space, job, content),
    st.tuples(st.just("reuse"), space, job, pick),  # submit another job's GraphRef
    st.tuples(st.just("legacy"), space, job, content),  # a record of before key spaces
    st.tuples(st.just("cancel"), pick),
    st.tuples(st.just("finish"), pick),
    st.tuples(st.just("clean"), pick),  # a result's cleanup is done
    st.tuples(st.just("gc"), space, grace),
    st.tuples(st.just("gc"), st.just(None), grace),  # every namespace collects
    st.tuples(st.just("age"), st.integers(0, 7200)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(ns_op, min_size=12, max_size=40))
def test_gc_never_deletes_a_live_graph_of_any_namespace_or_topic(tmp_path_factory, ops) -> None:
    """Random histories of six (topic, namespace) spaces of one store: large submits (shared
    contents), submits of other jobs' GraphRefs (copied, as ``Term.submit`` does), records
    of flat-layout blobs from before key spaces, ends and each namespace's own collections
    (``Registry.collect_garbage``: its own view, its own fold). After every step every live
    job of every namespace still loads and verifies, and no flat-layout blob is gone."""
    flat = FileBlobStore(tmp_path_factory.mktemp("blobs"))
    views = [flat.scoped(t, ns) for t, ns in SPACES]
    logs: list[list[LogRecord]] = [[] for _ in SPACES]

    def write(i: int, event) -> None:
        logs[i].append(LogRecord(len(logs[i]), record_key(event).encode(), encode(event)))

    def env(i: int) -> dict:
        return dict(namespace=SPACES[i][1], epoch=1, writer="jm", created_at=0)

    def fresh(ref: GraphRef) -> GraphRef:
        os.utime(_path(ref), (clock, clock))
        return ref

    def image(i: int):
        return fold(logs[i], SPACES[i][1])

    for i in range(len(SPACES)):
        write(i, LeadershipGranted(event_id=new_event_id(), prev_epoch=0, **env(i)))
    clock = time.time()
    legacy: set[str] = set()

    def jobs(*, live: bool) -> list[tuple[int, str, GraphRef]]:
        return [(k, v.job_id, v.graph) for k in range(len(SPACES)) for v in image(k).jobs.values()
                if isinstance(v.graph, GraphRef) and (v.live or not live)]

    for op in ops:
        kind, i = op[0], op[1]
        if kind in ("submit", "legacy"):  # the blob first, then the event
            store = views[i] if kind == "submit" else flat
            ref = fresh(store.put(bytes([op[3]]) * 500))
            if kind == "legacy":
                legacy.add(ref.uri)
            write(i, JobSubmitted(event_id=new_event_id(), job_id=f"j{op[2]}", graph=ref,
                                  **env(i)))
        elif kind == "reuse" and (known := jobs(live=False)):  # terminal ones too
            k, _, other = known[op[3] % len(known)]
            try:  # Term._graph: read and verify, put into our space, reference the copy
                data = views[i].get(other)
            except BlobMissing:  # collected already: the submit raises, writes nothing
                continue
            ref = fresh(views[i].put(data))
            assert Path(_path(ref)).parents[1] == flat.root.joinpath(*SPACES[i])  # ours
            write(i, JobSubmitted(event_id=new_event_id(), job_id=f"j{op[2]}", graph=ref,
                                  **env(i)))
        elif kind in ("cancel", "finish") and (live := jobs(live=True)):
            k, job_id, _ = live[op[1] % len(live)]
            cls = JobCancelled if kind == "cancel" else JobTerminated
            extra = {} if kind == "cancel" else {"state": "FINISHED"}
            view = image(k).jobs[job_id]  # the result it carries, as Term.cancel writes it
            write(k, cls(event_id=new_event_id(), job_id=job_id, graph=view.graph,
                         checkpoints=view.checkpoints, **extra, **env(k)))
        elif kind == "clean" and (dirty := [(k, v) for k in range(len(SPACES))
                                            for v in image(k).results(dirty=True).values()]):
            k, view = dirty[op[1] % len(dirty)]
            write(k, JobCleanedUp(event_id=new_event_id(), job_id=view.job_id,
                                  status=view.status, reason=view.reason, **env(k)))
        elif kind == "gc":  # Registry.collect_garbage of namespace i: its own view, its fold
            for k in range(len(SPACES)) if i is None else [i]:
                referenced = image(k).referenced_blobs()
                assert collect(views[k], referenced, grace_s=op[2], now=clock).errors == ()
        elif kind == "age":
            clock += op[1]
        for j in range(len(SPACES)):
            for view in image(j).jobs.values():  # live jobs, and dirty results (for cleanup)
                if isinstance(view.graph, GraphRef):
                    assert view.live or view.dirty
                    assert views[(j + 1) % len(SPACES)].get(view.graph)  # present and intact
        assert {b.uri for b in flat.list()} == legacy  # the flat layout is never collected
