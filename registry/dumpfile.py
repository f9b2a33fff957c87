"""The dump file: an Avro object container file of one namespace's records, and how a damaged
one is told apart from a good one.

A dump (``jobreg dump``, :meth:`registry.forensics.Forensics.dump`) is written with
:func:`write_dump` and read with :class:`DumpReader`. Format ``jobreg-dump/2`` (this
version's) ends with an **end marker**: a last Avro record (partition ``-1``, key
``jobreg.end``) that holds the number of records and a SHA-256 over them and over the
header's metadata. Avro's deflate blocks carry no checksum, so without it a damaged block
that still decompresses would read as other records, and a file cut at a block boundary as a
shorter log; with it, both are found at the end of the read. Dumps of format
``jobreg-dump/1`` (earlier versions) have no marker: they are read with every check but
those two.

**Damage** is reported as :class:`~registry.errors.DamagedDump`, one line naming the file,
the byte and data block where it lies and what is wrong, and how many records lie before
it. Records are handed out as they are read, so a read that stops before the damage
(``state --offset`` at an offset before it) is answered from the records it read; a read
that reaches it fails, and nothing reads past it. A file that is not an Avro container at
all is a :class:`~registry.errors.ConfigError` (not a dump).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import fastavro
import fastavro.schema

from .errors import ConfigError, DamagedDump
from .image import LogRecord

__all__ = ["DUMP_FORMAT", "DUMP_FORMATS", "DUMP_SCHEMA", "DumpReader", "is_dump", "write_dump"]

DUMP_SCHEMA = {
    "type": "record",
    "name": "DumpRecord",
    "namespace": "jobreg.dump",
    "doc": "One record of the registry topic, as read (key and value untouched).",
    "fields": [
        {"name": "partition", "type": "int"},
        {"name": "offset", "type": "long"},
        {"name": "timestamp", "type": ["null", "long"], "default": None},
        {"name": "key", "type": ["null", "bytes"], "default": None},
        {"name": "value", "type": ["null", "bytes"], "default": None},
    ],
}
"""The Avro schema of a dump's records; the writer schemas of the values travel in the
file's metadata (``jobreg.catalog``)."""

DUMP_FORMAT = "jobreg-dump/2"
"""The format this version writes (``jobreg.format`` in the file's metadata)."""
DUMP_FORMATS = ("jobreg-dump/1", DUMP_FORMAT)
"""The formats this version reads."""

_AVRO_MAGIC = b"Obj\x01"
_END_PARTITION = -1
_END_KEY = b"jobreg.end"
_HEADER_KEYS = ("jobreg.format", "jobreg.namespace", "jobreg.topic", "jobreg.catalog",
                "avro.codec")
_CANONICAL = fastavro.schema.to_parsing_canonical_form(DUMP_SCHEMA)
_NUMBERS = struct.Struct(">iqq")


