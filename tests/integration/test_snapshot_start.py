"""Client start-up from a snapshot plus the tail of the log, on the embedded broker."""

from __future__ import annotations

import logging
import time

import pytest

from registry import EmbeddedBroker, Registry, TopicConfig

pytestmark = pytest.mark.integration


def _fill(reg: Registry, prefix: str, n: int) -> None:
    term = reg.sync().active_leader and reg._terms[-1] or reg.claim_leadership("jm-1")
    for start in range(0, n, 500):
        term.submit_many([(f"{prefix}-{i}", b"g") for i in range(start, min(n, start + 500))])


def test_snapshot_plus_tail_equals_a_fold_from_scratch(connect, tmp_path) -> None:
    reg = connect("snap")
    _fill(reg, "a", 1200)
    path = reg.write_snapshot(tmp_path / "snap.jobreg")
    _fill(reg, "b", 300)  # the tail after the snapshot
    reg._terms[-1].cancel("a-7")
    warm = connect("snap", snapshot=path)
    assert warm.started_from.startswith("snapshot ")
    assert warm.image == connect("snap").image == reg.sync()


def test_a_snapshot_older_than_delete_retention_is_not_trusted(broker, topic, tmp_path,
                                                               caplog) -> None:
    short = TopicConfig(delete_retention_ms=1000)  # the topic keeps tombstones for 1 s
    reg = Registry.connect(broker.bootstrap, "old", topic=topic, topic_config=short)
    _fill(reg, "a", 10)
    path = reg.write_snapshot(tmp_path / "old.jobreg")
    time.sleep(1.5)
    with caplog.at_level(logging.WARNING, logger="registry"):
        cold = Registry.connect(broker.bootstrap, "old", topic=topic, snapshot=path)
    assert cold.started_from.startswith("scratch (snapshot") and "delete.retention.ms" in \
        cold.started_from
    assert "not trusted" in caplog.text
    assert cold.image == reg.sync()
    for r in (reg, cold):
        r.close()


def test_a_snapshot_of_other_fold_rules_is_not_trusted(connect, tmp_path, caplog) -> None:
    """A snapshot written by a jobreg of other fold rules (its body names them) is a cache of
    another fold: the client replays from the start and says why; nothing is lost."""
    import gzip
    import hashlib
    import json

    reg = connect("rules")
    _fill(reg, "a", 20)
    path = reg.write_snapshot(tmp_path / "rules.jobreg")
    head, _, body = path.read_bytes().partition(b"\n")
    first, _, rest = gzip.decompress(body).partition(b"\n")
    body = gzip.compress(json.dumps({**json.loads(first), "rules": "older"}).encode()
                         + b"\n" + rest)
    fields = {**json.loads(head), "body_bytes": len(body),
              "body_sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(json.dumps(fields).encode() + b"\n" + body)
    with caplog.at_level(logging.WARNING, logger="registry"):
        cold = connect("rules", snapshot=path)
    assert cold.started_from.startswith("scratch (snapshot") and "other fold rules" in \
        cold.started_from, cold.started_from
    assert "rebuilding namespace 'rules'" in caplog.text
    assert cold.image == reg.sync()


@pytest.mark.embedded_only("starts two EmbeddedBrokers of its own; the second has lost the log")
def test_a_snapshot_beyond_the_end_of_the_log_is_not_trusted(topic, tmp_path) -> None:
    with EmbeddedBroker() as first:
        reg = Registry.connect(first.bootstrap, "wiped", topic=topic)
        _fill(reg, "a", 50)
        path = reg.write_snapshot(tmp_path / "w.jobreg")
        reg.close()
    with EmbeddedBroker() as second:  # in memory: the log is gone
        cold = Registry.connect(second.bootstrap, "wiped", topic=topic, snapshot=path)
        assert "beyond the end of the log" in cold.started_from
        assert cold.jobs() == {}
        cold.close()


def test_a_snapshot_of_another_namespace_is_refused(connect, tmp_path) -> None:
    from registry import ConfigError

    path = connect("one").write_snapshot(tmp_path / "one.jobreg")
    with pytest.raises(ConfigError):
        connect("two", snapshot=path)
