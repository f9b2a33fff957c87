"""Namespaces chosen for where they land."""

from __future__ import annotations

from registry.keys import partition_for


def sharing_a_partition(count: int, partitions: int = 8) -> list[str]:
    """``count`` namespaces that hash to one partition of a topic of ``partitions``."""
    by_partition: dict[int, list[str]] = {}
    for i in range(1000):
        names = by_partition.setdefault(partition_for(f"ns-{i}", partitions), [])
        names.append(f"ns-{i}")
        if len(names) == count:
            return names
    raise AssertionError("no partition got enough namespaces")
