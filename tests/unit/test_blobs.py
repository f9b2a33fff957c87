"""Unit tests of the blob store and its garbage collection (no broker)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.blobs import (
    BlobInfo,
    BlobStore,
    CollectionReport,
    FileBlobStore,
    collect,
    open_blob_store,
    plan_collection,
)
from registry.errors import BlobCorrupt, BlobError, BlobMissing, ConfigError
from registry.events import GraphRef

DAY = 86_400.0


@pytest.fixture
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "blobs")


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def path_of(ref: GraphRef | BlobInfo) -> Path:
    return Path(url2pathname(urlsplit(ref.uri).path))


def age(ref: GraphRef | BlobInfo, seconds: float) -> None:
    """Set the blob's mtime ``seconds`` into the past."""
    path = path_of(ref)
    t = time.time() - seconds
    os.utime(path, (t, t))


class SimulatedCrash(BaseException):
    """The process dies here: no except/cleanup for ordinary errors runs."""


# -- put / get -------------------------------------------------------------------------------


def test_round_trip_and_layout(store: FileBlobStore) -> None:
    data = b"job graph \x00\xff" * 100
    ref = store.put(data)
    sha = hashlib.sha256(data).hexdigest()
    assert ref == GraphRef((store.root / sha[:2] / sha).as_uri(), sha, len(data))
    assert ref.uri.startswith("file:///")
    assert store.get(ref) == data
    assert store.exists(ref)
    assert [b.uri for b in store.list()] == [ref.uri]


def test_put_is_idempotent(store: FileBlobStore) -> None:
    ref1 = store.put(b"same bytes")
    ref2 = store.put(b"same bytes")
    assert ref1 == ref2
    assert len(all_files(store.root)) == 1


def test_reput_touches_mtime_without_rewriting(store: FileBlobStore) -> None:
    ref = store.put(b"old blob")
    age(ref, 10 * DAY)
    path = store.root / ref.sha256[:2] / ref.sha256
    inode = path.stat().st_ino
    store.put(b"old blob")
    assert path.stat().st_ino == inode  # not rewritten
    assert path.stat().st_mtime > time.time() - 60  # young again: GC must not take it


def test_put_repairs_a_blob_of_the_wrong_size(store: FileBlobStore) -> None:
    ref = store.put(b"0123456789")
    path_of(ref).write_bytes(b"0123")
    assert store.put(b"0123456789") == ref
    assert store.get(ref) == b"0123456789"


def test_different_bytes_different_refs(store: FileBlobStore) -> None:
    a, b = store.put(b"a"), store.put(b"b")
    assert a.uri != b.uri and a.sha256 != b.sha256
    assert store.get(a) == b"a" and store.get(b) == b"b"
    assert len(list(store.list())) == 2


def test_empty_bytes(store: FileBlobStore) -> None:
    ref = store.put(b"")
    assert ref.size == 0
    assert ref.sha256 == hashlib.sha256(b"").hexdigest()
    assert store.get(ref) == b""


def test_five_mib(store: FileBlobStore) -> None:
    data = os.urandom(5 * 1024 * 1024)
    ref = store.put(data)
    assert ref.size == len(data)
    assert store.get(ref) == data


def test_put_fsyncs_file_and_directory(
    store: FileBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        kinds.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store.put(b"durable")
    assert "file" in kinds and "dir" in kinds
    assert kinds.index("file") < len(kinds) - 1 - kinds[::-1].index("dir")  # file, then its dir


# -- get failures --------------------------------------------------------------------------


def test_get_missing(store: FileBlobStore) -> None:
    ref = store.put(b"here today")
    assert store.delete(ref.uri)
    with pytest.raises(BlobMissing, match=ref.sha256):
        store.get(ref)
    assert not store.exists(ref)
    never = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(BlobMissing):
        store.get(GraphRef((store.root / never[:2] / never).as_uri(), never, 12))


def test_get_altered_same_size(store: FileBlobStore) -> None:
    ref = store.put(b"original content")
    path_of(ref).write_bytes(b"ORIGINAL CONTENT")
    with pytest.raises(BlobCorrupt, match="sha256"):
        store.get(ref)
    assert store.exists(ref)  # present, if not intact


def test_get_truncated(store: FileBlobStore) -> None:
    ref = store.put(b"a longer blob that will be cut")
    path_of(ref).write_bytes(b"a longer")
    with pytest.raises(BlobCorrupt, match="bytes"):
        store.get(ref)


def test_get_ref_whose_size_lies(store: FileBlobStore) -> None:
    ref = store.put(b"twelve bytes")
    with pytest.raises(BlobCorrupt):
        store.get(dataclasses.replace(ref, size=13))
    with pytest.raises(BlobCorrupt):
        store.get(dataclasses.replace(ref, sha256="0" * 64))


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "file:///{root}/../outside/{sha}",
        "file:///{root}/{sha}",  # in root, but not in the layout
        "file:///{root}/{sha2}/{sha}",  # wrong shard
        "file://otherhost/{root}/{sha2}/{sha}",
        "s3://bucket/{sha}",
        "/{root}/{sha2}/{sha}",  # a path, not a uri
    ],
)
def test_get_uri_outside_root(store: FileBlobStore, tmp_path: Path, uri: str) -> None:
    ref = store.put(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ref.sha256).write_bytes(b"x")
    wrong_shard = "00" if ref.sha256[:2] != "00" else "01"
    uri = uri.format(root=str(store.root).lstrip("/"), sha=ref.sha256, sha2=wrong_shard)
    bad = dataclasses.replace(ref, uri=uri)
    with pytest.raises(ConfigError):
        store.get(bad)
    with pytest.raises(ConfigError):
        store.delete(uri)
    assert store.get(ref) == b"x" and (outside / ref.sha256).exists()


