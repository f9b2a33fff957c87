"""When a waiting contender reads the log next (registry.election.next_look): pure logic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from registry.election import next_look


def test_a_quarter_lease_while_the_term_is_young() -> None:
    assert next_look(2.0, 2000, 0.0) == 0.5


def test_when_the_lease_runs_out_sooner_it_looks_then() -> None:
    assert abs(next_look(2.0, 2000, 1.8) - 0.2) < 1e-9
    assert next_look(2.0, 2000, 2.5) == 0.0  # already out: look at once


def test_a_term_that_states_no_lease_is_looked_at_every_quarter_lease() -> None:
    assert next_look(4.0, None, 100.0) == 1.0


@given(lease=st.floats(0.01, 600), lease_ms=st.one_of(st.none(), st.integers(1, 600_000)),
       silent=st.floats(0, 1200))
def test_never_longer_than_a_quarter_lease_nor_past_the_terms_lease(lease, lease_ms,
                                                                     silent) -> None:
    wait = next_look(lease, lease_ms, silent)
    assert 0.0 <= wait <= lease / 4
    if lease_ms is not None:  # it looks no later than when the term's lease runs out
        assert silent + wait <= max(silent, lease_ms / 1000) + 1e-9
