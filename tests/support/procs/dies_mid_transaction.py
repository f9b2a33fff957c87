"""A coordinator process that leads a namespace and is SIGKILLed in the middle of a write.

usage: dies_mid_transaction.py BOOTSTRAP TOPIC NAMESPACE CONTENDER TRANSACTION_TIMEOUT_MS

It connects with the real client, claims the namespace (its producer's
``transaction.timeout.ms`` is the given one: ``registry.log.TRANSACTION_TIMEOUT_MS``, injected
before the claim makes the producer), submits ``committed``, then submits ``in-flight``: the
client's own transaction produces the record and flushes it (it is appended, its offset
reported); instead of ``commit_transaction`` the process prints one JSON line, ``{"event":
"open", "offsets": [...], "partition": P, "epoch": E}``, and waits, its transaction open at the
broker, to be killed with SIGKILL by the test (at the end of its stdin it kills itself: it
never commits).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from registry import Registry, log


class _DiesBeforeCommit:
    """The term's producer, except that its commit is a SIGKILL once the records are in."""

    def __init__(self, real: Any, partition: int, epoch: int) -> None:
        self._real, self._partition, self._epoch = real, partition, epoch
        self._offsets: list[int] = []

    def produce(self, *args: Any, on_delivery: Any = None, **kwargs: Any) -> None:
        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                self._offsets.append(msg.offset())
            if on_delivery is not None:
                on_delivery(err, msg)

        self._real.produce(*args, on_delivery=delivered, **kwargs)

    def commit_transaction(self, *args: Any) -> None:
        left = self._real.flush(30)
        print(json.dumps({"event": "open", "offsets": self._offsets, "left": left,
                          "partition": self._partition, "epoch": self._epoch}), flush=True)
        sys.stdin.read()  # the test kills us here
        os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def main() -> None:
    bootstrap, topic, namespace, contender, txn_timeout_ms = sys.argv[1:6]
    log.TRANSACTION_TIMEOUT_MS = int(txn_timeout_ms)
    reg = Registry.connect(bootstrap, namespace, topic=topic)
    term = reg.claim_leadership(contender)
    term.submit("committed", b"graph")
    writer = term._writes.writer
    assert writer is not None
    writer._producer = _DiesBeforeCommit(writer._producer, reg.partition, term.epoch)
    term.submit("in-flight", b"graph")
    print(json.dumps({"event": "not killed"}), flush=True)  # never reached


if __name__ == "__main__":
    main()
