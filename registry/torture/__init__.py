"""The project's own fault campaign (``jobreg torture``): coordinator processes under a
nemesis, their histories, and an independent checker.

* :mod:`~registry.torture.worker`: one coordinator process (random operations, history);
* :mod:`~registry.torture.nemesis`: the faults (pauses, kills, a paused broker, network
  cuts, zombie writes, garbage, duplicates);
* :mod:`~registry.torture.runner`: a run, then a campaign of runs, and its summary;
* :mod:`~registry.torture.model` and :mod:`~registry.torture.checker`: the judge, which
  reads a run's folder and never imports the fold;
* :mod:`~registry.torture.selftest`: plants each kind of violation and shows the checker
  names it;
* :mod:`~registry.torture.proxy`: the fault-injecting TCP proxy.

Development tooling beside the runtime, like the embedded broker and the benchmarks.
"""
