"""How a refusal of the broker's authorizer reads (registry.log.not_authorized): one line
naming the user, the operation, the resource and the broker's code; never a secret; ``None``
for any error that is not an authorization failure."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from registry import BrokerError, NotAuthorized
from registry.kafka_config import Kafka
from registry.log import (
    TransactionFailed,
    TransactionNotAuthorized,
    kafka_error_of,
    not_authorized,
)

KAFKA = Kafka("h:9093", {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                         "sasl.username": "audit", "sasl.password": "pw-never-shown"})


def test_a_refused_write_names_the_user_the_operation_and_the_resource() -> None:
    error = not_authorized(KAFKA, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "WRITE",
                           "topic", "jobreg")
    assert isinstance(error, NotAuthorized) and isinstance(error, BrokerError)
    assert str(error) == (
        "h:9093: user 'audit' is not authorized: WRITE on topic 'jobreg' "
        "(TOPIC_AUTHORIZATION_FAILED); an administrator grants it with an ACL (README "
        "\"Connecting to a secured cluster\")")
    assert (error.operation, error.resource_type, error.resource, error.code) == (
        "WRITE", "topic", "jobreg", "TOPIC_AUTHORIZATION_FAILED")
    assert "pw-never-shown" not in str(error) + repr(error)


def test_an_idempotent_producer_refused_its_id_says_what_it_needs() -> None:
    error = not_authorized(KAFKA, KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED),
                           "WRITE", "topic", "jobreg")
    assert error is not None and "\n" not in str(error)
    assert "WRITE on topic 'jobreg' (CLUSTER_AUTHORIZATION_FAILED); the broker gives an " \
           "idempotent producer its producer id only with WRITE on a topic" in str(error)


def test_without_a_sasl_user_the_principal_is_anonymous() -> None:
    error = not_authorized(Kafka("h:9092"), KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED),
                           "READ", "group", "g")
    assert error is not None
    assert "h:9092: this client (no SASL user: the broker's ANONYMOUS) is not authorized: " \
           "READ on group 'g' (GROUP_AUTHORIZATION_FAILED)" in str(error)


@pytest.mark.parametrize("code", [KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT,
                                  KafkaError._TIMED_OUT, KafkaError.SASL_AUTHENTICATION_FAILED])
def test_other_errors_are_not_authorization_failures(code: int) -> None:
    assert not_authorized(KAFKA, KafkaError(code), "WRITE", "topic", "t") is None
    assert not_authorized(KAFKA, None, "WRITE", "topic", "t") is None
    assert not_authorized(KAFKA, ValueError("x"), "WRITE", "topic", "t") is None


def test_the_error_is_found_through_a_callbacks_system_error() -> None:
    """confluent-kafka raises a producer's fatal error inside a delivery callback as the
    cause of a SystemError; the refusal is found there too."""
    fatal = KafkaException(KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED))
    try:
        try:
            raise fatal
        except KafkaException as e:
            raise SystemError("<method 'append'> returned a result with an exception set") \
                from e
    except SystemError as wrapped:
        assert kafka_error_of(wrapped) is fatal.args[0]
        assert isinstance(not_authorized(KAFKA, wrapped, "WRITE", "topic", "t"), NotAuthorized)


def test_a_refused_transaction_is_both_a_transaction_failure_and_a_refusal() -> None:
    refused = not_authorized(KAFKA, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), "WRITE",
                             "topic", "jobreg")
    assert refused is not None
    error = TransactionNotAuthorized(refused, fatal=False, appended=(), in_doubt=0)
    assert isinstance(error, TransactionFailed) and isinstance(error, NotAuthorized)
    assert str(error) == str(refused) and error.resource == "jobreg" and not error.fatal
