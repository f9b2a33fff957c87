"""The Flink bridge's protocol parsing and error mapping (no broker): every line gets exactly
one answer or one line on stderr, never a crash."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import IO, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.lines import SplitWrites, read_lines

from registry.errors import (
    BrokerError,
    ConfigError,
    Fenced,
    LeaseExpired,
    OutcomeUnknown,
    UnknownJob,
    WriteRejected,
)
from registry.flink_bridge import (
    Bridge,
    BridgeError,
    _Lead,
    checkpoint_id_of,
    checkpoint_name,
    error_kind,
    parse_request,
    session_of,
)


def test_a_request_parses_with_its_arguments() -> None:
    r = parse_request('{"id": 7, "op": "store_add", "store": "plans", "name": "n", '
                      '"pointer": "p", "extra": 1}')
    assert (r.id, r.op, dict(r.args), r.error) == (7, "store_add",
                                                   {"store": "plans", "name": "n",
                                                    "pointer": "p"}, None)
    assert parse_request(b'{"op": "alive"}').id is None
    assert parse_request('{"id": 1, "op": "publish", "component": "c", "session": "s", '
                         '"address": null}').args["address"] is None
    # an optional argument: absent, it is left to the op's default; present, it is checked
    r = parse_request('{"id": 8, "op": "store_add", "store": "checkpoints/j", "name": "n", '
                      '"pointer": "p", "retained": 3}')
    assert r.error is None and r.args["retained"] == 3


@pytest.mark.parametrize("line, why", [
    ('{"id": 1, "op": "nope"}', "unknown op"),
    ('{"id": 1}', "unknown op"),
    ('{"id": 1, "op": "store_get", "store": "plans"}', "needs 'name'"),
    ('{"id": 1, "op": "counter_set", "job": "j", "value": "3"}', "'value' must be int"),
    ('{"id": 1, "op": "counter_set", "job": "j", "value": true}', "'value' must be int"),
    ('{"id": 1, "op": "store_add", "store": "s", "name": "n", "pointer": "p", "retained": "3"}',
     "'retained' must be int, optional"),
    ('{"id": 1, "op": "publish", "component": "c", "session": 3, "address": null}',
     "'session' must be str"),
])
def test_a_bad_request_with_an_id_is_answered_invalid(line: str, why: str) -> None:
    r = parse_request(line)
    assert r.id == 1 and r.error is not None and why in r.error


@pytest.mark.parametrize("line", ["", "not json", "[1]", '{"op": "leaders"}',
                                  '{"id": "1", "op": "leaders"}', '{"id": true, "op": "x"}',
                                  b"\xff"])
def test_a_line_without_an_id_cannot_be_answered(line: str | bytes) -> None:
    with pytest.raises(BridgeError) as e:
        parse_request(line)
    assert e.value.kind == "Invalid" and "\n" not in str(e.value)


def test_checkpoint_names_are_flinks() -> None:
    assert checkpoint_name(42) == "/0000000000000000042"
    assert checkpoint_id_of("/0000000000000000042") == 42
    for bad in ("", "/", "/x", "/-1", "/" + "9" * 20):
        with pytest.raises(BridgeError):
            checkpoint_id_of(bad)


def test_the_session_is_derived_from_namespace_and_epoch() -> None:
    assert session_of("ns", 3) == session_of("ns", 3) != session_of("ns", 4)
    assert session_of("ns", 3) != session_of("other", 3)


@pytest.mark.parametrize("error, kind", [
    (OutcomeUnknown("m", ("e",)), "OutcomeUnknown"),
    (Fenced("stale_epoch", "m"), "Fenced"),
    (WriteRejected("job_exists", "m"), "AlreadyExists"),
    (WriteRejected("terminal_job", "m"), "AlreadyExists"),
    (WriteRejected("checkpoint_id_not_increasing", "m"), "Invalid"),
    (UnknownJob("ns", "j"), "NotExist"),
    (ConfigError("m"), "Invalid"),
    (LeaseExpired("m"), "Unavailable"),
    (BrokerError("m"), "Unavailable"),
    (BridgeError("NotLeader", "m"), "NotLeader"),
    (RuntimeError("m"), "Internal"),
])
def test_exact_outcomes_map_to_error_kinds(error: Exception, kind: str) -> None:
    assert error_kind(error)[0] == kind


def test_messages_are_one_line() -> None:
    assert error_kind(ConfigError("a\nb\r\nc"))[1] == "a b c"


class _NoRegistry:
    """Stands in for a Registry where a test sends only lines that never reach it."""

    namespace = "unit"
    timeout = 1.0


def _bridge(out: io.StringIO) -> Bridge:
    return Bridge(_NoRegistry(), "c", 5.0, out=out)  # type: ignore[arg-type]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.dictionaries(st.sampled_from(["id", "op", "store", "name", "value", "job", "x"]),
                    _json_values, max_size=5).map(lambda d: json.dumps(d).encode()),
))
def test_no_line_crashes_the_bridge(line: bytes) -> None:
    """Any line: at most one answer (``Invalid``), or one line on stderr, or a request
    handed to the pool (a well-formed one: not sent here); never an exception."""
    out = io.StringIO()
    bridge = _bridge(out)
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    log = logging.getLogger("registry.flink_bridge")
    log.addHandler(handler)
    try:
        try:
            request = parse_request(line)
        except BridgeError:
            request = None
        if request is not None and request.id is not None and request.error is None:
            return  # a valid request: it would go to the pool and the registry
        bridge.handle_line(line)
    finally:
        log.removeHandler(handler)
        bridge._pool.shutdown()
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    if request is None:
        assert answers == [] and len(logged) == 1
        assert "\n" not in logged[0].getMessage()
    elif request.id is None:
        assert answers == [] and logged == []  # alive
    else:
        assert len(answers) == 1 and logged == []
        answer: dict[str, Any] = answers[0]
        assert answer["id"] == request.id and answer["error"] == "Invalid"
        assert "\n" not in answer["message"]


# -- issue 42, finding 8: answers and events from many threads, each line whole ---------------
#
# The bridge's stdout has writers on several threads: the request pool (answers), the
# election's renewer (``lease`` through ``_on_renewed``), the contender (``granted``,
# ``revoked``), the watch poller (``leader``) and the reader of stdin (``Invalid``). A merged
# line is an answer Flink never gets (its reader drops a line that is not JSON): every line
# goes through ``Bridge.emit``, one write and one flush under one lock.


@dataclass
class _Leader:
    session: str
    address: str


class _Leaders:
    """Stands in for a Registry whose image holds ``count`` leader entries (for
    ``op_leaders``, whose answer then runs to ``count`` x ``size`` bytes)."""

    namespace = "unit"
    timeout = 1.0

    def __init__(self, count: int, size: int) -> None:
        self.image = SimpleNamespace(leaders={
            f"component-{i}": _Leader(f"session-{i}", f"{i}-" + "a" * size)
            for i in range(count)})

    def sync(self) -> SimpleNamespace:
        return self.image


class _Renewing:
    """Stands in for the election of a term this bridge leads and has announced."""

    def valid_for(self) -> float:
        return 1.5


def _leading(bridge: Bridge, epoch: int = 3) -> SimpleNamespace:
    """A term the bridge leads (announced, as after ``granted``): ``_on_renewed`` of it
    emits ``lease``, as the election's renewer thread does after each renewal."""
    term = SimpleNamespace(epoch=epoch)
    bridge._lead = _Lead(_Renewing(), term, session_of("unit", epoch),  # type: ignore[arg-type]
                         announced=True)
    return term


