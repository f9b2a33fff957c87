"""The stall points (registry.stalls): off by default, a gate holds a thread until opened,
a seeded random controller draws the same stalls for the same seed, a typo is refused."""

from __future__ import annotations

import threading

import pytest

from registry import stalls


def test_a_point_with_no_controller_does_nothing() -> None:
    stalls.point("write.planned", records=3)  # no controller: returns at once
    stalls.point("no.such.point")  # not even checked while off: no cost when off


def test_a_gate_holds_the_first_thread_until_opened_and_lets_later_ones_pass() -> None:
    order: list[str] = []
    gate = stalls.Gate("write.planned", when=lambda records: records > 1)
    with stalls.installed(gate):
        stalls.point("write.planned", records=1)  # not held: the predicate says no
        held = threading.Thread(target=lambda: (stalls.point("write.planned", records=2),
                                                order.append("held")))
        held.start()
        gate.wait_reached()
        order.append("reached")
        stalls.point("write.sent")  # another point: not held
        gate.open()
        held.join()
        stalls.point("write.planned", records=5)  # opened: passes
    assert order == ["reached", "held"]
    assert gate.details == [{"records": 2}]


def test_an_unknown_point_is_refused_once_a_controller_is_installed() -> None:
    with pytest.raises(KeyError, match="no stall point"):
        stalls.Gate("write.plannd")
    with stalls.installed(lambda name, **_: None), pytest.raises(KeyError):
        stalls.point("write.plannd")


def test_one_controller_at_a_time() -> None:
    with stalls.installed(lambda name, **_: None), pytest.raises(RuntimeError), \
            stalls.installed(lambda name, **_: None):
        pass


def test_random_stalls_are_drawn_from_the_seed() -> None:
    def draws(seed: str) -> dict[str, int]:
        r = stalls.Random(seed, p=0.5, max_s=0.0)
        for _ in range(200):
            r("write.planned")
            r("election.read")
        return r.stalls
    assert draws("s/1") == draws("s/1") != draws("s/2")
    assert set(draws("s/1")) == {"write.planned", "election.read"}
