"""Shared fixtures: one embedded broker per test session, a fresh topic per test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from registry import EmbeddedBroker, Registry


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """Tansu on a free 127.0.0.1 port, stopped (by its pid) when the session ends."""
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"jobreg-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def connect(broker: EmbeddedBroker, topic: str) -> Iterator[Callable[..., Registry]]:
    """Factory: ``connect(namespace="prod")`` -> a Registry on this test's topic, closed afterwards."""
    made: list[Registry] = []

    def make(namespace: str = "prod", **kwargs) -> Registry:
        reg = Registry.connect(broker.bootstrap, namespace, topic=topic, **kwargs)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()
