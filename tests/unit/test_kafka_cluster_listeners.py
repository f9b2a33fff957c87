"""KafkaCluster's listener settings (registry.dev.kafka), without starting Kafka: extra
listeners as NAME or NAME:PROTOCOL, a cluster without its PLAINTEXT listener, the controller
listener's protocol; bad values are one-line ConfigErrors."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry import ConfigError
from registry.dev.kafka import KafkaCluster


def _laid_out(tmp_path: Path, **kw: object) -> KafkaCluster:
    cluster = KafkaCluster(**kw)  # type: ignore[arg-type]
    cluster._layout(tmp_path)  # ports and server.properties; nothing is started
    return cluster


def test_the_default_keeps_a_plaintext_client_listener(tmp_path: Path) -> None:
    cluster = _laid_out(tmp_path, listeners=["SASL_SSL"])
    node = cluster.nodes[0]
    settings = cluster.node_config(node)
    assert settings["listener.security.protocol.map"] == \
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
    assert cluster.bootstrap == f"127.0.0.1:{node.port}"
    assert node.extra_listeners["SASL_SSL"] != node.port
    assert settings["inter.broker.listener.name"] == "PLAINTEXT"


def test_without_plaintext_clients_bootstrap_to_the_first_listener(tmp_path: Path) -> None:
    cluster = _laid_out(tmp_path, nodes=2, listeners=["SASL_SSL", "BROKER:SASL_SSL"],
                        plaintext=False, controller_protocol="SSL",
                        config={"inter.broker.listener.name": "BROKER"})
    for node in cluster.nodes:
        settings = cluster.node_config(node)
        assert settings["listener.security.protocol.map"] == \
            "CONTROLLER:SSL,SASL_SSL:SASL_SSL,BROKER:SASL_SSL"
        assert "PLAINTEXT" not in settings["listeners"] + settings["advertised.listeners"]
        assert "CONTROLLER" not in settings["advertised.listeners"]
        assert node.extra_listeners["SASL_SSL"] == node.port
        assert settings["inter.broker.listener.name"] == "BROKER"
        written = (node.directory / "server.properties").read_text()
        assert f"SASL_SSL://127.0.0.1:{node.port}" in written
    assert cluster.bootstrap == cluster.listener_bootstrap("SASL_SSL")


@pytest.mark.parametrize(("kw", "said"), [
    ({"listeners": ["CONTROLLER"]}, "listener 'CONTROLLER'"),
    ({"listeners": ["X:KERBEROS"]}, "listener 'X:KERBEROS'"),
    ({"listeners": ["A:SSL", "A:SASL_SSL"]}, "listener 'A:SASL_SSL'"),
    ({"plaintext": False}, "needs another one"),
    ({"controller_protocol": "SASL_SSL"}, "controller_protocol must be PLAINTEXT or SSL"),
])
def test_bad_listener_settings_are_one_line(kw: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as e:
        KafkaCluster(**kw)  # type: ignore[arg-type]
    assert "\n" not in str(e.value)
