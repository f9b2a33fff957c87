"""Fetch, once, every jar the test suite takes from Maven Central into the cache
(``~/.cache/jobreg`` or ``$JOBREG_KAFKA_CACHE``): Apache Kafka's and its tools, Spark's Kafka
connector for the installed pyspark, Flink's classpath.

``make test`` runs this before its two pytest passes, which run side by side: each fetch
holds only a lock of its own process, so two passes must not be the first to fetch at once.
``python -m tests.support.fetch``; one line per thing, exit 1 with Maven's line if a fetch
fails (for Spark's connector only where the Spark tests require it: on CI).
"""

from __future__ import annotations

import sys
import time


def main() -> int:
    from registry.dev.flink import flink_classpath
    from registry.dev.kafka import kafka_tools_classpath
    from registry.errors import RegistryError
    from tests.support.sparkfixture import MISSING, _required, connector

    for what, fetch in (("Apache Kafka and its tools", kafka_tools_classpath),
                        ("Flink's classpath", flink_classpath)):
        started = time.monotonic()
        try:
            jars = fetch()
        except RegistryError as e:
            print(f"fetch: {what}: {e}", file=sys.stderr)
            return 1
        print(f"fetch: {what}: {len(jars)} jars ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    jars = connector()
    if not jars:  # the Spark tests say it again: they fail on CI, elsewhere they skip
        print(f"fetch: Spark's Kafka connector: none ({MISSING.get('why')})", file=sys.stderr)
        return 1 if _required() else 0
    print(f"fetch: Spark's Kafka connector: {len(jars)} jars "
          f"({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
