"""Random histories over the model (:mod:`.model`): contenders, zombies, duplicates and
broker time, as hypothesis strategies, and the settings the property tests share."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from .model import CONTENDERS, JOBS, Sim

DAY = 24 * 3600 * 1000

contender = st.sampled_from(CONTENDERS)
job = st.sampled_from(JOBS)
sync = st.tuples(st.just("sync"), contender)
# an election's claim (a compare-and-set on the renewals it saw too), or an external one
claim = st.tuples(st.sampled_from(["claim"] * 3 + ["xclaim"]), contender)
# "leader" is resolved to whoever claimed last, so most writes come from a live term
write = st.tuples(st.just("write"), st.sampled_from(["leader"] * 3 + list(CONTENDERS)),
                  st.sampled_from(["submit", "submit", "submit", "cancel", "finish", "fail",
                                   "adopt", "release", "release", "revoke", "recfail", "renew",
                                   "trigger", "trigger", "complete", "cpfail", "cpfail",
                                   "discard", "submit_many", "submit_many", "adopt_many",
                                   "cpskip", "trigfail", "restart", "rescale", "clean",
                                   "clean",
                                   "publish", "publish", "unpublish"]),
                  job, st.sampled_from([False] * 7 + [True]),  # True: the transaction aborted
                  st.integers(1, 6))  # checkpoint id (small, so they collide)
raw = st.tuples(st.just("raw"),
                st.sampled_from(["submit", "cancel", "release", "adopt", "revoke", "garbage",
                                 "tombstone", "call", "torn", "clean", "publish"]),
                st.integers(0, 4), contender, job, st.integers(0, 2))
dup = st.tuples(st.just("dup"), st.integers(0, 50))
tick = st.tuples(st.just("tick"), st.integers(0, 3_600_000))
# Weighted so that most histories have several terms, live and terminal jobs,
# zombies of old terms and refused writes on live keys.
op = st.sampled_from([write] * 6 + [claim] * 2 + [sync] * 2 + [raw, raw, dup, tick]).flatmap(
    lambda s: s)


def build(ops, reassert: bool = True, settle: bool = True, sim: Sim | None = None,
          layout: int | None = None) -> Sim:
    """Interpret ``ops`` on ``sim``: by default a fresh :class:`Sim` (``reassert`` and
    ``layout``, the clients' record layout, this jobreg's by default, are for that one), or
    one given, such as :class:`.kafka_cleaner.BrokerSim`, which also records how each write
    reaches the broker."""
    if sim is None:
        sim = Sim(reassert=reassert, layout=layout)
    for o in ops:
        kind = o[0]
        if kind == "sync":
            sim.sync(o[1])
        elif kind in ("claim", "xclaim"):
            sim.claim(o[1], external=kind == "xclaim")
        elif kind == "write":
            who = o[1]
            if who == "leader":
                holders = [a for a in sim.actors.values() if a.term is not None]
                who = max(holders, key=lambda a: a.term).name if holders else CONTENDERS[0]
            sim.write(who, o[2], o[3], aborted=o[4], cp=o[5] if len(o) > 5 else 1)
        elif kind == "raw":
            sim.raw(*o[1:])
        elif kind == "dup":
            sim.duplicate(o[1])
        elif kind == "tick":
            sim.tick(o[1])
    if settle:
        sim.settle()
    return sim


history_ops = st.lists(op, min_size=5, max_size=80)
histories = history_ops.map(build)
# Long enough to cross the image's bounds (test_fold_properties): hours of ticks cross many
# duplicate windows.
long_history_ops = st.lists(op, min_size=250, max_size=400)
# JOBREG_PROPERTY_EXAMPLES=5000 for a deeper hunt than CI's default.
SETTINGS = settings(max_examples=int(os.environ.get("JOBREG_PROPERTY_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