def test_an_answer_and_a_renewal_at_once_are_two_whole_lines() -> None:
    """A pool thread's answer and the renewer's ``lease`` at the same moment, on a stream
    whose writes another thread's write can split (as the real stream can past its chunk):
    two whole lines."""
    out = SplitWrites()
    bridge = Bridge(_Leaders(3, 10), "c", 5.0, out=out)  # type: ignore[arg-type]
    term = _leading(bridge)
    try:
        threads = [threading.Thread(target=bridge._serve, args=(
                       parse_request('{"id": 1, "op": "leaders"}'),)),
                   threading.Thread(target=bridge._on_renewed, args=(term,))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        bridge._pool.shutdown()
    good, bad = read_lines(out.getvalue())
    assert bad == [], f"merged lines: {bad!r}"
    assert sorted(str(m.get("event", m.get("id"))) for m in good) == ["1", "lease"]


def _pipe(kind: str) -> tuple[IO[str], IO[str]]:
    """A pipe whose write end is a text stream as Python makes ``sys.stdout`` for a pipe:
    ``buffered`` (text over a BufferedWriter) or ``unbuffered`` (``PYTHONUNBUFFERED=1``:
    text over the raw file, one write(2) per write, which the kernel interleaves with
    other threads' past PIPE_BUF)."""
    r, w = os.pipe()
    out: IO[str]
    if kind == "unbuffered":
        out = io.TextIOWrapper(io.FileIO(w, "w"), encoding="utf-8", write_through=True)
    else:
        out = os.fdopen(w, "w", encoding="utf-8")
    return os.fdopen(r, encoding="utf-8"), out


@pytest.mark.parametrize("kind", ["buffered", "unbuffered"])
def test_concurrent_answers_and_notifications_through_a_real_pipe_are_whole_and_all_there(
        kind: str) -> None:
    """The bridge's real paths at once, into a real pipe: 400 requests through
    ``handle_line`` (answered by the pool's 8 threads, each answer ~14 KB: past PIPE_BUF and
    the text stream's 8 KiB chunk), while a renewer thread emits 400 ``lease`` events and a
    poller thread 400 ``leader`` events. Every line parses; every answer and event is there
    once. (Without the bridge's lock the unbuffered stream gets ~100 merged lines a run.)"""
    requests, events = 400, 400
    read_end, out = _pipe(kind)
    bridge = Bridge(_Leaders(40, 300), "c", 5.0, out=out)  # type: ignore[arg-type]
    term = _leading(bridge)
    text: list[str] = []
    reader = threading.Thread(target=lambda: text.append(read_end.read()))
    reader.start()

    def renewer() -> None:
        for _ in range(events):
            bridge._on_renewed(term)  # type: ignore[arg-type]

    def poller() -> None:
        for i in range(events):
            bridge._emit_leader("dispatcher", (f"session-{i}", "x" * (i * 37 % 9000)))

    writers = [threading.Thread(target=renewer), threading.Thread(target=poller)]
    try:
        for t in writers:
            t.start()
        for ident in range(1, requests + 1):
            bridge.handle_line(f'{{"id": {ident}, "op": "leaders"}}')
        for t in writers:
            t.join()
    finally:
        bridge._pool.shutdown(wait=True)
        out.close()
    reader.join()
    read_end.close()
    good, bad = read_lines(text[0])
    assert bad == [], f"{len(bad)} line(s) not whole, the first: {bad[0][:200]!r}"
    answers = sorted(m["id"] for m in good if "id" in m)
    assert answers == list(range(1, requests + 1))
    assert all(m["ok"] and len(m["result"]) == 40 for m in good if "id" in m)
    leases = [m for m in good if m.get("event") == "lease"]
    assert len(leases) == events and {m["epoch"] for m in leases} == {3}
    leaders = [m["session"] for m in good if m.get("event") == "leader"]
    assert leaders == [f"session-{i}" for i in range(events)]  # one thread: in its order


_BIG_ANSWER = """
import signal, sys
from registry.flink_bridge import Bridge

class NoRegistry:
    namespace = "unit"
    timeout = 1.0

signal.signal(signal.SIGUSR1, lambda signum, frame: None)  # a signal with a handler
bridge = Bridge(NoRegistry(), "c", 5.0)  # its stdout, as `jobreg flink-bridge` makes it
bridge._answer(1, "b" * 300_000)
bridge.emit({"event": "lease", "epoch": 1, "valid_for_ms": 1})
bridge._pool.shutdown()
"""


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and pipe sizes")
@pytest.mark.parametrize("interruption", ["SIGSTOP", "SIGUSR1"])
def test_a_signal_while_an_answer_waits_for_a_full_pipe_cuts_no_line(interruption: str) -> None:
    """The JVM reads slowly (a GC pause): the bridge's answer of 300 KB fills the pipe and
    its write waits. A signal then (SIGSTOP and SIGCONT: job control, a debugger; a signal
    with a handler) makes write(2) return what it wrote so far. Python's stdout under
    ``PYTHONUNBUFFERED=1`` (text over the raw file) drops the rest of such a write without a
    word: the answer is cut and the next line glued to it, two lines Flink never gets. The
    bridge's stdout keeps every line whole whatever the environment says."""
    import fcntl
    import signal
    import subprocess
    import termios
    import time

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    child = subprocess.Popen([sys.executable, "-c", _BIG_ANSWER], stdout=subprocess.PIPE,
                             env=env)
    assert child.stdout is not None
    try:
        fd = child.stdout.fileno()
        full = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        deadline = time.monotonic() + 60  # a guard against a hang, not a margin
        waiting = bytearray(4)
        while True:  # the pipe full: the child waits in write(2), the answer half written
            fcntl.ioctl(fd, termios.FIONREAD, waiting)
            if int.from_bytes(waiting, sys.byteorder) >= full:
                break
            assert time.monotonic() < deadline and child.poll() is None, "never filled"
            time.sleep(0.01)
        os.kill(child.pid, getattr(signal, interruption))
        if interruption == "SIGSTOP":
            while _state(child.pid) != "T":
                assert time.monotonic() < deadline, "never stopped"
                time.sleep(0.01)
            os.kill(child.pid, signal.SIGCONT)
        out = child.stdout.read().decode()
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    good, bad = read_lines(out)
    assert bad == [], f"cut lines: {[(len(b), b[-40:]) for b in bad]}"
    assert [(m.get("id"), m.get("event")) for m in good] == [(1, None), (None, "lease")]
    assert len(good[0]["result"]) == 300_000
