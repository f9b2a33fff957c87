"""Concurrent writer threads in the campaign's worker and in the soak (issue 27, part 4).

* The worker's history takes lines from many threads: each line is whole, ``index`` and
  ``op`` are unique in the process across threads, and each line names its thread.
* The worker's rendezvous pairs two threads' calls: a taken offer runs on the taker.
* The soak's workload never has two calls on one job in flight at once, whatever the
  threads' interleaving (a checkpoint record carries the state computed from the writer's
  view, so the second of two would be refused), and a checkpoint completed or failed is
  always the one in flight for its job.

No test here depends on timing: every wait is bounded by an event or a join.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading

import pytest

from registry.dev.bench_soak import _Workload
from registry.dev.torture.worker import History, _Rendezvous

THREADS = 8


def test_history_lines_of_many_threads_are_whole_with_unique_index_and_op(tmp_path) -> None:
    path = tmp_path / "history" / "w1.jsonl"
    hist = History(path, "w1", 0)
    start = threading.Barrier(THREADS)

    def write(k: int) -> None:
        start.wait()
        for _ in range(200):
            op = hist.next_op()
            hist.write(type="invoke", f="submit", op=op, args={"pad": "x" * (k * 50)})
            hist.write(type="ok", f="submit", op=op)

    threads = [threading.Thread(target=write, args=(k,), name=f"writer-{k + 1}")
               for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == THREADS * 200 * 2
    assert sorted(x["index"] for x in lines) == list(range(1, len(lines) + 1))
    invokes = [x for x in lines if x["type"] == "invoke"]
    assert len({x["op"] for x in invokes}) == len(invokes)
    assert {x["thread"] for x in lines} == {f"writer-{k + 1}" for k in range(THREADS)}
    by_op = {x["op"]: x["thread"] for x in invokes}
    assert all(by_op[x["op"]] == x["thread"] for x in lines if x["type"] == "ok")


def test_a_rendezvous_offer_runs_on_the_thread_that_takes_it() -> None:
    rv = _Rendezvous()
    ran_on: list[str] = []
    answer: list[bool] = []
    offered = threading.Thread(
        target=lambda: answer.append(rv.offer(lambda: ran_on.append(
            threading.current_thread().name), wait=60)), name="offerer")
    offered.start()
    stop = threading.Event()
    taken = None
    while taken is None:
        taken = rv.take()
        if taken is None:
            rv.pause(0.05, stop)  # woken by the offer
    taken()
    offered.join()
    assert answer == [True]
    assert ran_on == [threading.current_thread().name]
    assert rv.take() is None  # one offer, taken once


def test_a_rendezvous_offer_nobody_takes_is_withdrawn() -> None:
    rv = _Rendezvous()
    assert rv.offer(lambda: None, wait=0) is False
    assert rv.take() is None


class _CheckingTerm:
    """A Term stand-in that fails the test if two calls on one job overlap, or a checkpoint
    ends that is not the job's one in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.pending: dict[str, int] = {}
        self.dead: set[str] = set()
        self.errors: list[str] = []
        self.rng = random.Random(5)
        self.calls = 0

    def _on(self, job: str, what: str, *, ends: bool = False) -> None:
        with self.lock:
            self.calls += 1
            if job in self.busy:
                self.errors.append(f"{what} of {job} while another call on it was in flight")
            if job in self.dead and what != "mark_clean":
                self.errors.append(f"{what} of {job} after its cancel")
            self.busy.add(job)
            if ends:
                self.dead.add(job)  # done or in doubt, it may be terminal now
            fail = self.rng.random() < 0.1  # some calls fail: the model must stay right
        threading.Event().wait(0)  # let another thread run here
        with self.lock:
            self.busy.discard(job)
        if fail:
            raise RuntimeError("planted failure")

    def submit_many(self, jobs: list[tuple[str, bytes]], **_: object) -> None:
        pass

    def submit(self, job: str, graph: bytes, **_: object) -> None:
        self._on(job, "submit")

    def cancel(self, job: str, reason: str = "") -> None:
        self._on(job, "cancel", ends=True)

    def mark_clean(self, job: str) -> None:
        self._on(job, "mark_clean")

    def adopt(self, job: str) -> None:
        self._on(job, "adopt")

    def checkpoint_triggered(self, job: str, cp: int) -> None:
        self._on(job, "trigger")
        with self.lock:
            if self.pending.get(job) is not None:
                self.errors.append(f"trigger of {job} with {self.pending[job]} in flight")
            self.pending[job] = cp

    def _end(self, job: str, cp: int) -> None:
        with self.lock:
            if self.pending.get(job) != cp:
                self.errors.append(f"end of checkpoint {cp} of {job}, in flight "
                                   f"{self.pending.get(job)}")
            self.pending.pop(job, None)  # done or in doubt: the model forgets it
        self._on(job, "end")

    def checkpoint_completed(self, job: str, cp: int, location: str) -> None:
        self._end(job, cp)

    def checkpoint_failed(self, job: str, cp: int, reason: str, task: str = "") -> None:
        self._end(job, cp)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_soak_workload_never_has_two_calls_on_one_job_in_flight(seed) -> None:
    term = _CheckingTerm()
    work = _Workload(term, 20, random.Random(seed))  # type: ignore[arg-type]
    work.fill()
    per_thread = 400

    def writer() -> None:
        for _ in range(per_thread):
            with work.lock:
                call = work.run(work.pick())
            with contextlib.suppress(RuntimeError):
                call()

    threads = [threading.Thread(target=writer) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert term.errors == [], term.errors[:5]
    assert term.calls == THREADS * per_thread


def test_the_checking_term_catches_overlapping_calls() -> None:
    """The stand-in above does catch what it looks for (a test of the test)."""
    term = _CheckingTerm()
    term.busy.add("j")
    term.rng = random.Random(0)
    with contextlib.suppress(RuntimeError):
        term.adopt("j")
    assert term.errors and "while another call on it was in flight" in term.errors[0]
