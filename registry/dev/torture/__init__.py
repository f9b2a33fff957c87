"""The project's own fault campaign (``jobreg torture``): coordinator processes under a
nemesis, their histories, and an independent checker.

* :mod:`~registry.dev.torture.worker`: one coordinator process (random operations, history);
* :mod:`~registry.dev.torture.nemesis`: the faults (pauses, kills, a paused broker, network
  cuts, zombie writes, garbage, duplicates);
* :mod:`~registry.dev.torture.runner`: a run, then a campaign of runs, and its summary;
* :mod:`~registry.dev.torture.model` and :mod:`~registry.dev.torture.checker`: the judge, which
  reads a run's folder and never imports the fold;
* :mod:`~registry.dev.torture.selftest`: plants each kind of violation and shows the checker
  names it;
* :mod:`~registry.dev.torture.proxy`: the fault-injecting TCP proxy.

Development tooling beside the runtime, like the embedded broker and the benchmarks.
"""
