"""Damaged input answered in one line, never a traceback (issue 26 section 3), and files
written as a careful tool writes them (section 4), through the real entry point.

The dump here is a real one: a log written by the client API on the session's broker,
dumped by `jobreg dump`; it spans several Avro data blocks, so damage can be put in one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import EXIT_DAMAGED, main
from registry.events import new_event_id
from registry.log import write_raw

pytestmark = pytest.mark.integration

NS = "damaged"


def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return err.strip()


def jobreg(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """``jobreg ARGS`` in-process (click's runner), in ``cwd``."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def log(broker, tmp_path_factory) -> Iterator[dict]:
    """300 jobs of one namespace on a topic of its own (a dump of several data blocks), and
    a record with a valid frame and catalog id but a garbage body."""
    topic = f"jobreg-damaged-{new_event_id()[:8]}"
    reg = Registry.connect(broker.bootstrap, NS, topic=topic,
                           blob_store=tmp_path_factory.mktemp("blobs"))
    term = reg.claim_leadership("jm-1")
    term.submit_many([(f"job-{i:04d}", b"g" * 64) for i in range(300)])
    term.cancel("job-0001", "gone")
    garbage = write_raw(reg.bootstrap, topic, reg.partition, f"{NS}/job/job-g",
                        b"\x00\x00\x00\x00\x05" + b"\xff" * 6 + b"\x01")
    yield {"bootstrap": broker.bootstrap, "topic": topic, "garbage": garbage, "reg": reg}
    reg.close()


@pytest.fixture(scope="module")
def dump(log, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dump") / "x.avro"
    code, _, err = jobreg("--bootstrap", log["bootstrap"], "--topic", log["topic"],
                          "--namespace", NS, "dump", str(path))
    assert code == 0, err
    return path


def _blocks(path: Path) -> list[tuple[int, int, int]]:
    """(offset, size, records) of each data block."""
    with path.open("rb") as f:
        return [(b.offset, b.size, b.num_records) for b in fastavro.block_reader(f)]


def _break_block(data: bytearray, offset: int) -> bytearray:
    """The data block at ``offset`` with its first deflate block's type bits set to 11 (which
    deflate reserves): damage that must fail to decompress, whatever the bytes around it."""
    at = offset
    for _ in range(2):  # the block's record count and byte size, zigzag varints
        while data[at] & 0x80:
            at += 1
        at += 1
    data[at] |= 0b110
    return data


def _damaged(src: Path, dst: Path, edit) -> Path:
    data = bytearray(src.read_bytes())
    dst.write_bytes(bytes(edit(data)))
    return dst


# -- dumps ------------------------------------------------------------------------------------


def test_a_good_dump_reads_whole(dump) -> None:
    assert len(_blocks(dump)) >= 3
    code, out, err = jobreg("--from-file", str(dump), "jobs")
    assert code == 0 and "job-0299" in out and err == ""


def test_a_flipped_byte_in_a_data_block_is_one_line_naming_the_block(dump, tmp_path) -> None:
    """It was a traceback ending in zlib.error: Error -3. The flip is made where it must
    break the deflate stream (a byte in the middle may, by chance, still decompress: the end
    marker finds that, test_a_changed_header_that_still_parses_is_found_by_the_end_marker):
    the first deflate block's type bits set to 11, which deflate reserves."""
    offset, _, _ = _blocks(dump)[2]
    bad = _damaged(dump, tmp_path / "flip.avro", lambda d: _break_block(d, offset))
    before = sum(n for _, _, n in _blocks(dump)[:2])
    code, out, err = jobreg("--from-file", str(bad), "jobs")
    assert code == EXIT_DAMAGED and out == ""
    line = _one_line(err)
    assert line.startswith(f"Error: {bad}: damaged at byte {offset} (data block 3): ")
    assert "its compressed data is corrupt (deflate: invalid block type)" in line
    assert f"; {before} records (to offset " in line and "zlib" not in line


def test_a_dump_cut_short_is_one_line_not_aborted(dump, tmp_path) -> None:
    """Its last 100 bytes cut: it printed only `Aborted!`."""
    bad = _damaged(dump, tmp_path / "cut.avro", lambda d: d[:-100])
    last_block = len(_blocks(dump))
    code, _, err = jobreg("--from-file", str(bad), "jobs")
    assert code == EXIT_DAMAGED
    line = _one_line(err)
    assert f"damaged at byte {_blocks(dump)[-1][0]} (data block {last_block}): the file ends " \
           "inside it" in line and "Aborted" not in line


def test_a_dump_cut_at_a_block_boundary_is_truncated_not_shorter(dump, tmp_path) -> None:
    """No Avro reader notices a file cut between two blocks: the end marker does."""
    offset, _, _ = _blocks(dump)[-1]
    bad = _damaged(dump, tmp_path / "cut.avro", lambda d: d[:offset])
    code, _, err = jobreg("--from-file", str(bad), "jobs")
    assert code == EXIT_DAMAGED
    assert _one_line(err).startswith(f"Error: {bad}: truncated: it ends at byte {offset} "
                                     "after ")
    assert "without its end marker" in err


def test_a_damaged_header_says_so_in_words(dump, tmp_path) -> None:
    """It pasted a JSON decoder message into a sentence."""
    with dump.open("rb") as f:
        catalog = fastavro.reader(f).metadata["jobreg.catalog"]
    at = dump.read_bytes().index(catalog[:200].encode()) + 100

    def control(data: bytearray) -> bytearray:
        data[at] = 0x01  # a control character inside the catalog's JSON
        return data

    bad = _damaged(dump, tmp_path / "header.avro", control)
    code, _, err = jobreg("--from-file", str(bad), "jobs")
    assert code == EXIT_DAMAGED
    line = _one_line(err)
    assert line.startswith(f"Error: {bad}: damaged header: its schema catalog "
                           "(jobreg.catalog) is not JSON at char ")
    assert "Invalid control character" not in line


def test_a_changed_header_that_still_parses_is_found_by_the_end_marker(dump, tmp_path) -> None:
    """The namespace in the header changed (same length, parses): the end marker's digest
    covers the header too."""
    def rename(data: bytearray) -> bytearray:
        return bytearray(bytes(data).replace(NS.encode(), b"damagex", 1))

    bad = _damaged(dump, tmp_path / "renamed.avro", rename)
    code, out, err = jobreg("--from-file", str(bad), "jobs")
    assert code == EXIT_DAMAGED and out == ""
    assert "its end marker says other records (SHA-256)" in _one_line(err)


def test_records_before_the_damage_answer_a_read_that_stops_there(dump, tmp_path) -> None:
    """The decision: a read that stops before the damage is answered from the records
    before it; one that needs a record at or past it fails, and nothing is read past it."""
    offset, _, _ = _blocks(dump)[-2]
    bad = _damaged(dump, tmp_path / "late.avro", lambda d: _break_block(d, offset))
    code, out, _ = jobreg("--from-file", str(bad), "--json", "state", "--offset", "10")
    assert code == 0 and json.loads(out)["last_offset"] <= 10
    code, _, err = jobreg("--from-file", str(bad), "state", "--offset", "100000")
    assert code == EXIT_DAMAGED and "damaged at byte" in _one_line(err)


def test_a_dump_from_a_damaged_dump_writes_nothing(dump, tmp_path) -> None:
    bad = _damaged(dump, tmp_path / "cut.avro", lambda d: d[:-100])
    code, _, _ = jobreg("--from-file", str(bad), "dump", "copy.avro", cwd=tmp_path)
    assert code == EXIT_DAMAGED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.avro"]


# -- the audit read path ------------------------------------------------------------------------


def test_audit_check_on_a_database_that_does_not_exist_creates_none(dump, tmp_path) -> None:
    """It printed a SQLAlchemy traceback (no such table: audit_progress) and left a 0-byte
    nonexist.db behind."""
    code, _, err = jobreg("audit", "check", "--db", "sqlite:///nonexist.db", "--from-file",
                          str(dump), cwd=tmp_path)
    assert code == 1
    assert _one_line(err) == "Error: no SQLite database at 'nonexist.db' (create it with " \
                             "migrate first)"
    assert not (tmp_path / "nonexist.db").exists()


@pytest.mark.parametrize("kind", ["text", "empty"])
def test_every_audit_read_on_a_file_that_is_not_an_audit_database_is_one_line(
        dump, tmp_path, kind) -> None:
    import sqlite3

    path = tmp_path / "other.db"
    if kind == "text":
        path.write_text("not a database\n")
    else:
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE t (x)")
    before = path.read_bytes()
    for args in (["check", "--from-file", str(dump)], ["refused"], ["terms"], ["results"],
                 ["query", "SELECT * FROM audit_records"]):
        code, _, err = jobreg("audit", *args[:1], "--db", "sqlite:///other.db", *args[1:],
                              cwd=tmp_path)
        assert code == 1, args
        _one_line(err)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    code, _, err = jobreg("audit", "check", "--db", "sqlite:///other.db", "--from-file",
                          str(dump), cwd=tmp_path)
    assert ("file is not a database" if kind == "text" else
            "'sqlite:///other.db' is not an audit database (it has no audit tables") in err


# -- a record with a valid frame and a garbage body --------------------------------------------


def test_a_garbage_body_is_quarantined_in_words(log) -> None:
    """It was `cannot decode a record with schema id 5: EOFError: Expected -4398046511104
    bytes, read 7`."""
    code, out, err = jobreg("--bootstrap", log["bootstrap"], "--topic", log["topic"],
                            "--namespace", NS, "--json", "quarantine")
    assert code == 0, err
    detail = {r["offset"]: r["detail"] for r in json.loads(out)["records"]}[log["garbage"]]
    assert detail == ("the body does not match schema id 5 (JobLockReleased): a string length "
                      "of -4398046511104 at byte 5 (field envelope.event_id)")


# -- an address where no broker answers --------------------------------------------------------


@contextlib.contextmanager
def _listener(answer: bytes | None) -> Iterator[int]:
    """A loopback listener that accepts and never answers (``None``) or answers ``answer``
    (garbage) to every connection; stopped on exit."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()
        server.close()


def test_an_address_that_accepts_and_never_answers_says_so() -> None:
    with _listener(None) as port:
        code, _, err = jobreg("--bootstrap", f"127.0.0.1:{port}", "--timeout", "2", "jobs")
    assert code == 1
    assert _one_line(err) == (f"Error: no Kafka broker answered at 127.0.0.1:{port} within 2 s "
                              "(nothing there answered the Kafka handshake: a broker that is "
                              "down or paused, a firewall, or the wrong address)")


def test_an_address_that_answers_garbage_is_not_a_kafka_broker() -> None:
    """librdkafka's `Invalid response size ... increase receive.message.max.bytes` suggested
    the wrong fix."""
    with _listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n") as port:
        code, _, err = jobreg("--bootstrap", f"127.0.0.1:{port}", "--timeout", "2", "jobs")
    assert code == 1
    line = _one_line(err)
    assert line.startswith(f"Error: no Kafka broker answered at 127.0.0.1:{port} within 2 s "
                           f"(something at 127.0.0.1:{port} answered, but not in the Kafka "
                           "protocol")
    assert "receive.message.max.bytes" not in line


# -- section 4: files written as a careful tool writes them ------------------------------------


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_dumps_and_reports_get_the_permissions_the_umask_gives(dump, tmp_path, mask,
                                                                mode) -> None:
    """They were -rw------- whatever the umask."""
    with _umask(mask):
        assert jobreg("--from-file", str(dump), "dump", "d.avro", cwd=tmp_path)[0] == 0
        assert jobreg("--from-file", str(dump), "report", "--out", "r.html",
                      cwd=tmp_path)[0] == 0
    for name in ("d.avro", "r.html"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.avro", "r.html"]


@pytest.mark.parametrize("command", [["dump", "precious.txt"],
                                     ["report", "--out", "precious.txt"]])
def test_a_file_that_is_not_jobregs_survives_without_force(dump, tmp_path, command) -> None:
    """dump/report silently replaced any file (a precious.txt became a dump)."""
    precious = tmp_path / "precious.txt"
    precious.write_text("years of notes\n")
    precious.chmod(0o640)
    code, out, err = jobreg("--from-file", str(dump), *command, cwd=tmp_path)
    assert code == 1 and out == ""
    assert _one_line(err) == ("Error: will not replace 'precious.txt': it is not a jobreg "
                              f"{command[0]} (--force replaces it)")
    assert precious.read_text() == "years of notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]
    # with --force it is replaced, and takes the umask's mode, not the old file's
    with _umask(0o022):
        code, _, err = jobreg("--from-file", str(dump), *command, "--force", cwd=tmp_path)
    assert code == 0, err
    assert stat.S_IMODE(precious.stat().st_mode) == 0o644
    assert precious.read_bytes() != b"years of notes\n"


def test_jobregs_own_outputs_are_replaced_without_force(dump, tmp_path) -> None:
    for command in (["dump", "d.avro"], ["report", "--out", "r.html"]):
        for _ in range(2):
            code, _, err = jobreg("--from-file", str(dump), *command, cwd=tmp_path)
            assert code == 0, err
    # a dump is not a report, nor a report a dump: each replaces only its own kind
    code, _, err = jobreg("--from-file", str(dump), "dump", "r.html", cwd=tmp_path)
    assert code == 1 and "--force" in err
    code, _, err = jobreg("--from-file", str(dump), "report", "--out", "d.avro", cwd=tmp_path)
    assert code == 1 and "--force" in err


def test_a_directory_or_a_symlink_to_a_precious_file_is_not_replaced(dump, tmp_path) -> None:
    (tmp_path / "dir.avro").mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep\n")
    (tmp_path / "link.avro").symlink_to(precious)
    for name in ("dir.avro", "link.avro"):
        code, _, err = jobreg("--from-file", str(dump), "dump", name, cwd=tmp_path)
        assert code in (1, 2) and "Traceback" not in err, name
    assert precious.read_text() == "keep\n" and (tmp_path / "link.avro").is_symlink()


def test_the_library_refuses_too(log, tmp_path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("keep\n")
    from registry import ConfigError

    with pytest.raises(ConfigError, match="--force"):
        log["reg"].dump(precious)
    assert precious.read_text() == "keep\n"
    assert log["reg"].dump(precious, force=True) > 0
    assert io.BytesIO(precious.read_bytes()).read(4) == b"Obj\x01"
