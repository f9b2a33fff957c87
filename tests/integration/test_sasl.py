"""Issue 26: SASL against a broker. The embedded broker behind a SASL-terminating proxy
(tests/support/sasl_proxy.py, as Kroxylicious terminates SASL in front of Kafka): the proxy
itself against librdkafka; then jobreg's client, the CLI with a properties file, forensics and
the audit job (plain and on Spark) with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512. A right password
works; a wrong one is one line naming the mechanism and the user; a secret given as
``${env:...}`` or ``${file:...}`` shows in no output, log line or exception."""

from __future__ import annotations

import sys

import pytest
from support.sasl_proxy import MECHANISMS, SaslProxy

from registry import BrokerError, EmbeddedBroker, Registry

pytestmark = [pytest.mark.integration, pytest.mark.embedded_only]

JOBREG = [sys.executable, "-m", "registry.cli"]
USER = "jobreg"
SECRET = "s3cr3t-Pw-never-shown"  # the right password
WRONG = "wr0ng-Pw-never-shown"


@pytest.fixture(scope="module")
def sasl_broker():
    """(bootstrap, proxy): an embedded broker reachable only through SASL (PLAINTEXT)."""
    proxy = SaslProxy({USER: SECRET, "other": "other-pw"})
    try:
        with EmbeddedBroker(advertised_port=proxy.port) as broker:
            proxy.target = broker.listen_port
            yield f"127.0.0.1:{proxy.port}", proxy
    finally:
        proxy.stop()


def _sasl(mechanism: str, password: str = SECRET, user: str = USER) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_is_one_line_naming_the_mechanism_and_the_user(
        sasl_broker, mechanism) -> None:
    bootstrap, _ = sasl_broker
    with pytest.raises(BrokerError) as e:
        Registry.connect(bootstrap, "sasl", topic="sasl-client", timeout=30,
                         client_config=_sasl(mechanism, WRONG))
    text = str(e.value)
    assert "\n" not in text and WRONG not in text and WRONG not in repr(e.value)
    assert mechanism in text and f"'{USER}'" in text, text
