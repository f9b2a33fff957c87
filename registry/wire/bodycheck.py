"""Where, and how, an Avro body fails its writer schema: words for a record the codec cannot
decode.

fastavro says only what broke in Python's terms (``EOFError: Expected -4398046511104
bytes, read 7``) and not where. When a decode fails, :func:`explain` walks the body along
the writer schema (the Avro binary encoding's rules, read-only, no values built) and says
which field, at which byte, and what in the bytes is impossible: a negative length, a
length past the end, a union branch that does not exist, a string that is not UTF-8. It
runs only on failures, so the decoding itself stays fastavro's.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["explain"]

_FIXED_SIZE = {"float": 4, "double": 8}


class _Bad(Exception):
    def __init__(self, what: str, at: int, path: str) -> None:
        super().__init__(what)
        self.what, self.at, self.path = what, at, path


class _Walk:
    def __init__(self, data: bytes, start: int) -> None:
        self.data, self.pos = data, start
        self.names: dict[str, Any] = {}

    def bad(self, what: str, at: int, path: str) -> _Bad:
        return _Bad(what, at, path)

    def long(self, path: str) -> int:
        at, shift, value = self.pos, 0, 0
        while True:
            if self.pos >= len(self.data):
                raise self.bad("the body ends inside a number", at, path)
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise self.bad("a number longer than 10 bytes", at, path)
        return (value >> 1) ^ -(value & 1)

    def take(self, n: int, what: str, at: int, path: str) -> bytes:
        if n < 0:
            raise self.bad(f"a {what} length of {n}", at, path)
        left = len(self.data) - self.pos
        if n > left:
            raise self.bad(f"a {what} length of {n} with {left} byte(s) left", at, path)
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def walk(self, schema: Any, path: str) -> None:
        if isinstance(schema, list):
            at = self.pos
            branch = self.long(path)
            if not 0 <= branch < len(schema):
                raise self.bad(f"union branch {branch} (the union has {len(schema)})", at, path)
            self.walk(schema[branch], path)
            return
        if isinstance(schema, dict):
            kind = schema.get("type")
            name = schema.get("name")
            if name and kind in ("record", "enum", "fixed", "error"):
                self.names.setdefault(name, schema)
            if kind in ("record", "error"):
                for field in schema.get("fields", []):
                    self.walk(field["type"], f"{path}.{field['name']}" if path
                              else field["name"])
            elif kind == "enum":
                at = self.pos
                index = self.long(path)
                if not 0 <= index < len(schema.get("symbols", [])):
                    raise self.bad(f"enum symbol {index} (the enum has "
                                   f"{len(schema.get('symbols', []))})", at, path)
            elif kind == "fixed":
                self.take(int(schema.get("size", 0)), "fixed", self.pos, path)
            elif kind in ("array", "map"):
                self._blocks(schema, kind, path)
            else:
                self.walk(kind, path)
            return
        if schema in ("null",):
            return
        if schema == "boolean":
            self.take(1, "boolean", self.pos, path)
        elif schema in ("int", "long"):
            self.long(path)
        elif schema in _FIXED_SIZE:
            at = self.pos
            if len(self.data) - at < _FIXED_SIZE[schema]:
                raise self.bad(f"the body ends inside a {schema}", at, path)
            self.pos += _FIXED_SIZE[schema]
        elif schema in ("bytes", "string"):
            at = self.pos
            data = self.take(self.long(path), schema, at, path)
            if schema == "string":
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    raise self.bad("a string that is not UTF-8", at, path) from None
        elif isinstance(schema, str) and schema in self.names:
            self.walk(self.names[schema], path)

    def _blocks(self, schema: dict[str, Any], kind: str, path: str) -> None:
        while True:
            at = self.pos
            count = self.long(path)
            if count == 0:
                return
            if count < 0:
                self.long(path)  # the block's size in bytes
                count = -count
            if count > len(self.data) - self.pos:  # every item takes a byte at least
                raise self.bad(f"an {kind} of {count} item(s) with "
                               f"{len(self.data) - self.pos} byte(s) left", at, path)
            for _ in range(count):
                if kind == "map":
                    self.walk("string", f"{path}[key]")
                self.walk(schema.get("items") if kind == "array" else schema.get("values"),
                          f"{path}[]")


def explain(schema: Any, data: bytes, start: int) -> str | None:
    """What in ``data[start:]`` does not fit ``schema`` (a fastavro-parsed writer schema), as
    ``"<what> at byte N (field F)"``; ``None`` if the walk finds nothing wrong (the caller
    then says what fastavro said, in its own words)."""
    walk = _Walk(bytes(data), start)
    try:
        walk.walk(schema, "")
    except _Bad as e:
        return f"{e.what} at byte {e.at}" + (f" (field {e.path})" if e.path else "")
    except (RecursionError, struct.error, TypeError, ValueError, KeyError):
        return None
    if walk.pos != len(data):
        return f"{len(data) - walk.pos} byte(s) left over after the record at byte {walk.pos}"
    return None
