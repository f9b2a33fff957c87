"""Streams of JSON lines that several threads write: a stream that makes unlocked writers
interleave on purpose, and a reader that says which lines are not whole.

CPython's text streams do not keep two threads' lines apart: ``print(line)`` is two writes
(the text, then ``"\\n"``), and even one ``write`` of a whole line is split on its way to the
pipe once it is longer than the stream's chunk (8 KiB). :class:`SplitWrites` makes the split
certain instead of likely: each ``write`` lands in two halves with a rendezvous of two writer
threads between them, so two writers that do not hold one lock around a whole line
(write and flush) always merge their lines, and writers that do never do.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from typing import Any

RENDEZVOUS_S = 2.0
"""How long a writer waits in the middle of a write for a second writer to arrive. Correct
writers pay it once (the second writer waits for the lock, so nobody comes; after that the
rendezvous is broken and costs nothing); it only has to be long enough for two unlocked
writers to meet on a loaded machine, which is what makes the failure certain."""


class SplitWrites(io.StringIO):
    """A text stream whose every ``write`` is two writes with a pause between them in which
    another thread's write can land (what the real stream does at its chunk boundaries)."""

    def __init__(self, rendezvous_s: float = RENDEZVOUS_S) -> None:
        super().__init__()
        self._meet = threading.Barrier(2, timeout=rendezvous_s)
        self._guard = threading.Lock()  # the buffer's own integrity, not the lines'
        self.writes = 0

    def write(self, s: str) -> int:
        half = len(s) // 2
        with self._guard:
            self.writes += 1
            super().write(s[:half])
        with contextlib.suppress(threading.BrokenBarrierError):
            self._meet.wait()  # a second writer arrives (unlocked writers) or nobody does
        with self._guard:
            super().write(s[half:])
        return len(s)


def read_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The lines of ``text`` that are one JSON object each, and those that are not."""
    good: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"):
        try:
            message = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if isinstance(message, dict):
            good.append(message)
        else:
            bad.append(line)
    return good, bad
