"""Who the Kafka nemesis strikes: the transaction coordinator of a transactional id is the
leader of ``__transaction_state`` partition ``abs(javaHash(id)) % partitions``
(:mod:`registry.dev.torture.cluster`); the Kafka check of the derivation is in
``tests/integration/test_torture.py``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from registry.dev.torture.cluster import coordinator_partition, java_string_hash


def test_java_string_hash_matches_javas() -> None:
    # Values of String.hashCode() in Java.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert java_string_hash("\U0001F600") == 1772899  # a surrogate pair: two code units


def test_integer_min_value_maps_to_partition_zero() -> None:
    # Kafka's Utils.abs(Integer.MIN_VALUE) is 0, not MIN_VALUE (whose abs overflows).
    assert coordinator_partition("polygenelubricants", 50) == 0


def test_partitions_kafka_chose_for_these_ids() -> None:
    """Where Apache Kafka 4.4.0 (4 partitions of __transaction_state) wrote the state of
    these transactional ids, read back from the topic once."""
    seen = {"ns-a": 3, "ns-b": 0, "ns-c": 1, "ns-d": 2, "ns-e": 3, "ns-f": 0}
    for ns, partition in seen.items():
        assert coordinator_partition(f"jobreg.t1.{ns}", 4) == partition


@given(st.text(), st.integers(1, 64))
def test_the_partition_is_in_range(text: str, partitions: int) -> None:
    h = java_string_hash(text)
    assert -(1 << 31) <= h < (1 << 31)
    assert 0 <= coordinator_partition(text, partitions) < partitions
