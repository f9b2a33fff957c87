"""Interleavings inside one client process (issue 42, finding 2), driven by the write path's
stall points (:mod:`registry.stalls`): a thread is held at a named point while another
writes, then let go. Nothing here waits on a timing margin: a held thread stays held until
the test opens its gate."""

from __future__ import annotations

import threading
import time

from registry import stalls
from registry.codec import default_codec
from registry.events import JobLockReleased, new_event_id, now_ms
from registry.keys import lock_key
from registry.log import write_raw


def _zombie_release(reg, job_id: str, epoch: int, writer: str) -> None:
    """A late write of an old term onto the job's lock key: refused, the key unsettled."""
    event = JobLockReleased(event_id=new_event_id(), namespace=reg.namespace, epoch=epoch,
                            writer=writer, created_at=now_ms(), job_id=job_id)
    write_raw(reg.bootstrap, reg.topic, reg.partition, lock_key(reg.namespace, job_id),
              default_codec().encode(event))


def _until(what, deadline_s: float = 60.0) -> None:
    # A bound for a failure to be reported, not a margin the test's outcome rests on.
    end = time.monotonic() + deadline_s
    while not what():
        if time.monotonic() > end:
            raise AssertionError("the other thread neither returned nor queued")
        time.sleep(0.005)


def test_a_reassertion_planned_before_a_checkpoint_completes_never_undoes_it(connect):
    """Finding 2: a reassertion was planned from the image under the log's lock and sent
    outside the group queue; a checkpoint completion acknowledged in between was then
    superseded by the reassertion's older copy of the job, and a fresh client read no
    completed checkpoint. Every record of a term now goes through the one queue, planned
    when its group is assembled, so the completion lands after the reassertion."""
    reg = connect()
    reg.claim_leadership("jm-0")
    term = reg.claim_leadership("jm-1")
    term.submit("a", b"graph")
    term.checkpoint_triggered("a", 1)
    _zombie_release(reg, "a", 1, "jm-0")
    reg.sync()
    assert lock_key(reg.namespace, "a") in reg.image.unsettled

    gate = stalls.Gate("write.planned")
    done = threading.Event()
    errors: list[BaseException] = []

    def complete() -> None:
        try:
            term.checkpoint_completed("a", 1, "loc-1")
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)
        finally:
            done.set()

    with stalls.installed(gate):
        settler = threading.Thread(target=term.reassert)
        settler.start()
        gate.wait_reached()  # the reassertion is planned, not sent
        writer = threading.Thread(target=complete)
        writer.start()
        # Either the completion waits behind the held group (the fix), or it was written
        # and acknowledged while the reassertion waited to be sent (the defect).
        _until(lambda: done.is_set() or len(term._groups._queue) > 0)
        gate.open()
        settler.join()
        writer.join()
    assert not errors, errors

    fresh = connect()
    job = fresh.job("a")
    assert job.checkpoints.last_completed == 1, job.checkpoints
    assert [c.location for c in job.latest_checkpoints] == ["loc-1"]
    assert lock_key(reg.namespace, "a") not in fresh.image.unsettled