class _Digest:
    """SHA-256 over the header's metadata and every record, in order (lengths included, so
    no two different sequences hash alike)."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self._sha = hashlib.sha256()
        for key in _HEADER_KEYS:
            self._bytes(str(metadata.get(key, "")).encode())

    def _bytes(self, data: bytes | None) -> None:
        self._sha.update(struct.pack(">q", -1 if data is None else len(data)))
        if data is not None:
            self._sha.update(data)

    def add(self, rec: Mapping[str, Any]) -> None:
        ts = rec["timestamp"]
        self._sha.update(_NUMBERS.pack(rec["partition"], rec["offset"],
                                       -1 if ts is None else ts))
        self._bytes(rec["key"])
        self._bytes(rec["value"])

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def write_dump(f: BinaryIO, metadata: Mapping[str, str],
               records: Iterator[dict[str, Any]]) -> None:
    """Write ``records`` (dicts of :data:`DUMP_SCHEMA`) to ``f`` as a dump of format
    :data:`DUMP_FORMAT` with ``metadata`` (``jobreg.namespace``, ``jobreg.topic``,
    ``jobreg.catalog``), and the end marker after the last record."""
    meta = {**metadata, "jobreg.format": DUMP_FORMAT}
    schema = fastavro.parse_schema(DUMP_SCHEMA)
    # The digest covers the header as a reader sees it (the codec included); the record
    # schema (avro.schema) the reader checks against DUMP_SCHEMA itself.
    digest = _Digest({**meta, "avro.codec": "deflate"})
    count = 0

    def with_end() -> Iterator[dict[str, Any]]:
        nonlocal count
        for rec in records:
            digest.add(rec)
            count += 1
            yield rec
        end = {"records": count, "sha256": digest.hexdigest()}
        yield {"partition": _END_PARTITION, "offset": count, "timestamp": None,
               "key": _END_KEY, "value": json.dumps(end).encode()}

    fastavro.writer(f, schema, with_end(), metadata=meta, codec="deflate")


def is_dump(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a jobreg dump (its header says so; the records are not read):
    what :func:`registry.files.atomic_write` may replace without ``force``."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != _AVRO_MAGIC:
                return False
            f.seek(0)
            return fastavro.reader(f).metadata.get("jobreg.format") in DUMP_FORMATS
    except Exception:  # unreadable, or a header that does not parse: not one we can vouch for
        return False


def _said(e: BaseException) -> str:
    """What went wrong, in words, for a failure of fastavro or zlib inside a data block."""
    if isinstance(e, zlib.error):
        why = str(e).partition(": ")[2] or str(e)
        return f"its compressed data is corrupt (deflate: {why})"
    if isinstance(e, EOFError):
        return "the file ends inside it (cut short, or its length is damaged)"
    if isinstance(e, ValueError) and "sync marker" in str(e):
        return "its sync marker is not where its length says (its length or contents are damaged)"
    if isinstance(e, MemoryError | OverflowError):
        return "it claims an impossible length"
    return "it does not decode"


class DumpReader:
    """Reads a dump: :attr:`metadata` on opening, then :meth:`records` in file order.

    Raises :class:`~registry.errors.ConfigError` for a file that cannot be read or is not an
    Avro container at all, and :class:`~registry.errors.DamagedDump` for a dump whose header
    or data is damaged (see the module docstring).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.position = 0
        """Bytes read so far (for progress bars)."""
        try:
            with self.path.open("rb") as f:
                magic = f.read(4)
                if magic != _AVRO_MAGIC:
                    raise ConfigError(f"{self.path}: not a jobreg dump (not an Avro object "
                                      "container file)")
                f.seek(0)
                try:
                    meta = fastavro.reader(f).metadata
                except Exception as e:
                    f.seek(0)
                    if b"jobreg.format" not in f.read(1 << 20):  # the header's first MiB
                        raise ConfigError(f"{self.path}: not a jobreg dump (not an Avro object "
                                          "container file)") from e
                    raise self._header(f"its header does not parse ({_header_said(e)})") from e
        except OSError as e:
            raise ConfigError(f"{self.path}: cannot read it ({e.strerror or e})") from e
        fmt = meta.get("jobreg.format")
        if fmt not in DUMP_FORMATS:
            if fmt is None:
                raise ConfigError(f"{self.path}: not a jobreg dump (an Avro file without "
                                  "jobreg's format mark; `jobreg dump` writes dumps)")
            raise ConfigError(f"{self.path}: not a jobreg dump this version reads (format "
                              f"{fmt!r}; it reads {', '.join(DUMP_FORMATS)})")
        for key in ("jobreg.namespace", "jobreg.topic", "jobreg.catalog"):
            if key not in meta:
                raise self._header(f"it has no {key}")
        try:
            canonical = fastavro.schema.to_parsing_canonical_form(json.loads(meta["avro.schema"]))
        except Exception:
            canonical = None
        if canonical != _CANONICAL:
            raise self._header("its record schema (avro.schema) is not a dump's")
        self.metadata: dict[str, str] = meta
        self.format: str = fmt

    def _header(self, what: str) -> DamagedDump:
        return DamagedDump(f"{self.path}: damaged header: {what}")

    def records(self) -> Iterator[LogRecord]:
        """Every record of the dump, in file order; :class:`~registry.errors.DamagedDump`
        where the data is damaged, after the records before it."""
        count = 0
        last: int | None = None
        digest = _Digest(self.metadata)
        end: dict[str, Any] | None = None
        size = self.path.stat().st_size
        with self.path.open("rb") as f:
            try:
                blocks = iter(fastavro.block_reader(f))
            except Exception as e:
                raise self._header(f"its header does not parse ({_header_said(e)})") from e
            index = 0
            while True:
                start = f.tell()
                index += 1
                where = f"byte {start} (data block {index})"
                try:
                    block = next(blocks)
                    recs = list(block)
                except StopIteration:
                    break
                except Exception as e:
                    raise self._damaged(where, _said(e), count, last) from e
                # fastavro's stub leaves out Block.bytes_ (the block's data, a BytesIO),
                # which its Block sets.
                body = block.bytes_  # type: ignore[attr-defined]
                if body.tell() != len(body.getvalue()):
                    raise self._damaged(where, f"it holds more data than its {block.num_records}"
                                        " record(s)", count, last)
                self.position = f.tell()
                for rec in recs:
                    if end is not None:
                        raise self._damaged(where, "records follow the end marker", count, last)
                    if not _well_formed(rec):
                        raise self._damaged(where, "a record does not decode", count, last)
                    if rec["partition"] == _END_PARTITION and rec["key"] == _END_KEY:
                        end = _end_marker(rec)
                        if self.format != DUMP_FORMAT:
                            raise self._damaged(where, f"an end marker in a dump of format "
                                                f"{self.format} (its header was changed)",
                                                count, last)
                        if end is None:
                            raise self._damaged(where, "its end marker does not decode",
                                                count, last)
                        continue
                    digest.add(rec)
                    count += 1
                    last = rec["offset"]
                    yield LogRecord(rec["offset"], rec["key"], rec["value"], rec["timestamp"],
                                    rec["partition"])
        if self.format == DUMP_FORMAT:
            if end is None:
                raise DamagedDump(f"{self.path}: truncated: it ends at byte {size} after "
                                  f"{_records(count, last)}, without its end marker")
            if end["records"] != count or end["sha256"] != digest.hexdigest():
                said = (f"{end['records']} records" if end["records"] != count
                        else "other records (SHA-256)")
                raise DamagedDump(f"{self.path}: damaged: its end marker says {said}, the "
                                  f"file holds {_records(count, last)} (a data block or the "
                                  "header was changed)")

    def _damaged(self, where: str, what: str, count: int, last: int | None) -> DamagedDump:
        return DamagedDump(f"{self.path}: damaged at {where}: {what}; "
                           f"{_records(count, last)} before it")


def _records(count: int, last: int | None) -> str:
    if count == 0:
        return "0 records"
    return f"{count} record{'s' * (count != 1)} (to offset {last})"


def _header_said(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"its schema is not JSON at char {e.pos}"
    if isinstance(e, UnicodeDecodeError):
        return "its metadata is not UTF-8"
    if isinstance(e, EOFError):
        return "the file ends inside it"
    text = " ".join(str(e).split())
    # fastavro's own messages are short sentences; others (a KeyError's key) are not
    return text if isinstance(e, ValueError) and 0 < len(text) < 80 else "it does not decode"


def _well_formed(rec: object) -> TypeGuard[dict[str, Any]]:
    """A record as :data:`DUMP_SCHEMA` says (fastavro decodes any bytes into its types; the
    ranges it cannot check, this does)."""
    return (isinstance(rec, dict) and type(rec.get("partition")) is int
            and type(rec.get("offset")) is int
            and (rec.get("timestamp") is None or type(rec["timestamp"]) is int))


def _end_marker(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        end = json.loads(rec["value"])
    except (TypeError, ValueError):
        return None
    if not isinstance(end, dict) or type(end.get("records")) is not int \
            or not isinstance(end.get("sha256"), str):
        return None
    return end
