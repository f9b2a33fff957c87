"""A small client of ``jobreg flink-bridge`` for tests: the bridge as a real subprocess,
driven over its pipes as the Java backend drives it (protocol v1)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DEADLINE = 60.0
"""How long a test waits for an answer or an event: a guard against a hung bridge on a loaded
machine, never a timing margin a test relies on."""


class BridgeProcess:
    """``python -m registry flink-bridge ...`` with pipes. :meth:`call` sends a request and
    waits for its answer; :meth:`event` waits for the next event of a kind. One thread reads
    the bridge's stdout: :attr:`seen` holds every event in the order the bridge wrote them."""

    def __init__(self, bootstrap: str, topic: str, namespace: str, contender: str, *,
                 lease: float = 2.0, poll_ms: int = 50, extra: tuple[str, ...] = (),
                 heartbeat: bool = True) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
            "PYTHONPATH", ""))
        self.args = [sys.executable, "-m", "registry", "flink-bridge", "--bootstrap",
                     bootstrap, "--topic", topic, "--namespace", namespace, "--contender",
                     contender, "--lease", str(lease), "--poll-ms", str(poll_ms), *extra]
        self.lease = lease
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=ROOT)
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self._answered = threading.Condition()
        self.seen: list[dict[str, Any]] = []  # every event, in order
        self._cursor: dict[str, int] = {}  # per kind: where event() reads on
        self._ended = False
        self.lines: list[str] = []  # every stdout line, in order
        self.bad_lines: list[str] = []  # those that are not one JSON object (none, ever)
        self.stderr: list[str] = []
        self._write_lock = threading.Lock()
        self._beating = threading.Event()
        if heartbeat:
            self._beating.set()
        self._stopped = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()
        ready = self.event("ready")
        assert ready["protocol"] == 1 and ready["namespace"] == namespace, ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for number, raw in enumerate(self.proc.stdout, 1):
            line = raw.decode(errors="replace")
            self.lines.append(line)
            try:
                message = json.loads(line)
                if not isinstance(message, dict) or not ("event" in message or "id" in message):
                    raise ValueError(line)
            except ValueError:
                # A cut or merged line is an answer (or an event) lost: every waiter fails
                # at once, naming it, and reading goes on (a bridge blocked on a full pipe
                # would hang otherwise).
                with self._answered:
                    self.bad_lines.append(f"line {number}: {line[:300]!r}")
                    self._answered.notify_all()
                continue
            with self._answered:
                if "event" in message:
                    self.seen.append(message)
                else:
                    self._answers[message["id"]] = message
                self._answered.notify_all()
        with self._answered:
            self._ended = True
            self._answered.notify_all()

    def check_lines(self) -> None:
        """Fail, naming them, if the bridge wrote lines that are not one JSON object."""
        assert not self.bad_lines, f"the bridge wrote line(s) that are not one JSON " \
                                   f"object: {self.bad_lines[:3]}; stderr {self.stderr[-5:]}"

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode().rstrip("\n"))

    def _beat(self) -> None:
        # The JVM's heartbeat: every lease / 5 while beating.
        while not self._stopped.wait(self.lease / 5):
            if self._beating.is_set():
                try:
                    self.send_raw(json.dumps({"op": "alive"}))
                except OSError:
                    return

    def pause_heartbeat(self) -> None:
        """Stop sending ``alive`` (a JVM frozen by SIGSTOP or a long GC)."""
        self._beating.clear()

    def resume_heartbeat(self) -> None:
        self._beating.set()

    def send_raw(self, line: str | bytes) -> None:
        data = line.encode() if isinstance(line, str) else line
        assert self.proc.stdin is not None
        with self._write_lock:
            self.proc.stdin.write(data + b"\n")
            self.proc.stdin.flush()

    def send(self, op: str, **args: Any) -> int:
        ident = next(self._ids)
        self.send_raw(json.dumps({"id": ident, "op": op, **args}))
        return ident

    def answer(self, ident: int, timeout: float = DEADLINE) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._answered:
            while ident not in self._answers:
                self.check_lines()
                assert not self._ended, f"the bridge ended before answering request " \
                                        f"{ident}; stderr: {self.stderr[-5:]}"
                left = deadline - time.monotonic()
                assert left > 0, f"no answer to request {ident}; stderr: {self.stderr[-5:]}"
                self._answered.wait(left)
            return self._answers.pop(ident)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send a request and return its whole answer (``ok``, ``result`` or ``error``)."""
        return self.answer(self.send(op, **args))

    def ok(self, op: str, **args: Any) -> Any:
        """Send a request that must succeed; its result."""
        answer = self.call(op, **args)
        assert answer["ok"], (op, args, answer)
        return answer["result"]

    def error(self, op: str, **args: Any) -> str:
        """Send a request that must fail; its error kind."""
        answer = self.call(op, **args)
        assert not answer["ok"], (op, args, answer)
        assert "\n" not in answer["message"]
        return str(answer["error"])

    def event(self, kind: str, timeout: float = DEADLINE) -> dict[str, Any]:
        """The next event of ``kind`` after the one this returned last (each kind is read
        in order on its own: waiting for one kind consumes no event of another)."""
        deadline = time.monotonic() + timeout
        with self._answered:
            while True:
                start = self._cursor.get(kind, 0)
                for i in range(start, len(self.seen)):
                    if self.seen[i]["event"] == kind:
                        self._cursor[kind] = i + 1
                        return self.seen[i]
                self._cursor[kind] = len(self.seen)
                self.check_lines()
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind!r} event; seen {self.seen[-5:]}, stderr " \
                                 f"{self.stderr[-5:]}"
                assert not self._ended, f"the bridge ended waiting for {kind!r}; stderr " \
                                        f"{self.stderr[-5:]}"
                self._answered.wait(min(left, 1.0))

    def close_stdin(self) -> None:
        """EOF on the bridge's stdin: the JVM died."""
        self._stopped.set()
        with self._write_lock:
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout)

    def stop(self, *, check: bool = True) -> None:
        """End the bridge: EOF, then its pid killed if it does not leave. A line it wrote
        that was not one JSON object fails here (``check``), if no wait failed on it first."""
        self._stopped.set()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                self.close_stdin()
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(DEADLINE)
        if check:
            self.check_lines()
