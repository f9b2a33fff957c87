"""Issue 42, finding 8: two threads of one process write JSON lines to one stdout, and every
line stays whole. The election tests' worker (tests/support/procs/elect_worker.py) reports a
revocation from its renewer thread while its main thread reports a write; unlocked, the two
lines merged after a SIGCONT, the test's reader died on the merged line, and the test saw
nothing for 30 s (the paused-leader test's "open defect")."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

from support.lines import SplitWrites, read_lines

WORKER = Path(__file__).resolve().parents[1] / "support" / "procs" / "elect_worker.py"


def _worker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("elect_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _at_once(*calls) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_the_election_workers_revocation_and_write_lines_stay_whole(monkeypatch) -> None:
    """The renewer's ``revoked`` and the main thread's ``write`` at the same moment (what a
    resumed leader does): a stream whose writes another thread's write can split (as the
    real one can) gets two whole lines."""
    worker = _worker()
    out = SplitWrites()
    monkeypatch.setattr(sys, "stdout", out)
    _at_once(lambda: worker.say(event="revoked", epoch=1),
             lambda: worker.say(event="write", ok=False, error="Fenced", detail="x" * 100))
    good, bad = read_lines(out.getvalue())
    assert bad == [], f"merged lines: {bad!r}"
    assert sorted(m["event"] for m in good) == ["revoked", "write"]


_HAMMER = """
import importlib.util, sys, threading
spec = importlib.util.spec_from_file_location("elect_worker", sys.argv[1])
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
threads, lines, pad = int(sys.argv[2]), int(sys.argv[3]), "p" * int(sys.argv[4])
def run(k):
    for i in range(lines):
        worker.say(event="x", k=k, i=i, pad=pad[: (i * 997) % len(pad)])
ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
"""


def test_the_election_workers_lines_stay_whole_through_a_real_pipe() -> None:
    """The worker's own ``say`` from 6 threads at once into a real pipe (its stdout as the
    test reads it), lines from a few bytes to 20 KB (past the text stream's 8 KiB chunk):
    every line parses, none is lost."""
    threads, lines = 6, 300
    run = subprocess.run([sys.executable, "-c", _HAMMER, str(WORKER), str(threads),
                          str(lines), "20000"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    good, bad = read_lines(run.stdout)
    assert bad == [], f"{len(bad)} merged line(s), the first: {bad[0][:300]!r}"
    assert sorted((m["k"], m["i"]) for m in good) == [
        (k, i) for k in range(threads) for i in range(lines)]


def test_the_split_stream_merges_the_lines_of_unlocked_writers() -> None:
    """The control: two threads that each write a whole line in one write and flush, but
    hold no common lock, merge their lines on :class:`SplitWrites` every time (what the
    bridge's tests rely on to fail without its lock). They meet at once: the long
    rendezvous only keeps a loaded machine from starting the second thread too late."""
    out = SplitWrites(rendezvous_s=60)

    def unlocked(event: str) -> None:
        out.write(f'{{"event": "{event}"}}\n')
        out.flush()

    _at_once(lambda: unlocked("a"), lambda: unlocked("b"))
    good, bad = read_lines(out.getvalue())
    assert good == [] and len(bad) == 2, (good, bad)
