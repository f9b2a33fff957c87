"""``jobreg flink-bridge``: the bridge as a real subprocess, driven over its pipes as Flink's
Java backend drives it (protocol v1), against the session's broker.

Nothing here waits on a timing margin: every wait is for an event or an answer, with a
deadline (``support.bridge_client.DEADLINE``) that only guards against a hung bridge.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from support.bridge_client import DEADLINE, ROOT, BridgeProcess

from registry.flink_bridge import checkpoint_name, session_of

pytestmark = pytest.mark.integration

LEASE = 2.0
JOB = "a" * 32  # a Flink JobID in hex
OTHER = "b" * 32


@pytest.fixture
def bridges(broker, topic):
    """Factory: ``bridges(namespace, contender)`` -> a running :class:`BridgeProcess`,
    ended (EOF, then by pid) after the test."""
    made: list[BridgeProcess] = []

    def make(namespace: str, contender: str, **kw) -> BridgeProcess:
        kw.setdefault("lease", LEASE)
        b = BridgeProcess(broker.bootstrap, topic, namespace, contender, **kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.stop(check=False)
    for b in made:  # every line any of them wrote was one JSON object
        b.check_lines()


def _lead(b: BridgeProcess) -> dict:
    assert b.ok("contend") == {}
    return b.event("granted")


def test_contend_publish_and_store_round_trip(bridges, connect) -> None:
    b = bridges("rt", "jm-1")
    granted = _lead(b)
    assert granted["epoch"] == 1 and 0 < granted["valid_for_ms"] <= LEASE * 1000
    assert granted["session"] == session_of("rt", 1) == str(
        uuid.uuid5(uuid.NAMESPACE_URL, "jobreg:rt:1"))
    assert b.event("lease")["epoch"] == 1  # renewed while the JVM beats
    session = granted["session"]

    b.ok("watch", component="dispatcher")
    assert b.event("leader") == {"event": "leader", "component": "dispatcher",
                                 "session": None, "address": None}
    assert b.ok("publish", component="dispatcher", session=session,
                address="pekko://flink@h:1/user/dispatcher") == {}
    seen = b.event("leader")
    assert (seen["session"], seen["address"]) == (session, "pekko://flink@h:1/user/dispatcher")
    assert b.ok("leaders") == {"dispatcher": {"session": session,
                                              "address": "pekko://flink@h:1/user/dispatcher"}}
    assert b.error("publish", component="dispatcher", session=str(uuid.uuid4()),
                   address="x") == "Fenced"

    # plans: a job whose graph is the pointer
    assert b.ok("store_add", store="plans", name=JOB, pointer="file:///ha/plan-a") == \
        {"version": 0}
    assert b.error("store_add", store="plans", name=JOB, pointer="file:///ha/x") == \
        "AlreadyExists"
    assert b.ok("store_get", store="plans", name=JOB) == {"pointer": "file:///ha/plan-a",
                                                          "version": 0}
    assert b.ok("store_exists", store="plans", name=JOB) == {"version": 0}
    assert b.ok("store_exists", store="plans", name=OTHER) == {"version": -1}
    assert b.error("store_get", store="plans", name=OTHER) == "NotExist"
    assert b.ok("store_names", store="plans") == [JOB]
    assert b.error("store_replace", store="plans", name=JOB, version=0, pointer="p") == \
        "Invalid"
    reg = connect("rt")
    assert reg.job(JOB).graph.data == b"file:///ha/plan-a"

    # checkpoints: the counter is the trigger, the add the completion
    cps = f"checkpoints/{JOB}"
    assert b.ok("counter_get", job=JOB) == {"value": 1}
    assert b.ok("counter_next", job=JOB) == {"value": 1}
    assert b.ok("counter_next", job=JOB) == {"value": 2}
    assert b.ok("counter_get", job=JOB) == {"value": 3}
    assert b.ok("store_add", store=cps, name=checkpoint_name(1), pointer="file:///cp/1") == \
        {"version": 0}
    assert b.error("store_add", store=cps, name=checkpoint_name(1), pointer="x") == \
        "AlreadyExists"
    assert b.ok("store_all", store=cps) == [{"name": "/0000000000000000001",
                                             "pointer": "file:///cp/1", "version": 0}]
    # Completed without a counter_next (the fold needs no trigger): the newest is retained,
    # the one it subsumes goes (Flink then removes it: removed).
    assert b.ok("store_add", store=cps, name=checkpoint_name(5), pointer="file:///cp/5") == \
        {"version": 0}
    assert b.ok("store_names", store=cps) == [checkpoint_name(5)]
    assert b.ok("store_remove", store=cps, name=checkpoint_name(1)) == {"removed": True}
    assert b.ok("store_remove", store=cps, name=checkpoint_name(5)) == {"removed": False}
    assert b.error("store_add", store=cps, name=checkpoint_name(3), pointer="x") == "Invalid"
    assert b.ok("counter_get", job=JOB) == {"value": 6}
    assert b.ok("counter_set", job=JOB, value=10) == {}
    assert b.ok("counter_next", job=JOB) == {"value": 10}
    assert b.ok("counter_set", job=JOB, value=3) == {}  # ids only increase: nothing written
    assert b.ok("counter_get", job=JOB) == {"value": 11}
    assert b.error("counter_set", job=JOB, value=0) == "Invalid"
    assert b.error("counter_next", job=OTHER) == "NotExist"
    assert b.error("store_replace", store=cps, name=checkpoint_name(5), version=0,
                   pointer="x") == "Invalid"
    assert b.error("store_replace", store=cps, name=checkpoint_name(6), version=0,
                   pointer="x") == "NotExist"
    assert b.error("store_clear", store=cps) == "Invalid"  # the newest stays with a live job
    assert b.error("store_get", store=cps, name="not-a-checkpoint") == "Invalid"
    view = reg.job(JOB)
    assert [(c.checkpoint_id, c.location) for c in view.latest_checkpoints] == \
        [(5, "file:///cp/5")]

    # applications: jobs of their own, listed by their store only
    assert b.ok("store_add", store="applications", name="c" * 32, pointer="file:///app") == \
        {"version": 0}
    assert b.ok("store_names", store="applications") == ["c" * 32]
    assert b.ok("store_names", store="plans") == [JOB]
    assert b.ok("store_remove", store="applications", name="c" * 32) == {"removed": True}
    assert b.ok("store_names", store="applications") == []

    # the job ends: terminal, then its plan is not recovered and its result is dirty
    assert b.ok("job_terminal", job=JOB, status="CANCELED") == {}
    assert b.ok("job_terminal", job=JOB, status="CANCELED") == {}  # idempotent
    assert b.ok("store_names", store="plans") == []
    assert b.error("result_create", job=JOB, status="CANCELED") == "AlreadyExists"
    assert b.ok("results_dirty") == [{"job": JOB, "status": "CANCELED"}]
    # the dirty result still lists the checkpoints, for Flink's cleanup to delete them
    assert b.ok("store_names", store=cps) == [checkpoint_name(5)]
    assert b.ok("store_remove", store=cps, name=checkpoint_name(5)) == {"removed": True}
    assert b.ok("store_remove", store="plans", name=JOB) == {"removed": True}
    assert b.ok("result_clean", job=JOB) == {}
    assert b.ok("result_has", job=JOB) == {"dirty": False, "clean": True}
    assert b.ok("results_dirty") == []
    assert b.ok("store_names", store=cps) == []
    assert b.ok("store_clear", store=cps) == {}
    assert b.ok("unwatch", component="dispatcher") == {}
    assert reg.job(JOB).status == "CANCELLED" and not reg.job(JOB).dirty


def test_pipelined_answers_and_events_arrive_whole_and_none_is_lost(bridges) -> None:
    """Issue 42, finding 8: the bridge's stdout has writers on several threads (the request
    pool, the renewer's ``lease``, the poller's ``leader``). Answers of ~160 KB (past the
    pipe's 64 KiB: each write waits for the reader) are pipelined with publishes whose
    ``leader`` events the poller writes meanwhile, with renewals going on: every answer comes
    once, and every line the bridge wrote is one JSON object (the fixture checks)."""
    b = bridges("lines", "jm-1")
    session = _lead(b)["session"]
    jobs = [f"{i:032x}" for i in range(8)]
    for job in jobs:
        b.ok("store_add", store="plans", name=job, pointer="file:///ha/" + "p" * 20_000 + job)
    b.ok("watch", component="dispatcher")
    sent = []
    for i in range(40):
        sent.append(("store_all", b.send("store_all", store="plans")))
        sent.append(("publish", b.send("publish", component="dispatcher", session=session,
                                       address=f"a-{i}")))
    for op, ident in sent:
        answer = b.answer(ident)
        assert answer["ok"], (op, answer)
        if op == "store_all":
            assert sorted(e["name"] for e in answer["result"]) == jobs
    while b.event("leader")["address"] != "a-39":  # the poller saw the last publish
        pass
    b.check_lines()


def test_job_results_map_to_fold_rule_5(bridges) -> None:
    """Flink's JobResultStoreContractTest through the bridge."""
    b = bridges("results", "jm-1")
    _lead(b)
    assert b.ok("result_has", job=JOB) == {"dirty": False, "clean": False}
    assert b.error("result_clean", job=JOB) == "NotExist"
    # a job the registry never saw (Flink's tests use random ids): recorded and ended
    assert b.ok("result_create", job=JOB, status="FINISHED") == {}
    assert b.error("result_create", job=JOB, status="FAILED") == "AlreadyExists"
    assert b.ok("result_has", job=JOB) == {"dirty": True, "clean": False}
    assert b.ok("results_dirty") == [{"job": JOB, "status": "FINISHED"}]
    assert b.ok("result_clean", job=JOB) == {}
    assert b.ok("result_clean", job=JOB) == {}  # cleaning a clean one: no error
    assert b.error("result_create", job=JOB, status="FINISHED") == "AlreadyExists"
    assert b.ok("result_has", job=JOB) == {"dirty": False, "clean": True}
    # a live job (its plan stored): no result until it ends
    b.ok("store_add", store="plans", name=OTHER, pointer="p")
    assert b.error("result_clean", job=OTHER) == "NotExist"
    assert b.ok("result_create", job=OTHER, status="FAILED") == {}
    assert b.ok("results_dirty") == [{"job": OTHER, "status": "FAILED"}]
    assert b.error("result_create", job=OTHER, status="RUNNING") == "Invalid"


def test_a_plan_that_cannot_be_recovered_fails_its_job_alone(bridges, connect) -> None:
    """Seed 003 through the bridge: ``plan_failed`` makes the job RECOVERY_FAILED with its
    error (jobreg's ``JobRecoveryFailed``), the next leader no longer lists it, the other
    job is untouched; only the leader may say so."""
    standby = bridges("pf", "jm-2")
    b = bridges("pf", "jm-1")
    _lead(b)
    assert b.ok("store_add", store="plans", name=JOB, pointer="file:/ha/submittedPlan-a") \
        == {"version": 0}
    assert b.ok("store_add", store="plans", name=OTHER, pointer="file:/ha/submittedPlan-b") \
        == {"version": 0}
    assert standby.error("plan_failed", job=JOB, error="x") == "NotLeader"
    error = ("org.apache.flink.util.FlinkException: Could not retrieve the submitted execution "
             "plan\n (caused by java.io.StreamCorruptedException: invalid stream header)")
    assert b.ok("plan_failed", job=JOB, error=error) == {}

    reg = connect("pf")
    view = reg.job(JOB)
    assert view.status == "RECOVERY_FAILED" and view.live and view.owner_epoch is None
    assert view.error == " ".join(error.split())  # one line
    assert [d.event_type for d in reg.timeline(JOB)][-1] == "JobRecoveryFailed"
    assert reg.job(OTHER).status == "ACTIVE"
    # Not listed for recovery (by this leader or the next), still readable and removable.
    assert b.ok("store_names", store="plans") == [OTHER]
    assert standby.ok("store_names", store="plans") == [OTHER]
    assert [e["name"] for e in b.ok("store_all", store="plans")] == [OTHER]
    assert b.ok("store_get", store="plans", name=JOB)["pointer"] == "file:/ha/submittedPlan-a"
    assert b.ok("result_has", job=JOB) == {"dirty": False, "clean": False}
    # Once more: the newer error is kept.
    assert b.ok("plan_failed", job=JOB, error="ClassNotFoundException: Gone") == {}
    assert reg.job(JOB).error == "ClassNotFoundException: Gone"
    # The fold's refusals: an unknown job, an ended one, a bad request.
    assert b.error("plan_failed", job="c" * 32, error="x") == "NotExist"
    assert b.ok("job_terminal", job=OTHER, status="FINISHED") == {}
    assert b.error("plan_failed", job=OTHER, error="x") == "AlreadyExists"
    assert b.error("plan_failed", job=JOB) == "Invalid"
    # A cancel moves it on (Flink's removal of the plan), as for jobreg's own recovery.
    assert b.ok("store_remove", store="plans", name=JOB) == {"removed": True}
    assert reg.job(JOB).status == "CANCELLED"


def test_a_rescale_is_a_fenced_record_the_next_leader_reads(bridges, connect) -> None:
    """Issue 43 item 1 through the bridge: ``plan_rescale`` (Flink's
    ``putJobResourceRequirements``) writes a ``JobRescaled``; the plan's pointer stays as
    submitted, checkpoints after it keep the requirements, and the other bridge, leading
    next, reads them (``plan_requirements``); a standby, a bad request, an unknown and an
    ended job are refused in one line."""
    v1, v2 = "1" * 32, "2" * 32
    standby = bridges("rs", "jm-2")
    b = bridges("rs", "jm-1")
    _lead(b)
    assert b.ok("store_add", store="plans", name=JOB, pointer="file:/ha/submittedPlan-a") \
        == {"version": 0}
    assert b.ok("plan_requirements", job=JOB) == {"requirements": []}
    wanted = [{"vertex": v1, "lower": 1, "upper": 4}, {"vertex": v2, "lower": -1, "upper": 2}]
    assert b.ok("plan_rescale", job=JOB, requirements=wanted[::-1]) == {}
    assert standby.error("plan_rescale", job=JOB, requirements=[]) == "NotLeader"
    assert b.ok("counter_next", job=JOB) is not None
    assert b.ok("store_add", store=f"checkpoints/{JOB}", name="/0000000000000000001",
                pointer="file:/ha/cp-1") == {"version": 0}
    assert b.ok("plan_requirements", job=JOB) == {"requirements": wanted}
    assert b.ok("store_get", store="plans", name=JOB)["pointer"] == "file:/ha/submittedPlan-a"
    reg = connect("rs")
    assert [d.event_type for d in reg.timeline(JOB)].count("JobRescaled") == 1
    assert [(r.vertex_id, r.lower_bound, r.upper_bound)
            for r in reg.job(JOB).checkpoints.requirements] == [(v1, 1, 4), (v2, -1, 2)]
    for bad, why in (([{"vertex": v1, "lower": 3, "upper": 2}], "above its upper bound"),
                     ([{"vertex": "v", "lower": 1, "upper": 1}], "32 lower-case hex"),
                     ([{"vertex": v1, "lower": 1}], "must be a list")):
        answer = b.call("plan_rescale", job=JOB, requirements=bad)
        assert answer["error"] == "Invalid" and why in answer["message"], answer
        assert "\n" not in answer["message"]
    assert b.error("plan_rescale", job="c" * 32, requirements=[]) == "NotExist"
    assert b.error("plan_requirements", job="c" * 32) == "NotExist"
    # The leader goes; the standby leads and reads what the rescale set.
    assert standby.ok("contend") == {}
    b.stop()
    standby.event("granted")
    assert standby.ok("plan_requirements", job=JOB) == {"requirements": wanted}
    assert standby.ok("job_terminal", job=JOB, status="FINISHED") == {}
    assert standby.error("plan_rescale", job=JOB, requirements=wanted) == "AlreadyExists"


def test_grants_and_revocations_alternate_and_a_withdrawn_bridge_stops(bridges) -> None:
    b = bridges("alt", "jm-1")
    first = _lead(b)
    assert b.ok("withdraw") == {}
    revoked = b.event("revoked")
    assert revoked["epoch"] == first["epoch"]
    assert b.error("store_add", store="plans", name=JOB, pointer="p") == "NotLeader"
    second = _lead(b)
    assert second["epoch"] > first["epoch"] and second["session"] != first["session"]
    b.ok("withdraw")
    b.event("revoked")
    kinds = [e["event"] for e in b.seen if e["event"] in ("granted", "revoked")]
    assert kinds == ["granted", "revoked", "granted", "revoked"]


def _first_granted(*bridges: BridgeProcess) -> tuple[BridgeProcess, dict]:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        for b in bridges:
            granted = [e for e in b.seen if e["event"] == "granted"]
            if granted:
                return b, granted[0]
        time.sleep(0.05)
    raise AssertionError("no bridge was granted a term")


def test_two_bridges_one_leads_and_the_other_takes_over_when_its_jvm_dies(bridges) -> None:
    a, b = bridges("pair", "jm-a"), bridges("pair", "jm-b")
    a.ok("contend")
    b.ok("contend")
    leader, granted = _first_granted(a, b)
    waiting = b if leader is a else a
    assert not [e for e in waiting.seen if e["event"] == "granted"]
    leader.ok("publish", component="rest_server", session=granted["session"],
              address="http://a:8081")
    waiting.ok("watch", component="rest_server")  # the standby follows the leader
    first = waiting.event("leader")
    assert (first["session"], first["address"]) == (granted["session"], "http://a:8081")
    # The leader's JVM dies: EOF on its bridge's stdin; it revokes and leaves with 0.
    leader.close_stdin()
    assert leader.wait() == 0
    emptied = waiting.event("leader")  # the revoke ends the term's leader information
    assert (emptied["session"], emptied["address"]) == (None, None)
    taken = waiting.event("granted")
    assert taken["epoch"] == granted["epoch"] + 1
    assert waiting.ok("store_add", store="plans", name=JOB, pointer="p") == {"version": 0}
    waiting.ok("publish", component="rest_server", session=taken["session"],
               address="http://b:8081")
    mine = waiting.event("leader")
    assert (mine["session"], mine["address"]) == (taken["session"], "http://b:8081")
    assert [e["event"] for e in leader.seen if e["event"] in ("granted", "revoked")] == \
        ["granted", "revoked"]


def test_a_jvm_that_stops_beating_loses_the_term_and_a_stale_write_is_refused(bridges,
                                                                                connect) -> None:
    a = bridges("paused", "jm-a")
    granted = _lead(a)
    a.ok("store_add", store="plans", name=JOB, pointer="p")
    a.pause_heartbeat()  # the JVM is frozen: no alive, no request
    revoked = a.event("revoked")
    assert revoked["epoch"] == granted["epoch"] and revoked["reason"].startswith("not_alive")
    # Resumed: its stale session is refused; its store write is refused (no term)
    assert a.error("publish", component="dispatcher", session=granted["session"],
                   address="x") in ("NotLeader", "Fenced")
    assert a.error("store_add", store="plans", name=OTHER, pointer="p") in ("NotLeader",
                                                                          "Fenced")
    b = bridges("paused", "jm-b")
    taken = _lead(b)
    assert taken["epoch"] == granted["epoch"] + 1
    assert b.ok("counter_next", job=JOB) == {"value": 1}
    assert connect("paused").job(JOB).checkpoints.pending == (1,)


def test_a_stale_bridge_is_fenced(bridges, connect) -> None:
    """A bridge whose term a newer grant ended writes: Fenced (the fold refuses), and it
    says revoked."""
    a = bridges("stale", "jm-a")
    granted = _lead(a)
    # Another claims the next epoch outside the election (an operator, a zombie).
    other = connect("stale").claim_leadership("jm-z")
    assert other.epoch == granted["epoch"] + 1
    assert a.error("store_add", store="plans", name=JOB, pointer="p") in ("Fenced",
                                                                        "NotLeader")
    assert a.event("revoked")["epoch"] == granted["epoch"]
    assert JOB not in connect("stale").jobs(include_terminal=True)


def test_a_bad_request_is_answered_invalid_in_one_line(bridges) -> None:
    b = bridges("bad", "jm-1")
    assert b.error("no_such_op") == "Invalid"
    assert b.error("store_get", store="plans") == "Invalid"  # no name
    assert b.error("store_get", store="nope", name="x") == "Invalid"
    assert b.error("counter_set", job=JOB, value="7") == "Invalid"
    assert b.error("store_add", store="plans", name="bad id!", pointer="p") in (
        "Invalid", "NotLeader")
    b.send_raw("this is not json")
    b.send_raw(b"\xff\xfe")
    b.send_raw('{"op": "leaders"}')  # no id: cannot be answered
    assert b.ok("results_dirty") == []  # still serving
    assert len([line for line in b.stderr if "flink-bridge" in line]) >= 1


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports nothing listens on now (loopback)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            held = []
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise AssertionError("no free run of ports")


def _scrape(port: int) -> dict[str, float]:
    """``/metrics`` of the bridge: ``{series with labels: value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=DEADLINE) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_the_bridge_serves_jobregs_metrics_on_the_first_free_port_of_its_range(bridges) -> None:
    """Issue 43, item 7: ``high-availability.jobreg.metrics-port`` (a range, so that two
    JobManagers of one host share the setting) reaches the bridge as ``--metrics-port``, and
    the bridge serves its client's metrics: leadership, the epoch, writes by outcome."""
    first = _free_ports(3)
    with socket.socket() as busy:  # the first port of the range is taken
        busy.bind(("127.0.0.1", first))
        busy.listen()
        b = bridges("metrics", "jm-1", extra=("--metrics-port", f"{first}-{first + 2}"))
        end = time.monotonic() + DEADLINE  # the line is on stderr, read by another thread
        while not (served := [ln for ln in b.stderr if "serving jobreg's metrics" in ln]) \
                and time.monotonic() < end:
            time.sleep(0.05)
        assert served and f":{first + 1}/metrics" in served[0], b.stderr
    _lead(b)
    assert b.ok("store_add", store="plans", name=JOB, pointer="file:///ha/plan-m") == \
        {"version": 0}
    got = _scrape(first + 1)
    labels = 'namespace="metrics"'
    leading = [v for k, v in got.items() if k.startswith("jobreg_leading{") and labels in k]
    epoch = [v for k, v in got.items() if k.startswith("jobreg_epoch{") and labels in k]
    accepted = sum(v for k, v in got.items() if k.startswith("jobreg_writes_total{")
                   and labels in k and 'outcome="accepted"' in k)
    assert leading == [1.0] and epoch == [1.0], got
    assert accepted >= 2, got  # the claim and the plan's submit at least


@pytest.mark.parametrize("args", [
    ["--namespace", "ok", "--contender", "c"],  # no --bootstrap
    ["--bootstrap", "127.0.0.1:1", "--contender", "c"],  # no --namespace
    ["--bootstrap", "127.0.0.1:1", "--namespace", "/bad cluster", "--contender", "c"],
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok"],  # no --contender
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok", "--contender", "c", "--lease", "x"],
    ["--bootstrap", "nope", "--namespace", "ok", "--contender", "c"],
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok", "--contender", "c", "--bogus"],
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok", "--contender", "c",
     "--metrics-port", "nine"],
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok", "--contender", "c",
     "--metrics-port", "9470-9464"],
    ["--bootstrap", "127.0.0.1:1", "--namespace", "ok", "--contender", "c",
     "--metrics-port", "70000"],
])
def test_bad_arguments_are_one_line_and_exit_2(args) -> None:
    run = subprocess.run([sys.executable, "-m", "registry", "flink-bridge", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 2, run
    assert run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


_PARENT = """
import subprocess, sys, time
child = subprocess.Popen(sys.argv[3:], stdin=int(sys.argv[1]), stdout=open(sys.argv[2], "wb"),
                         pass_fds=(int(sys.argv[1]),))
print(child.pid, flush=True)
time.sleep(3600)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("eof_too", [False, True], ids=["sigterm", "sigterm-and-eof"])
def test_the_bridge_dies_with_its_jvm_and_revokes(broker, topic, connect, tmp_path,
                                                  eof_too) -> None:
    """The JVM killed with -9: the bridge gets SIGTERM (PR_SET_PDEATHSIG), gives its term up
    and leaves. With its stdin kept open elsewhere, SIGTERM alone ends it; as with a real JVM,
    EOF on stdin comes with the signal, and the signal must not cut the leaving (its revoke)
    short: a JobManager's standby then waited out the lease in 3 of 3 kills."""
    import json
    import os
    import signal

    read, write = os.pipe()
    out = tmp_path / "bridge.out"
    out.touch()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(read), str(out), sys.executable, "-m", "registry",
         "flink-bridge", "--bootstrap", broker.bootstrap, "--topic", topic,
         "--namespace", "orphan", "--contender", "jm-1", "--lease", str(LEASE)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT,
        pass_fds=(read,))
    os.close(read)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.write(write, b'{"id": 1, "op": "contend"}\n')
        deadline = time.monotonic() + DEADLINE
        while '"granted"' not in out.read_text():
            assert time.monotonic() < deadline, out.read_text()
            os.write(write, b'{"op": "alive"}\n')
            time.sleep(0.1)
        if eof_too:
            os.close(write)
            write = -1
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(DEADLINE)
        while not _gone(child):
            assert time.monotonic() < deadline + DEADLINE, "the bridge outlived its JVM"
            time.sleep(0.1)
        events = [json.loads(line) for line in out.read_text().splitlines()]
        assert [e.get("event") for e in events if e.get("event") in ("granted", "revoked")] \
            == ["granted", "revoked"]
        assert connect("orphan").leader() is None  # revoked, not left to lapse
    finally:
        if write >= 0:
            os.close(write)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_broker_it_cannot_reach_is_one_line_and_exit_1() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on: every connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-m", "registry", "flink-bridge", "--bootstrap",
                          f"127.0.0.1:{port}", "--namespace", "ok", "--contender", "c"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 1 and run.stdout == ""
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "no Kafka broker answered" in run.stderr
