"""A coordinator process for the election tests: leads via elect(), writes, reports JSON lines.

usage: elect_worker.py BOOTSTRAP TOPIC NAMESPACE CONTENDER LEASE_S SECONDS
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time

from registry import LeaseExpired, Registry, RegistryError


def say(**fields) -> None:
    print(json.dumps({"t": time.monotonic(), **fields}), flush=True)


def main() -> None:
    # SIGUSR1: every thread's stack on stderr (a test that waits in vain asks for them).
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    bootstrap, topic, namespace, contender, lease, seconds = sys.argv[1:7]
    lease_s, until = float(lease), time.monotonic() + float(seconds)
    reg = Registry.connect(bootstrap, namespace, topic=topic, timeout=lease_s / 2)
    say(event="contending", contender=contender)
    election = reg.elect(contender, lease=lease_s,
                         on_revoked=lambda term: say(event="revoked", epoch=term.epoch))
    term = election.acquire(timeout=120)
    say(event="leader", epoch=term.epoch)
    n = 0
    while time.monotonic() < until:
        n += 1
        try:
            receipt = term.submit(f"{contender}-{n}", b"graph")
            say(event="write", ok=True, epoch=receipt.epoch, offset=receipt.offset)
        except LeaseExpired as e:
            say(event="write", ok=False, error="LeaseExpired", detail=str(e))
        except RegistryError as e:
            say(event="write", ok=False, error=type(e).__name__, detail=str(e))
        time.sleep(0.2)
    election.cancel()
    reg.close()
    say(event="done")


if __name__ == "__main__":
    main()
