"""Snapshots of the image: exact round trips, fold(tail, snapshot(fold(prefix))) == fold(all),
and every way a snapshot file can be unusable (no broker)."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import immutables
import pytest
from hypothesis import given
from hypothesis import strategies as st
from model import NS, visible
from test_fold_properties import SETTINGS, histories

from registry.errors import ConfigError
from registry.events import (
    EMPTY_CHECKPOINTS,
    CheckpointState,
    CompletedCheckpoint,
    GraphRef,
    InlineGraph,
)
from registry.fold import fold
from registry.image import Decision, Image, JobView, Provenance, TermInfo
from registry.snapshot import (
    FORMAT,
    Snapshot,
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
        "a": JobView("a", "ACTIVE", 3, InlineGraph(b"\x00\xff\xfe graph \n"), None, 2, 2, cps),
        "b": JobView("b", "RECOVERY_FAILED", None, GraphRef("blob://x", "ab" * 32, 12), "boom"),
        "c": JobView("c", "CANCELLED", None, None),
        "d": JobView("d", "ACTIVE", 1, InlineGraph(b""), "", 0, 1, CheckpointState()),
        "é/ü\u2603": JobView("é/ü\u2603", "FINISHED", None, None),
    }
    terms = {
        1: TermInfo(1, "jm-1", 0, 10, None, 0, None),
        2: TermInfo(2, "jm-2", 12, None, 30_000, 3, 40),
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
        terms=immutables.Map(terms),
        rejected=(dec, dec._replace(offset=13, detail="")),
        ignored=(Decision(15, "IGNORED", None, None, reason="ignored"),),
        quarantined=(Decision(17, "QUARANTINED", 5, None, reason="tombstone", detail="x"),),
        unsettled=immutables.Map({"prod/job/a": 11, "prod/job/a/lock": 13}),
        seen=immutables.Map({f"e-{i}": None for i in range(20)}),
        duplicates=4,
    )


# -- the body codec ------------------------------------------------------------------


@pytest.mark.parametrize(
    "image", [Image.empty(NS), Image.empty(""), tricky_image()], ids=["empty", "no-ns", "tricky"]
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
    here = hashlib.sha256(encode_image(tricky_image())).hexdigest()
    code = (
        "import hashlib, sys; sys.path.insert(0, sys.argv[1]); "
        "from test_snapshot import tricky_image; from registry.snapshot import encode_image; "
        "print(hashlib.sha256(encode_image(tricky_image())).hexdigest())"
    )
    tests_dir = str(Path(__file__).parent)
    root = str(Path(__file__).parent.parent)
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", code, tests_dir], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == here


def _body_lines(body: bytes) -> tuple[dict[str, Any], Any]:
    head, _, rest = gzip.decompress(body).partition(b"\n")
    return json.loads(head), json.loads(rest)


def _body(head: dict[str, Any], value: Any) -> bytes:
    return gzip.compress(json.dumps(head).encode() + b"\n" + json.dumps(value).encode())


def _rows(value: Any, tag: str):
    """Every row of record type ``tag`` in a decoded-as-plain-JSON body."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == tag:
                yield v
            yield from _rows(v, tag)
    elif isinstance(value, list):
        for v in value:
            yield from _rows(v, tag)


def test_an_older_snapshot_without_a_defaulted_field_reads_with_its_default() -> None:
    """As if written before JobView had retained_checkpoints and checkpoints."""
    image = tricky_image()
    head, value = _body_lines(encode_image(image))
    assert head["types"]["JobView"][-2:] == ["retained_checkpoints", "checkpoints"]
    head["types"]["JobView"] = head["types"]["JobView"][:-2]
    for row in _rows(value, "JobView"):
        del row[-2:]
    back = decode_image(_body(head, value))
    expected = {
        k: v._replace(retained_checkpoints=1, checkpoints=EMPTY_CHECKPOINTS)
        for k, v in image.jobs.items()
    }
    assert dict(back.jobs) == expected
    assert dataclasses.replace(back, jobs=image.jobs) == image


def test_field_order_comes_from_the_file() -> None:
    image = tricky_image()
    head, value = _body_lines(encode_image(image))
    head["types"]["TermInfo"].reverse()
    for row in _rows(value, "TermInfo"):
        row.reverse()
    same(decode_image(_body(head, value)), image)


@pytest.mark.parametrize(
    "change",
    [
        "unknown field",
        "unknown type",
        "missing required field",
        "row too short",
        "not an image",
        "untagged object",
        "two tags",
        "bad base64",
        "bad map",
        "wrong body format",
        "no types",
    ],
)
def test_a_body_this_jobreg_cannot_read_exactly_is_refused(change: str) -> None:
    head, value = _body_lines(encode_image(tricky_image()))
    if change == "unknown field":  # a newer jobreg added a field: dropping it would lose state
        head["types"]["JobView"].append("future")
        for row in _rows(value, "JobView"):
            row.append(1)
    elif change == "unknown type":
        value["Image"][0] = {"Provenance2": ["prod", 1, 1, None]}
    elif change == "missing required field":
        head["types"]["JobView"].remove("status")
        for row in _rows(value, "JobView"):
            del row[1]
    elif change == "row too short":
        next(_rows(value, "TermInfo")).pop()
    elif change == "not an image":
        value = value["Image"][0]  # the provenance alone
    elif change == "untagged object":
        value["Image"][1] = {}
    elif change == "two tags":
        value["Image"][1] = {"bytes": "", "map": []}
    elif change == "bad base64":
        next(_rows(value, "InlineGraph"))[0] = {"bytes": "not base64!"}
    elif change == "bad map":
        value["Image"][4] = {"map": [["a"]]}
    elif change == "wrong body format":
        head["format"] = "jobreg-snapshot/2"
    elif change == "no types":
        del head["types"]
    with pytest.raises(ConfigError):
        decode_image(_body(head, value))


@pytest.mark.parametrize(
    "data",
    [b"", b"not gzip", gzip.compress(b""), gzip.compress(b"{}"), gzip.compress(b"[[[[")],
    ids=["empty", "not-gzip", "gzip-empty", "gzip-object", "gzip-bad-json"],
)
def test_garbage_is_not_a_body(data: bytes) -> None:
    with pytest.raises(ConfigError):
        decode_image(data)


def test_deeply_nested_json_is_a_config_error() -> None:
    head, _ = _body_lines(encode_image(Image.empty(NS)))
    deep = json.dumps(head).encode() + b"\n" + b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ConfigError):
        decode_image(gzip.compress(deep))


def test_a_value_the_codec_does_not_know_is_refused_on_write() -> None:
    image = dataclasses.replace(tricky_image(), seen=immutables.Map({"e": [1]}))
    with pytest.raises(ConfigError, match="list"):
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
    assert header["format"] == FORMAT
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


def test_another_format_version_is_refused(small: Path) -> None:
    _rewrite_header(small, format="jobreg-snapshot/2")
    with pytest.raises(ConfigError, match="jobreg-snapshot/2"):
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
