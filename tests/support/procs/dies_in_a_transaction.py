"""Another producer on the registry's partition (a tool's, or a leader of a version that wrote
in transactions) that is SIGKILLed with its transaction open.

usage: dies_in_a_transaction.py BOOTSTRAP TOPIC PARTITION KEY TRANSACTION_TIMEOUT_MS

It opens a transaction of a ``transactional.id`` of its own with the given
``transaction.timeout.ms``, appends one record (key KEY, a value no reader can decode) and
flushes it (appended, its offset reported), then prints one JSON line, ``{"event": "open",
"offset": N, "left": 0}``, and waits, its transaction open at the broker, to be killed with
SIGKILL by the test (at the end of its stdin it kills itself: it never commits).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid

from confluent_kafka import Producer


def main() -> None:
    bootstrap, topic, partition, key, txn_timeout_ms = sys.argv[1:6]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "transactional.id": f"foreign-{uuid.uuid4()}",
                         "transaction.timeout.ms": int(txn_timeout_ms)})
    producer.init_transactions(30)
    producer.begin_transaction()
    offsets: list[int] = []
    producer.produce(topic, key=key.encode(), value=b"\x00not-an-event",
                     partition=int(partition),
                     on_delivery=lambda err, msg: offsets.append(msg.offset()) if err is None
                     else None)
    left = producer.flush(30)
    print(json.dumps({"event": "open", "offset": offsets[0] if offsets else None,
                      "left": left}), flush=True)
    sys.stdin.read()  # the test kills us here
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
