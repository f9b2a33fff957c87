"""Snapshots of the image: exact round trips, fold(tail, snapshot(fold(prefix))) == fold(all),
and every way a snapshot file can be unusable (no broker)."""

from __future__ import annotations

import dataclasses
import gc
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import immutables
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.histories import SETTINGS, histories
from support.model import NS, visible

from registry.codec import encode
from registry.errors import ConfigError
from registry.events import (
    EMPTY_CHECKPOINTS,
    CheckpointState,
    CompletedCheckpoint,
    GraphRef,
    InlineGraph,
    JobSubmitted,
    LeadershipGranted,
    new_event_id,
)
from registry.fold import fold
from registry.image import Decision, Image, JobView, LeaderView, LogRecord, Provenance, TermInfo
from registry.keys import record_key
from registry.snapshot import (
    BODY_ENCODING,
    FORMAT,
    READABLE_FORMATS,
    RULES,
    Snapshot,
    StaleSnapshot,
    _rules_digest,
    decode_image,
    encode_image,
    read_snapshot,
    write_snapshot,
)

TOPIC = "jobreg"


def same(a: Any, b: Any, where: str = "image") -> None:
    """Stricter than ==: equal *and* of the same types all the way down (a JobView is not a
    plain tuple, an int not a bool, a tuple not a list)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, immutables.Map):
        assert set(a.keys()) == set(b.keys()), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, tuple):
        assert len(a) == len(b), where
        names = getattr(a, "_fields", None) or range(len(a))
        for name, x, y in zip(names, a, b, strict=True):
            same(x, y, f"{where}.{name}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def tricky_image() -> Image:
    """An image with every kind of value the fold can leave, and the near-misses a lossy codec
    would confuse: () and None, b"" and None, "" and None, int keys, bytes that are not UTF-8,
    strings JSON must escape, a lone surrogate."""
    cps = CheckpointState(
        seq=7,
        last_completed=4,
        retained=(CompletedCheckpoint(3, "s3://b/3"), CompletedCheckpoint(4, "s3://b/4")),
        pending=(5, 6),
        discarded=(),
        counted=(6,),
    )
    jobs = {
        "a": JobView("a", "ACTIVE", 3, InlineGraph(b"\x00\xff\xfe graph \n"), None, 2, 2, cps,
                     born_by="birth-1"),
        "b": JobView("b", "RECOVERY_FAILED", None, GraphRef("blob://x", "ab" * 32, 12), "boom"),
        "c": JobView("c", "CANCELLED", None, None, reason="cancelled by the operator"),
        "c2": JobView("c2", "FAILED", None, GraphRef("blob://y", "cd" * 32, 7), checkpoints=cps,
                      reason="boom", dirty=True, ended_by="end-1"),
        "d": JobView("d", "ACTIVE", 1, InlineGraph(b""), "", 0, 1, CheckpointState()),
        "é/ü\u2603": JobView("é/ü\u2603", "FINISHED", None, None),
    }
    dec = Decision(
        11, "REJECTED", 1_700_000_000_000, "prod/job/a", "JobCancelled", "e-1", "a", 1,
        "jm-1", "stale_epoch", 'quote " backslash \\ tab \t nul \x00 \udcff', 2, 1, "jm-2",
    )  # fmt: skip
    return Image(
        provenance=Provenance(NS, 41, 2, None),
        epoch=2,
        leader="jm-2",
        revoked=True,
        jobs=immutables.Map(jobs),
        term=TermInfo(2, "jm-2", 12, None, 30_000, 3, 40),
        rejected=(dec, dec._replace(offset=13, detail="")),
        ignored=(Decision(15, "IGNORED", None, None, reason="ignored"),),
        quarantined=(Decision(17, "QUARANTINED", 5, None, reason="tombstone", detail="x"),),
        unsettled=immutables.Map({"prod/job/a": 11, "prod/job/a/lock": 13}),
        recent_ids=immutables.Map({28_333_332: immutables.Map({f"e-{i}": None for i in range(9)}),
                                   28_333_333: immutables.Map({f"e-{i}": None
                                                               for i in range(9, 20)})}),
        duplicates=4,
    )


def exotic_image() -> Image:
    """Values the fold never leaves but the codec takes (Image's maps hold any value): mixed
    kinds in one column, maps in maps, tuple and mixed-type keys, records of every type."""
    seen = {
        "bytes": b"\x00\n\xff",
        "empty-bytes": b"",
        "empty-tuple": (),
        "tuple": (1, "x", None, b"y", (2.5, -0.0), InlineGraph(b"z")),
        "map": immutables.Map({"k": (1, 2), "m": immutables.Map(), 3: b"w"}),
        "maps": (immutables.Map({1: 1}), immutables.Map({2: 2})),
        "leader": LeaderView(3, "jm-3"),
        "cps": CheckpointState(seq=1),
        "cps-by-seq": immutables.Map({0: CheckpointState(), 1: CheckpointState(seq=1)}),
        "terms-by-epoch": immutables.Map({2: TermInfo(2, "jm-2", 5), 1: TermInfo(1, "jm-1", 0)}),
        "empty-cps": CheckpointState(),
        "float": 1.5,
        "neg-zero": -0.0,
        "true": True,
        "int": 1,
        "none": None,
        ("a", 1): "tuple key",
        7: "int key",
        2.5: "float key",
    }
    image = tricky_image()
    return dataclasses.replace(
        image,
        recent_ids=immutables.Map(seen),
        unsettled=immutables.Map({"k": 1.0, "j": 1, "i": True}),
        jobs=image.jobs.set("x", JobView("y", "ACTIVE", None, None)),  # key != job id
    )


# -- the body codec ------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [Image.empty(NS), Image.empty(""), tricky_image(), exotic_image()],
    ids=["empty", "no-ns", "tricky", "exotic"],
)
def test_round_trip_is_exact(image: Image) -> None:
    body = encode_image(image)
    back = decode_image(body)
    assert back == image
    same(back, image)
    assert encode_image(back) == body  # deterministic: same image, same bytes


@SETTINGS
@given(histories)
def test_round_trip_of_images_of_random_histories(sim) -> None:
    image = fold(visible(sim.log), NS)
    back = decode_image(encode_image(image))
    assert back == image
    same(back, image)


def test_the_shared_empty_checkpoint_state_stays_shared() -> None:
    image = tricky_image()
    back = decode_image(encode_image(image))
    assert back.jobs["b"].checkpoints is EMPTY_CHECKPOINTS  # as the fold leaves it
    assert back.jobs["d"].checkpoints is EMPTY_CHECKPOINTS  # equal, so it may be shared
    fresh = image.jobs["b"]._replace(checkpoints=CheckpointState())
    assert fresh.checkpoints is not EMPTY_CHECKPOINTS
    other = dataclasses.replace(image, jobs=image.jobs.set("b", fresh))
    assert encode_image(other) == encode_image(image)


def test_bytes_do_not_depend_on_the_hash_seed() -> None:
    """Map entries are written sorted: another process (another str hash seed) writes the
    same bytes for the same image."""
    here = [hashlib.sha256(encode_image(f())).hexdigest() for f in (tricky_image, exotic_image)]
    code = (
        "import hashlib, sys; sys.path[:0] = sys.argv[1:]; "
        "from test_snapshot import tricky_image, exotic_image; "
        "from registry.snapshot import encode_image; "
        "print(*[hashlib.sha256(encode_image(f())).hexdigest() "
        "for f in (tricky_image, exotic_image)])"
    )
    here_dir, tests_dir = str(Path(__file__).parent), str(Path(__file__).parents[1])
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code, here_dir, tests_dir], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == here


def _parts(body: bytes) -> tuple[dict[str, Any], Any, bytes]:
    """A format-2 body as (head, the image column as plain JSON, blob)."""
    head, value, blob = gzip.decompress(body).split(b"\n", 2)
    return json.loads(head), json.loads(value), blob


def _body(head: dict[str, Any], value: Any, blob: bytes = b"") -> bytes:
    return gzip.compress(
        json.dumps(head).encode() + b"\n" + json.dumps(value).encode() + b"\n" + blob
    )


def _recs(value: Any, name: str) -> Iterator[list[Any]]:
    """Every ``[n, [field columns]]`` of record type ``name`` in a format-2 image column."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "rec" and v[0] == name:
                yield v[1:]
            yield from _recs(v, name)
    elif isinstance(value, list):
        for v in value:
            yield from _recs(v, name)


def _dicts(value: Any) -> int:
    """How many JSON objects ``value`` holds."""
    if isinstance(value, dict):
        return 1 + sum(map(_dicts, value.values()))
    if isinstance(value, list):
        return sum(map(_dicts, value))
    return 0


def test_the_body_is_column_wise() -> None:
    """However many jobs, seen ids and decisions: the same number of JSON objects (so reading
    calls back for none of them), graphs in the blob, not in the JSON."""

    def image(n: int) -> Image:
        jobs = {
            f"j{i}": JobView(f"j{i}", "ACTIVE", 1, InlineGraph(b"graph %d" % i)) for i in range(n)
        }
        dec = tricky_image().rejected[0]
        return dataclasses.replace(
            tricky_image(),
            jobs=immutables.Map(jobs),
            recent_ids=immutables.Map({0: immutables.Map({f"e{i}": None for i in range(n)})}),
            rejected=tuple(dec._replace(offset=i, detail=str(i)) for i in range(n)),
        )

    shapes = []
    for n in (100, 3000):
        head, value, blob = _parts(encode_image(image(n)))
        assert head == {"format": FORMAT, "rules": RULES, "types": head["types"]}
        assert b"graph %d" % (n - 1) in blob
        shapes.append(_dicts(value))
    assert shapes[0] == shapes[1]


def test_an_older_snapshot_without_a_defaulted_field_reads_with_its_default() -> None:
    """As if written before JobView had a dirty flag (job results), an end's id and a
    birth's id."""
    image = tricky_image()
    head, value, blob = _parts(encode_image(image))
    assert head["types"]["JobView"][-3:] == ["dirty", "ended_by", "born_by"]
    head["types"]["JobView"] = head["types"]["JobView"][:-3]
    for _, columns in _recs(value, "JobView"):
        del columns[-3:]
    back = decode_image(_body(head, value, blob))
    expected = {k: v._replace(dirty=False, ended_by=None, born_by=None)
                for k, v in image.jobs.items()}
    assert dict(back.jobs) == expected != dict(image.jobs)
    assert dataclasses.replace(back, jobs=image.jobs) == image


def test_field_order_comes_from_the_file() -> None:
    image = tricky_image()
    head, value, blob = _parts(encode_image(image))
    for name in ("TermInfo", "InlineGraph", "Provenance", "Image"):
        head["types"][name].reverse()
        for _, columns in _recs(value, name):
            columns.reverse()
    same(decode_image(_body(head, value, blob)), image)


@pytest.mark.parametrize(
    "change",
    [
        "unknown field",
        "unknown type",
        "type not in types",
        "missing required field",
        "field column too short",
        "field column too long",
        "count not an int",
        "not an image",
        "two images",
        "unknown column kind",
        "two kinds",
        "bad const",
        "unknown shared value",
        "bytes beyond the blob",
        "blob longer than used",
        "negative length",
        "tuple lengths off",
        "map key twice",
        "map keys from no field",
        "union tag too large",
        "union tags too few",
        "no image line",
        "wrong body format",
        "no types",
        "bad types",
        "trailing garbage",
    ],
)
def test_a_body_this_jobreg_cannot_read_exactly_is_refused(change: str) -> None:
    head, value, blob = _parts(encode_image(tricky_image()))
    image_columns = value["rec"][2]
    (_, terms), *_ = _recs(value, "TermInfo")
    (_, jobs), *_ = _recs(value, "JobView")
    body = None
    if change == "unknown field":  # a newer jobreg added a field: dropping it would lose state
        head["types"]["TermInfo"].append("future")
        terms.append([1, 2])
    elif change == "unknown type":
        value["rec"][0] = "Image2"
    elif change == "type not in types":
        del head["types"]["TermInfo"]
    elif change == "missing required field":
        head["types"]["JobView"].remove("status")
        del jobs[1]
    elif change == "field column too short":
        terms[1].pop()
    elif change == "field column too long":
        terms[1].append("jm-3")
    elif change == "count not an int":
        value["rec"][1] = 1.0
    elif change == "not an image":
        value = image_columns[0]  # the provenance alone
    elif change == "two images":
        value = {"union": [[0, 1], [value, value]]}
    elif change == "unknown column kind":
        image_columns[1] = {"Image": [2]}
    elif change == "two kinds":
        image_columns[1] = {"const": [2, 1], "shared": ["EMPTY_CHECKPOINTS", 1]}
    elif change == "bad const":
        image_columns[1] = {"const": [[2], 1]}
    elif change == "unknown shared value":
        image_columns[1] = {"shared": ["EMPTY_JOBS", 1]}
    elif change == "bytes beyond the blob":
        blob = blob[:-1]
    elif change == "blob longer than used":
        blob += b"\x00"
    elif change == "negative length":
        jobs[0] = {"tuple": [[-1, 1], ["a"]]}
    elif change == "tuple lengths off":
        image_columns[6] = {"tuple": [[3], image_columns[6]["tuple"][1]]}
    elif change == "map key twice":
        image_columns[9]["map"][1] = ["prod/job/a", "prod/job/a"]
    elif change == "map keys from no field":
        image_columns[9]["map"][1] = {"key": "job_id"}
    elif change == "union tag too large":
        jobs[3]["union"][0][0] = 3
    elif change == "union tags too few":
        jobs[3]["union"][0].pop()
    elif change == "no image line":
        body = gzip.compress(json.dumps(head).encode() + b"\n" + json.dumps(value).encode())
    elif change == "wrong body format":
        head["format"] = "jobreg-snapshot/9"
    elif change == "no types":
        del head["types"]
    elif change == "bad types":
        head["types"]["TermInfo"] = "epoch"
    elif change == "trailing garbage":
        body = _body(head, value, blob) + b"\x00"
    with pytest.raises(ConfigError):
        decode_image(body if body is not None else _body(head, value, blob))


@pytest.mark.parametrize(
    "data",
    [b"", b"not gzip", gzip.compress(b""), gzip.compress(b"{}"), gzip.compress(b"[[[[")],
    ids=["empty", "not-gzip", "gzip-empty", "gzip-object", "gzip-bad-json"],
)
def test_garbage_is_not_a_body(data: bytes) -> None:
    with pytest.raises(ConfigError):
        decode_image(data)


def test_deeply_nested_json_is_a_config_error() -> None:
    head = _parts(encode_image(Image.empty(NS)))[0]
    deep = json.dumps(head).encode() + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n"
    with pytest.raises(ConfigError):
        decode_image(gzip.compress(deep))


@pytest.mark.parametrize("value", [[1], {1}, {"a": 1}, object()], ids=repr)
def test_a_value_the_codec_does_not_know_is_refused_on_write(value: Any) -> None:
    image = dataclasses.replace(tricky_image(), recent_ids=immutables.Map({"e": value}))
    with pytest.raises(ConfigError, match=type(value).__name__):
        encode_image(image)


# -- snapshots of folds ------------------------------------------------------------


@SETTINGS
@given(histories, st.data())
def test_fold_of_the_tail_onto_a_snapshot_of_a_prefix_is_the_fold_of_everything(sim, data) -> None:
    records = visible(sim.log)
    k = data.draw(st.integers(0, len(records)), label="cut")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_snapshot(Path(tmp) / "s", fold(records[:k], NS), topic=TOPIC, partition=3)
        snap = read_snapshot(path, namespace=NS, topic=TOPIC, partition=3)
    assert (snap.topic, snap.partition) == (TOPIC, 3)
    whole = fold(records, NS)
    resumed = fold(records[k:], snap.image)
    assert resumed == whole
    same(resumed, whole)


def test_write_and_read_back(tmp_path: Path) -> None:
    image = tricky_image()
    path = write_snapshot(str(tmp_path / "s.jobreg"), image, topic=TOPIC, partition=0)
    assert path == tmp_path / "s.jobreg"
    snap = read_snapshot(path)
    assert isinstance(snap, Snapshot)
    same(snap.image, image)
    assert (snap.topic, snap.partition) == (TOPIC, 0) and snap.written_at_ms > 0
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert (header["format"], header["body_encoding"]) == (FORMAT, BODY_ENCODING)
    assert READABLE_FORMATS[FORMAT] == BODY_ENCODING
    assert (header["namespace"], header["last_offset"]) == (NS, 41)
    assert sorted(os.listdir(tmp_path)) == ["s.jobreg"]  # no temporary file left


def test_a_new_snapshot_replaces_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "s"
    write_snapshot(path, Image.empty(NS), topic=TOPIC, partition=0)
    write_snapshot(path, tricky_image(), topic=TOPIC, partition=0)
    same(read_snapshot(path).image, tricky_image())
    assert sorted(os.listdir(tmp_path)) == ["s"]


@pytest.mark.parametrize("error", [OSError("disk on fire"), KeyboardInterrupt()])
def test_a_crash_during_write_leaves_the_previous_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    path = tmp_path / "s"
    write_snapshot(path, tricky_image(), topic=TOPIC, partition=0)
    before = path.read_bytes()

    def crash(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(os, "replace", crash)
    expected = ConfigError if isinstance(error, OSError) else type(error)
    with pytest.raises(expected):
        write_snapshot(path, Image.empty(NS), topic=TOPIC, partition=0)
    monkeypatch.undo()
    assert path.read_bytes() == before
    same(read_snapshot(path).image, tricky_image())
    assert sorted(os.listdir(tmp_path)) == ["s"]  # the temporary file was removed


def test_write_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no-such-dir"):
        write_snapshot(tmp_path / "no-such-dir" / "s", Image.empty(NS), topic=TOPIC, partition=0)
    with pytest.raises(ConfigError):
        write_snapshot(tmp_path / "s", Image.empty(NS), topic="", partition=0)
    with pytest.raises(ConfigError):
        write_snapshot(tmp_path / "s", Image.empty(NS), topic=TOPIC, partition=-1)
    with pytest.raises(ConfigError):
        write_snapshot(tmp_path / "s", "not an image", topic=TOPIC, partition=0)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return write_snapshot(tmp_path / "small", tricky_image(), topic=TOPIC, partition=2)


def test_every_truncation_is_detected(small: Path) -> None:
    data = small.read_bytes()
    for cut in range(len(data)):
        small.write_bytes(data[:cut])
        with pytest.raises(ConfigError, match=str(small.name)):
            read_snapshot(small)


def test_every_flipped_byte_is_detected(small: Path) -> None:
    data = small.read_bytes()
    for i in range(len(data)):
        small.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
        with pytest.raises(ConfigError, match=str(small.name)):
            read_snapshot(small)


def test_trailing_bytes_are_detected(small: Path) -> None:
    small.write_bytes(small.read_bytes() + b"\n")
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        read_snapshot(small)


def _rewrite_header(path: Path, **changes: Any) -> None:
    head, body = path.read_bytes().split(b"\n", 1)
    header = {**json.loads(head), **changes}
    header = {k: v for k, v in header.items() if v is not ...}
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)


@pytest.mark.parametrize("fmt", ["jobreg-snapshot/4", "jobreg-snapshot/2", "jobreg-snapshot/1",
                                 "jobreg-snapshot/0", 2, None])
def test_another_format_version_is_refused(small: Path, fmt: Any) -> None:
    """Formats 1 and 2 too: they held every term and event id ever folded (replay instead)."""
    _rewrite_header(small, format=fmt)
    with pytest.raises(ConfigError, match="format"):
        read_snapshot(small)


def test_a_header_without_a_field_is_refused(small: Path) -> None:
    _rewrite_header(small, body_sha256=...)
    with pytest.raises(ConfigError, match="body_sha256"):
        read_snapshot(small)


def test_an_unknown_body_encoding_is_refused(small: Path) -> None:
    _rewrite_header(small, body_encoding="zstd+cbor")
    with pytest.raises(ConfigError, match="zstd"):
        read_snapshot(small)


@pytest.mark.parametrize("lie", [{"namespace": "other"}, {"last_offset": 40}])
def test_a_header_that_disagrees_with_its_image_is_refused(small: Path, lie: dict) -> None:
    _rewrite_header(small, **lie)
    with pytest.raises(ConfigError, match="the header says"):
        read_snapshot(small)  # e.g. the header says "other", the image "prod"


@pytest.mark.parametrize(
    "given", [{"namespace": "staging"}, {"topic": "other-topic"}, {"partition": 0}]
)
def test_a_snapshot_of_another_log_is_refused(small: Path, given: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(given))):
        read_snapshot(small, **given)
    read_snapshot(small, namespace=NS, topic=TOPIC, partition=2)


