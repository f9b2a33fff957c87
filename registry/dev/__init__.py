"""Development tooling: nothing in the runtime imports it (the import contracts in
``pyproject.toml`` say so, and ``make test`` checks them); the CLI is its only user.

* :mod:`~registry.dev.broker`: the embedded Kafka-protocol broker (Tansu) on loopback;
* :mod:`~registry.dev.pgcluster`: a throwaway PostgreSQL cluster for tests and benchmarks;
* :mod:`~registry.dev.bench`, :mod:`~registry.dev.bench_soak`,
  :mod:`~registry.dev.bench_peers`, :mod:`~registry.dev.bench_audit`: the benchmarks
  (``jobreg bench ...``), which print figures;
* :mod:`~registry.dev.demo` and :mod:`~registry.dev.coordinator`: ``jobreg demo`` and the
  coordinator processes it runs;
* :mod:`~registry.dev.torture`: the fault campaign (``jobreg torture``);
* :mod:`~registry.dev.exhaustive`: the bounded checker of the fold's rules (``jobreg
  exhaustive``): every history up to a bound, every compaction cut, every batch split.
"""
