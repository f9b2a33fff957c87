"""Named points where a test or the fault campaign can stall a thread (off in production).

The write path and the election call :func:`point` at the windows between two steps whose
order matters (planning a group and sending it, reading the log and claiming, one group's
settling and the next group's write). With no controller installed, :func:`point` is one
global read and a return: nothing else runs, nothing is allocated.

A test installs a controller with :func:`installed`; the controller is called with the
point's name (and keyword details) on the thread that reached it, and may block that thread
for as long as it likes (an :class:`Gate` holds it until the test opens it)::

    with stalls.installed(stalls.Gate("write.planned")) as gate:
        t = threading.Thread(target=term.reassert); t.start()
        gate.wait_reached()          # the writer has planned and not sent
        term.checkpoint_completed(...)
        gate.open()                  # now it sends

``jobreg torture`` installs a :class:`Random` controller (seeded) that sleeps at points it
draws. Every point's name is in :data:`POINTS`; :func:`point` refuses any other (a typo in
a test would otherwise stall nothing).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["POINTS", "Gate", "Random", "install", "installed", "point"]

POINTS: dict[str, str] = {
    "write.planned": "a group's records are planned (reassertions included) and not yet sent",
    "write.sent": "a group's records are handed to the producer and not yet confirmed",
    "write.settling": "a group's answer is read and its follow-up settling not yet planned",
    "election.read": "a contender has read the log and not yet decided to claim",
    "election.claiming": "a contender decided to claim and has not yet sent its grant",
    "election.renewing": "the leader decided to renew and has not yet sent the renewal",
}
"""Every stall point: name -> the window it opens."""

_controller: Callable[..., None] | None = None


def point(name: str, **detail: Any) -> None:
    """Reach the stall point ``name``: the installed controller may stall this thread."""
    controller = _controller
    if controller is not None:
        if name not in POINTS:
            raise KeyError(f"no stall point {name!r}; the points are {sorted(POINTS)}")
        controller(name, **detail)


def install(controller: Callable[..., None] | None) -> None:
    """Install ``controller`` for the rest of the process (``None``: remove it); for a
    process that lives to be stalled, such as a fault campaign's worker."""
    global _controller
    _controller = controller


@contextlib.contextmanager
def installed(controller: Callable[..., None]) -> Iterator[Any]:
    """Install ``controller`` for the block (one at a time: a second raises)."""
    global _controller
    if _controller is not None:
        raise RuntimeError("a stall controller is already installed")
    _controller = controller
    try:
        yield controller
    finally:
        _controller = None
        release = getattr(controller, "open", None)
        if release is not None:
            release()


class Gate:
    """Holds the first ``count`` threads that reach point ``name`` until :meth:`open`
    (later arrivals pass). ``when``: a predicate on the point's details that a thread
    must meet to be held."""

    def __init__(self, name: str, *, count: int = 1,
                 when: Callable[..., bool] | None = None) -> None:
        if name not in POINTS:
            raise KeyError(f"no stall point {name!r}; the points are {sorted(POINTS)}")
        self.name = name
        self._left = count
        self._when = when
        self._lock = threading.Lock()
        self._reached = threading.Event()
        self._opened = threading.Event()
        self.details: list[dict[str, Any]] = []

    def __call__(self, name: str, **detail: Any) -> None:
        if name != self.name or (self._when is not None and not self._when(**detail)):
            return
        with self._lock:
            if self._left <= 0 or self._opened.is_set():
                return
            self._left -= 1
            self.details.append(detail)
        self._reached.set()
        self._opened.wait()

    def wait_reached(self, timeout: float = 30.0) -> None:
        """Block until a thread is held at the point (``TimeoutError`` otherwise)."""
        if not self._reached.wait(timeout):
            raise TimeoutError(f"no thread reached stall point {self.name!r} in {timeout} s")

    def open(self) -> None:
        """Let every held thread (and every later one) go on."""
        self._opened.set()


class Random:
    """Stalls a thread at a point with probability ``p`` for up to ``max_s`` seconds,
    drawn from ``random.Random(seed)`` (the fault campaign's nemesis of threads)."""

    def __init__(self, seed: int | str, *, p: float = 0.05, max_s: float = 0.2,
                 points: tuple[str, ...] | None = None) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.p = p
        self.max_s = max_s
        self.points = tuple(POINTS) if points is None else points
        self.stalls: dict[str, int] = {}

    def __call__(self, name: str, **detail: Any) -> None:
        if name not in self.points:
            return
        with self._lock:
            if self._rng.random() >= self.p:
                return
            pause = self._rng.uniform(0, self.max_s)
            self.stalls[name] = self.stalls.get(name, 0) + 1
        time.sleep(pause)
