"""The leader's transaction timeout against the patience of a held write (README "The log",
Writers; registry.log.TRANSACTION_TIMEOUT_MS). Measured on Kafka in
tests/integration/test_kafka_fencing.py; these are the bounds the value must keep."""

from __future__ import annotations

import inspect

from registry import Registry
from registry.fold import DUPLICATE_WINDOW_MS
from registry.log import TRANSACTION_TIMEOUT_MS

# Kafka's default transaction.abort.timed.out.transaction.cleanup.interval.ms: how often the
# transaction coordinator looks for transactions open longer than their timeout.
KAFKA_ABORT_CHECK_MS = 10_000


def test_a_dead_leaders_open_transaction_ends_before_a_held_write_gives_up() -> None:
    # A write held behind another namespace's open transaction gives up (OutcomeUnknown) half
    # a duplicate window after its first send (registry.writes); Kafka aborts a dead leader's
    # transaction at most its timeout plus one check interval after it began.
    assert TRANSACTION_TIMEOUT_MS + KAFKA_ABORT_CHECK_MS < DUPLICATE_WINDOW_MS / 2


def test_a_healthy_commit_outlives_no_transaction_timeout() -> None:
    # A transaction lasts one commit, which waits at most the client's timeout.
    default_timeout_s = inspect.signature(Registry.connect).parameters["timeout"].default
    assert default_timeout_s * 1000 < TRANSACTION_TIMEOUT_MS