@pytest.mark.parametrize(
    "content",
    [b"", b"hello", b"hello\n", b"[1, 2]\n", b'{"a": 1}\n', b"\xff\xfe\n", b"x" * 100_000],
    ids=["empty", "no-newline", "text", "json-list", "json-object", "binary", "huge-line"],
)
def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not a jobreg snapshot"):
        read_snapshot(path)


def test_an_unreadable_path_is_a_config_error_with_the_os_error_as_cause(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing") as info:
        read_snapshot(tmp_path / "missing")
    assert isinstance(info.value.__cause__, FileNotFoundError)
    with pytest.raises(ConfigError):
        read_snapshot(tmp_path)  # a directory


# -- a benchmark, not a test: python tests/unit/test_snapshot.py [jobs] ----------------------


def big_image(jobs: int = 100_000, graph_bytes: int = 200, compressible: bool = False) -> Image:
    """The fold of a grant and ``jobs`` JobSubmitted records with inline graphs (random bytes,
    or one byte repeated): ``jobs`` JobViews and ``jobs + 1`` seen event ids."""
    rnd = random.Random(0)

    def envelope() -> dict[str, Any]:
        return dict(event_id=new_event_id(), namespace=NS, epoch=1, writer="jm-1", created_at=0)

    events: list[Any] = [LeadershipGranted(prev_epoch=0, **envelope())]
    for i in range(jobs):
        data = b"g" * graph_bytes if compressible else rnd.randbytes(graph_bytes)
        events.append(JobSubmitted(job_id=f"job-{i}", graph=InlineGraph(data), **envelope()))
    records = [
        LogRecord(offset, record_key(e).encode(), encode(e), 1_000 + offset)
        for offset, e in enumerate(events)
    ]
    return fold(records, NS)


def bench_snapshot(image: Image, runs: int = 3) -> dict[str, float]:
    """Best-of-``runs`` seconds to write and to read a snapshot of ``image``, and its size."""

    def best(f: Any) -> float:
        times = []
        for _ in range(runs):
            gc.collect()
            start = time.perf_counter()
            result = f()
            times.append(time.perf_counter() - start)
            del result  # freed outside the timing
        return min(times)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.jobreg"
        write_s = best(lambda: write_snapshot(path, image, topic=TOPIC, partition=0))
        read_s = best(lambda: read_snapshot(path))
        assert read_snapshot(path).image == image
        return {"write_s": write_s, "read_s": read_s, "bytes": path.stat().st_size}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    for compressible in (False, True):
        graphs = "one byte repeated" if compressible else "random bytes"
        figures = bench_snapshot(big_image(n, compressible=compressible))
        print(
            f"{n:,} jobs, 200-byte graphs of {graphs}: write {figures['write_s']:.3f} s, "
            f"read {figures['read_s']:.3f} s, {figures['bytes']:,} bytes"
        )


def _under_other_rules(body: bytes, rules: object) -> bytes:
    text = gzip.decompress(body)
    head, _, rest = text.partition(b"\n")
    fields = json.loads(head)
    if rules is None:
        del fields["rules"]
    else:
        fields["rules"] = rules
    return gzip.compress(json.dumps(fields).encode() + b"\n" + rest, mtime=0)


@pytest.mark.parametrize("rules", [None, "0123456789abcdef", 7])
def test_a_body_written_under_other_fold_rules_is_not_read(tmp_path, rules) -> None:
    """A snapshot caches one fold: an image folded under other rules may lack what these
    keep (``Image.call_members`` for a body of the rules before it: the twelfth read's D5),
    so a body of other rules (or of none: written before bodies named them) is refused with
    ``StaleSnapshot``, a ``ConfigError``, in a file as well (the client then replays)."""
    image = Image.empty("ns")
    body = _under_other_rules(encode_image(image), rules)
    with pytest.raises(StaleSnapshot, match="other fold rules"):
        decode_image(body)
    path = write_snapshot(tmp_path / "s", image, topic="t", partition=0)
    head, _, old = path.read_bytes().partition(b"\n")
    fields = json.loads(head)
    stale = _under_other_rules(old, rules)
    fields.update(body_bytes=len(stale), body_sha256=hashlib.sha256(stale).hexdigest())
    path.write_bytes(json.dumps(fields).encode() + b"\n" + stale)
    with pytest.raises(StaleSnapshot, match=r"snapshot '.*': written under other fold rules"):
        read_snapshot(path)
    assert len(RULES) == 16 and _rules_digest() == RULES
