"""A coordinator process for the election tests: leads via elect(), writes, reports JSON lines.

usage: elect_worker.py BOOTSTRAP TOPIC NAMESPACE CONTENDER LEASE_S SECONDS

Two threads report: the main thread (``leader``, each ``write`` with its number ``n``) and
the election's renewer (``revoked``, with ``writes_begun``: how many write calls had begun
when the term was lost). :func:`say` writes each line whole, under one lock.
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import threading
import time

from registry import LeaseExpired, Registry, RegistryError

_out = threading.Lock()


def say(**fields) -> None:
    """One JSON line on stdout, whole: the renewer thread (``revoked``) and the main thread
    (``write``) both report, and neither ``print`` (the text, then the newline: two writes)
    nor one unlocked ``write`` (split past the stream's chunk) keeps their lines apart; the
    test's reader then got a merged line (issue 42, finding 8)."""
    line = json.dumps({"t": time.monotonic(), **fields}) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


def main() -> None:
    # SIGUSR1: every thread's stack on stderr (a test that waits in vain asks for them).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    bootstrap, topic, namespace, contender, lease, seconds = sys.argv[1:7]
    lease_s, until = float(lease), time.monotonic() + float(seconds)
    reg = Registry.connect(bootstrap, namespace, topic=topic, timeout=lease_s / 2)
    say(event="contending", contender=contender)
    # Write calls begun so far (the main thread counts one before it calls): the renewer
    # reports it with the revocation, so the test knows which writes began after it.
    begun = [0]
    election = reg.elect(contender, lease=lease_s,
                         on_revoked=lambda term: say(event="revoked", epoch=term.epoch,
                                                     writes_begun=begun[0]))
    term = election.acquire(timeout=120)
    say(event="leader", epoch=term.epoch)
    while time.monotonic() < until:
        begun[0] += 1
        n = begun[0]
        try:
            receipt = term.submit(f"{contender}-{n}", b"graph")
            say(event="write", n=n, ok=True, epoch=receipt.epoch, offset=receipt.offset)
        except LeaseExpired as e:
            say(event="write", n=n, ok=False, error="LeaseExpired", detail=str(e))
        except RegistryError as e:
            say(event="write", n=n, ok=False, error=type(e).__name__, detail=str(e))
        time.sleep(0.2)
    election.cancel()
    reg.close()
    say(event="done")


if __name__ == "__main__":
    main()