def test_equivalent_spelling_of_a_uri_is_accepted(store: FileBlobStore) -> None:
    ref = store.put(b"y")
    shard = ref.sha256[:2]
    roundabout = (store.root / shard / ".." / shard / ref.sha256).as_uri()
    assert store.get(dataclasses.replace(ref, uri=roundabout)) == b"y"


def test_read_error_is_wrapped(store: FileBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = store.put(b"unreadable")
    real_open = open

    def failing_open(file, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file).endswith(ref.sha256):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(BlobError, match=ref.sha256) as info:
        store.get(ref)
    assert isinstance(info.value.__cause__, PermissionError)


# -- atomicity -------------------------------------------------------------------------------


def test_crash_before_rename_leaves_only_a_temp_file(
    store: FileBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"a graph written when the process died"

    def crash(*args: object, **kwargs: object) -> None:
        raise SimulatedCrash

    with monkeypatch.context() as m:
        m.setattr(os, "replace", crash)
        with pytest.raises(SimulatedCrash):
            store.put(data)

    sha = hashlib.sha256(data).hexdigest()
    assert not (store.root / sha[:2] / sha).exists()
    assert list(store.list()) == []
    leftovers = all_files(store.root)
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".tmp-")
    assert leftovers[0].read_bytes() == data  # complete, but never under a final name

    assert store.sweep_temp(3600) == 0  # too young for the default sweep
    assert store.sweep_temp(0) == 1
    assert all_files(store.root) == []

    ref = store.put(data)
    assert store.get(ref) == data
    assert all_files(store.root) == [store.root / sha[:2] / sha]


def test_os_error_during_put_is_wrapped_and_cleans_up(
    store: FileBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(BlobError, match="cannot write blob") as info:
        store.put(b"does not fit")
    assert isinstance(info.value.__cause__, OSError)
    assert hashlib.sha256(b"does not fit").hexdigest() in str(info.value)
    assert all_files(store.root) == []


def test_list_skips_temp_and_stray_files(store: FileBlobStore) -> None:
    ref = store.put(b"real")
    shard = store.root / ref.sha256[:2]
    (shard / ".tmp-deadbeef").write_bytes(b"half")
    (shard / "README").write_bytes(b"not a blob")
    (store.root / "notes.txt").write_bytes(b"not a blob")
    (store.root / "zz").mkdir()
    (store.root / "zz" / ("z" * 64)).write_bytes(b"not a blob")
    infos = list(store.list())
    assert infos == [BlobInfo(ref.uri, ref.sha256, 4, infos[0].mtime)]
    assert abs(infos[0].mtime - time.time()) < 60


def test_sweep_temp_keeps_young_temp_files(store: FileBlobStore) -> None:
    ref = store.put(b"real")
    shard = store.root / ref.sha256[:2]
    old, young = shard / ".tmp-old", shard / ".tmp-young"
    old.write_bytes(b"")
    young.write_bytes(b"")
    t = time.time() - 2 * 3600
    os.utime(old, (t, t))
    assert store.sweep_temp() == 1
    assert not old.exists() and young.exists()
    assert store.get(ref) == b"real"
    with pytest.raises(ConfigError):
        store.sweep_temp(-1)


def test_delete_true_then_false(store: FileBlobStore) -> None:
    ref = store.put(b"delete me")
    assert store.delete(ref.uri) is True
    assert store.delete(ref.uri) is False
    assert list(store.list()) == []


def minimal(store: FileBlobStore) -> BlobStore:
    """A store with only the four abstract methods (``store``'s): every other method is the
    base class's default."""

    class Minimal(BlobStore):
        put = store.put
        get = store.get
        list = store.list
        delete = store.delete

    return Minimal()


def test_default_exists_uses_get(store: FileBlobStore) -> None:
    m = minimal(store)
    ref = m.put(b"present")
    assert m.exists(ref)
    path_of(ref).write_bytes(b"PRESENT")
    assert m.exists(ref)  # corrupt is still present
    m.delete(ref.uri)
    assert not m.exists(ref)


# -- plan_collection -------------------------------------------------------------------------

times = st.floats(min_value=0, max_value=2e9, allow_nan=False)


@st.composite
def gc_cases(draw: st.DrawFn) -> tuple[set[str], list[BlobInfo], float, float]:
    shas = draw(st.lists(st.binary(max_size=8), max_size=30, unique=True))
    blobs = []
    for raw in shas:
        sha = hashlib.sha256(raw).hexdigest()
        blobs.append(BlobInfo(f"file:///b/{sha[:2]}/{sha}", sha, len(raw), draw(times)))
    referenced = {b.uri for b in blobs if draw(st.booleans())}
    referenced |= draw(st.sets(st.text(max_size=20), max_size=5))  # refs to blobs not listed
    now = draw(times)
    grace = draw(st.one_of(st.just(0.0), st.floats(min_value=0, max_value=1e9)))
    if blobs and draw(st.booleans()):  # hit the boundary mtime == now - grace exactly
        i = draw(st.integers(0, len(blobs) - 1))
        blobs[i] = dataclasses.replace(blobs[i], mtime=now - grace)
    return referenced, blobs, grace, now


@settings(max_examples=300, deadline=None)
@given(gc_cases())
def test_plan_collection_properties(case: tuple[set[str], list[BlobInfo], float, float]) -> None:
    referenced, blobs, grace, now = case
    plan = plan_collection(iter(referenced), iter(blobs), grace_s=grace, now=now)
    planned = {b.uri for b in plan}
    assert not planned & referenced  # never a referenced blob
    assert all(b.mtime <= now - grace for b in plan)  # every planned one is old
    for b in blobs:  # every unreferenced old one is planned
        if b.uri not in referenced and b.mtime <= now - grace:
            assert b.uri in planned
    assert [b for b in blobs if b.uri in planned] == plan  # order kept, nothing invented


def test_plan_collection_rejects_bad_arguments() -> None:
    blob = BlobInfo("file:///b/aa/aa", "aa", 1, 0.0)
    with pytest.raises(ConfigError, match="grace_s"):
        plan_collection([], [blob], grace_s=-1, now=100)
    with pytest.raises(ConfigError, match="grace_s"):
        plan_collection([], [blob], grace_s=float("nan"), now=100)
    with pytest.raises(ConfigError, match="single string"):
        plan_collection("file:///b/aa/aa", [blob], grace_s=0, now=100)
    ref = GraphRef(blob.uri, blob.sha256, blob.size)
    with pytest.raises(ConfigError, match="GraphRef"):
        plan_collection([ref], [blob], grace_s=0, now=100)  # type: ignore[list-item]
    assert plan_collection([], [blob], grace_s=0, now=100) == [blob]
    assert plan_collection([blob.uri], [blob], grace_s=0, now=100) == []


# -- collect ---------------------------------------------------------------------------------


def test_collect_end_to_end(store: FileBlobStore) -> None:
    live_old = store.put(b"live and old")
    live_young = store.put(b"live and young")
    dead_old = [store.put(b"dead and old %d" % i) for i in range(3)]
    dead_young = store.put(b"dead and young")
    for ref in (live_old, *dead_old):
        age(ref, 8 * DAY)

    report = collect(store, [live_old.uri, live_young.uri], grace_s=7 * DAY)

    assert isinstance(report, CollectionReport)
    assert sorted(b.uri for b in report.deleted) == sorted(r.uri for r in dead_old)
    assert report.kept_referenced == 2
    assert report.kept_young == 1
    assert report.errors == ()
    assert {b.uri for b in store.list()} == {live_old.uri, live_young.uri, dead_young.uri}
    for ref in (live_old, live_young, dead_young):
        assert store.get(ref)
    for ref in dead_old:
        with pytest.raises(BlobMissing):
            store.get(ref)

    again = collect(store, (u for u in [live_old.uri, live_young.uri]), grace_s=7 * DAY)
    assert again == CollectionReport((), 2, 1, ())


def test_collect_reports_a_failed_delete_and_goes_on(
    store: FileBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = [store.put(b"dead %d" % i) for i in range(4)]
    for ref in refs:
        age(ref, 2 * DAY)
    victim = refs[1]
    real_unlink = os.unlink

    def flaky_unlink(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if Path(path).name == victim.sha256:
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", flaky_unlink)
    report = collect(store, [], grace_s=DAY)

    assert sorted(b.uri for b in report.deleted) == sorted(r.uri for r in refs if r != victim)
    assert len(report.errors) == 1
    assert victim.uri in report.errors[0] and "Permission denied" in report.errors[0]
    assert [b.uri for b in store.list()] == [victim.uri]


def test_collect_with_grace_zero_and_explicit_now(store: FileBlobStore) -> None:
    keep, drop = store.put(b"keep"), store.put(b"drop")
    later = time.time() + 1
    report = collect(store, {keep.uri}, grace_s=0, now=later)
    assert [b.uri for b in report.deleted] == [drop.uri]
    with pytest.raises(ConfigError):
        collect(store, {keep.uri}, grace_s=-0.5)
    with pytest.raises(ConfigError):
        collect(store, keep.uri, grace_s=0, now=later)
    assert [b.uri for b in store.list()] == [keep.uri]


# -- open_blob_store -------------------------------------------------------------------------


def test_open_blob_store_with_a_path(tmp_path: Path) -> None:
    for location in (tmp_path / "p1", str(tmp_path / "p2")):
        s = open_blob_store(location)
        assert isinstance(s, FileBlobStore) and s.root == Path(location).resolve()
        assert s.root.is_dir()
        ref = s.put(b"hello")
        assert s.get(ref) == b"hello"


def test_open_blob_store_with_a_file_uri(tmp_path: Path) -> None:
    root = tmp_path / "with space"
    s = open_blob_store(root.as_uri())
    assert isinstance(s, FileBlobStore) and s.root == root.resolve()
    ref = s.put(b"hello")
    assert "%20" in ref.uri
    assert open_blob_store(str(root)).get(ref) == b"hello"  # same store, other spelling


@pytest.mark.parametrize("location", ["s3://x", "hdfs://nn/graphs", "", "file://host/x"])
def test_open_blob_store_rejects(location: str) -> None:
    with pytest.raises(ConfigError) as info:
        open_blob_store(location)
    if "://" in location and not location.startswith("file"):
        assert repr(location.split(":")[0]) in str(info.value)


def test_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(BlobError, match="f"):
        FileBlobStore(tmp_path / "f")


# -- key spaces: one store shared by namespaces and topics (issue 10, defect 3) --------------


def test_scoped_views_put_list_delete_only_in_their_space(store: FileBlobStore) -> None:
    a, b, a2 = store.scoped("t1", "A"), store.scoped("t1", "B"), store.scoped("t2", "A")
    data = b"the same graph in three spaces"
    sha = hashlib.sha256(data).hexdigest()
    refs = {v.space: v.put(data) for v in (a, b, a2)}
    for (topic, ns), ref in refs.items():
        assert ref == GraphRef((store.root / topic / ns / sha[:2] / sha).as_uri(), sha, len(data))
    assert len({r.uri for r in refs.values()}) == 3  # dedup holds within a space only
    for v in (a, b, a2):
        assert [x.uri for x in v.list()] == [refs[v.space].uri]
        for ref in refs.values():  # every view reads every space
            assert v.get(ref) == data and v.exists(ref)
    assert list(store.list()) == []  # the unscoped store lists only the flat layout
    with pytest.raises(ConfigError, match="outside this view's space"):
        a.delete(refs[b.space].uri)
    with pytest.raises(ConfigError, match="outside this view's space"):
        a.delete(refs[a2.space].uri)
    with pytest.raises(ConfigError):
        store.delete(refs[a.space].uri)
    assert all(path_of(r).exists() for r in refs.values())
    assert a.delete(refs[a.space].uri) is True
    assert list(a.list()) == [] and b.get(refs[b.space]) == data and a2.get(refs[a2.space])
    # collect on a view with nothing referenced takes only that view's blobs
    report = collect(b, [], grace_s=0, now=time.time() + 1)
    assert [x.uri for x in report.deleted] == [refs[b.space].uri]
    assert a2.get(refs[a2.space]) == data


def test_legacy_flat_blobs_stay_readable_and_are_never_collected(store: FileBlobStore) -> None:
    old = store.put(b"written before key spaces")  # the unscoped store: the flat layout
    assert path_of(old) == store.root / old.sha256[:2] / old.sha256
    view = store.scoped("jobreg", "prod")
    assert view.get(old) == b"written before key spaces" and view.exists(old)
    assert view.contains(old.uri)
    age(old, 30 * DAY)
    assert list(view.list()) == []
    assert collect(view, [], grace_s=0) == CollectionReport((), 0, 0, ())
    with pytest.raises(ConfigError, match="outside this view's space"):
        view.delete(old.uri)
    assert store.get(old)  # still there: left for an operator
    assert [b.uri for b in store.list()] == [old.uri]  # ...who can list it on the flat store


@pytest.mark.parametrize("bad", ["..", ".", "a/b", "../x", "/abs", "", "a b", ".tmp-1", "x" * 201])
def test_scoped_refuses_ids_that_could_escape_the_root(store: FileBlobStore, bad: str) -> None:
    with pytest.raises(ConfigError, match="malformed topic"):
        store.scoped(bad, "ns")
    with pytest.raises(ConfigError, match="malformed namespace"):
        store.scoped("jobreg", bad)
    assert all_files(store.root) == [] and list(store.root.iterdir()) == []


@pytest.mark.parametrize(
    "layout",
    [
        "{root}/t/{sha}",  # a space without shard
        "{root}/t/ns/{sha}",
        "{root}/t/ns/x/{sha2}/{sha}",  # too deep
        "{root}/t/.ns/{sha2}/{sha}",  # not an id
        "{root}/t/ns/{wrong}/{sha}",  # wrong shard
        "{root}/t/ns/{sha2}/../../../../outside/{sha}",
        "{root}/../outside/t/ns/{sha2}/{sha}",
    ],
)
def test_scoped_uris_outside_the_layout_are_refused(
    store: FileBlobStore, tmp_path: Path, layout: str
) -> None:
    view = store.scoped("t", "ns")
    ref = view.put(b"x")
    wrong = "00" if ref.sha256[:2] != "00" else "01"
    path = layout.format(root=store.root, sha=ref.sha256, sha2=ref.sha256[:2], wrong=wrong)
    bad = dataclasses.replace(ref, uri=Path(path).as_uri())
    assert not view.contains(bad.uri)
    with pytest.raises(ConfigError):
        view.get(bad)
    with pytest.raises(ConfigError):
        view.delete(bad.uri)
    assert view.get(ref) == b"x"
    assert not view.contains("s3://bucket/" + ref.sha256)
    assert view.contains(ref.uri) and view.contains(store.scoped("u", "v").put(b"y").uri)


def test_scoping_a_view_again_gives_the_other_space(store: FileBlobStore) -> None:
    a = store.scoped("t", "A")
    b = a.scoped("t", "B")
    assert (b.space, b.root) == (("t", "B"), store.root)
    assert path_of(b.put(b"z")).parent.parent == store.root / "t" / "B"
    assert repr(b) == f"FileBlobStore({str(store.root)!r}).scoped('t', 'B')"
    assert list(a.list()) == [] and a.space == ("t", "A") and store.space is None
    assert list(store.scoped("never", "used").list()) == []  # nothing created by scoping
    assert not (store.root / "never").exists()


def test_scoped_put_creates_its_space_durably(
    store: FileBlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    ref = store.scoped("t", "ns").put(b"durable")
    shard = path_of(ref).parent
    # each new directory's parent, then the shard holding the renamed blob
    assert synced == [store.root, store.root / "t", store.root / "t" / "ns", shard]


def test_scoped_sweep_temp_only_in_its_space(store: FileBlobStore) -> None:
    a, b = store.scoped("t", "A"), store.scoped("t", "B")
    ra, rb = a.put(b"a"), b.put(b"b")
    for ref in (ra, rb):
        tmp = path_of(ref).parent / ".tmp-left"
        tmp.write_bytes(b"")
        os.utime(tmp, (0, 0))
    assert a.sweep_temp() == 1
    assert not (path_of(ra).parent / ".tmp-left").exists()
    assert (path_of(rb).parent / ".tmp-left").exists()


def test_a_store_without_spaces_is_its_own_only_space(store: FileBlobStore) -> None:
    m = minimal(store)
    assert m.scoped("jobreg", "prod") is m
    assert not m.contains(m.put(b"q").uri)  # a caller's ref to it is carried as is
    with pytest.raises(ConfigError, match="malformed namespace"):
        m.scoped("jobreg", "a/b")
