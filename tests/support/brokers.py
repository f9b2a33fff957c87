"""Which broker the test session runs on (``tests/conftest.py`` says how it is chosen)."""

from __future__ import annotations

import os

import pytest

#: ``$JOBREG_TEST_BROKER``: ``embedded`` (Tansu, the default) or ``kafka`` (Apache Kafka).
KINDS = ("embedded", "kafka")


def test_broker_kind() -> str:
    """``embedded``, ``kafka`` (started by the session) or ``external``
    (``$JOBREG_TEST_BOOTSTRAP``'s cluster, whatever it is)."""
    if os.environ.get("JOBREG_TEST_BOOTSTRAP", "").strip():
        return "external"
    kind = os.environ.get("JOBREG_TEST_BROKER", "").strip() or "embedded"
    if kind not in KINDS:
        raise pytest.UsageError(f"JOBREG_TEST_BROKER={kind!r}: expected one of "
                                f"{', '.join(KINDS)}")
    return kind


def on_embedded() -> bool:
    """True when the session's broker is the embedded one (Tansu)."""
    return test_broker_kind() == "embedded"
