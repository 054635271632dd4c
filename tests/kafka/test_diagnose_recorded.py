"""Refusals explained in one line (no broker): librdkafka's own words for each case, as recorded against Kafka
4.3.1 with SCRAM-SHA-512 over TLS and StandardAuthorizer (confluent-kafka 2.16.1 / librdkafka 2.16.0), turned
by kafka.diagnose into the line naming the mechanism and user, the certificate, or the operation and resource,
and kept by kafka.reported_refusals until the worker stops with exit 6."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from iolstream.kafka.config import config_from_dict
from iolstream.kafka.diagnose import explain, explain_log, named, refusal
from iolstream.kafka.errors import AccessDenied, WorkerError
from iolstream.kafka.reported_refusals import Refusals
from iolstream.ops.lifecycle import EXIT_ACCESS, EXIT_FATAL

CLIENT = {
    "bootstrap.servers": "127.0.0.1:19192",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "worker",
    "sasl.password": "s3cret-pw",
    "ssl.ca.location": "/etc/iolstream/ca.pem",
}

# What librdkafka said in each case (tests/secure/ provokes them on a real broker).
RECORDED = {
    "wrong password": (
        KafkaError._AUTHENTICATION,
        "sasl_ssl://127.0.0.1:19192/bootstrap: SASL authentication error: Authentication failed during "
        "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 311ms in state AUTH_REQ)",
    ),
    "untrusted CA": (
        KafkaError._SSL,
        "sasl_ssl://127.0.0.1:19192/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
        "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
        "configured or root CA certificates are installed (install ca-certificates package) (after 8ms in state "
        "SSL_HANDSHAKE)",
    ),
    "untrusted CA, first attempt": (
        KafkaError._TRANSPORT,
        "sasl_ssl://127.0.0.1:19192/bootstrap: error:0A000086:SSL routines::certificate verify failed (after 4ms "
        "in state SSL_HANDSHAKE)",
    ),
    "no Read on a subscribed topic": (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "Subscribed topic not available: iol.features: Broker: Topic authorization failed",
    ),
    "no Write (delivery report)": (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "Broker: Topic authorization failed",
    ),
    "no Read on the group": (
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        "FindCoordinator response error: Group authorization failed.",
    ),
    "no Write on the transactional id": (
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "Failed to find transaction coordinator: sasl_ssl://127.0.0.1:19192/1: Broker: Transactional Id "
        "authorization failed: Transactional Id authorization failed.",
    ),
}


def error(case: str) -> KafkaError:
    code, text = RECORDED[case]
    return KafkaError(code, text)


def test_a_wrong_password_names_the_broker_mechanism_and_user_never_the_password():
    line = explain(error("wrong password"), CLIENT)
    assert line == (
        "authentication failed at 127.0.0.1:19192: SASL SCRAM-SHA-512 as user 'worker' refused: wrong password "
        "or no such user (kafka.client.sasl.username, kafka.client.sasl.password)"
    )
    assert line.refusal and "s3cret-pw" not in line


@pytest.mark.parametrize("case", ["untrusted CA", "untrusted CA, first attempt"])
def test_an_untrusted_certificate_names_the_broker_and_the_ca_file(case):
    line = explain(error(case), CLIENT)
    assert line == (
        "TLS with 127.0.0.1:19192 failed: its certificate is not trusted: certificate verify failed "
        "(error:0A000086) against the CA file /etc/iolstream/ca.pem (kafka.client.ssl.ca.location)"
    )
    assert line.refusal


def test_authorisation_names_principal_operation_and_resource():
    who = "not authorised: user 'worker' (SCRAM-SHA-512) may not"
    assert explain(error("no Read on a subscribed topic"), CLIENT, operation="Read").startswith(
        f"{who} Read topic 'iol.features' ("
    )
    line = explain(
        error("no Write (delivery report)"),
        CLIENT,
        operation="Write",
        resource=named("topic", "iol.predictions"),
    )
    assert line.startswith(f"{who} Write topic 'iol.predictions' (") and line.refusal
    two = explain(
        error("no Write (delivery report)"), CLIENT, operation="Write", resource=named("topic", "p", "d")
    )
    assert f"{who} Write topic 'p' or 'd' (" in two


def test_other_errors_are_not_refusals():
    assert refusal(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:19192/1: Connection refused"), CLIENT) is None
    assert refusal(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"), CLIENT) is None
    assert refusal(KafkaError(KafkaError.NOT_COORDINATOR, "Broker: Not coordinator"), CLIENT) is None
    tls_to_plaintext = KafkaError(
        KafkaError._SSL,
        "127.0.0.1:19092/bootstrap: SSL handshake failed: Disconnected: connecting to a PLAINTEXT "
        "broker listener?",
    )
    assert refusal(tls_to_plaintext, CLIENT) is None  # a setting to fix, not a refusal (exit 3)
    assert explain(tls_to_plaintext, CLIENT).rule == "tls"


def test_log_lines_name_the_refused_transaction_topic():
    line = explain_log(
        'ADDPARTS [rdkafka#producer-3] [thrd:main]: TxnCoordinator/1: Failed to add partition "iol.predictions" [0] '
        "to transaction: Broker: Topic authorization failed",
        CLIENT,
    )
    assert "may not Write topic 'iol.predictions'" in line
    fail = (
        "FAIL [rdkafka#producer-2] [thrd:sasl_ssl://127.0.0.1:19192/bootstrap]: "
        + RECORDED["wrong password"][1]
    )
    assert explain_log(fail, CLIENT).startswith(
        "authentication failed at 127.0.0.1:19192: SASL SCRAM-SHA-512"
    )
    assert explain_log("FETCH [rdkafka#consumer-1] [thrd:main]: fetch backoff", CLIENT) is None


def test_refusals_keep_the_first_name_the_group_and_transactional_id_and_raise_exit_6():
    cfg = config_from_dict(
        {
            "model": {"n_inputs": 2, "classes": [0, 1]},
            "kafka": {
                "group_id": "g1",
                "client": {k: v for k, v in CLIENT.items() if k != "bootstrap.servers"},
            },
            "durability": {"exactly_once": True},
        },
        environ={},
    )
    refusals = Refusals(cfg)
    refusals.check()  # nothing yet
    assert not refusals.note(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    assert refusals.note(error("no Read on the group"), source="consumer")
    assert "may not Read group 'g1'" in refusals.first
    assert refusals.note(error("no Write on the transactional id"))
    assert "group 'g1'" in refusals.first  # the first stays
    with pytest.raises(AccessDenied) as caught:
        refusals.check()
    assert caught.value.exit_code == EXIT_ACCESS == 6 and WorkerError.exit_code == EXIT_FATAL

    other = Refusals(cfg)
    other.note(error("no Write on the transactional id"))
    assert "may not Write transactional id 'g1-worker'" in other.first
    refusals = Refusals(cfg)
    refusals.handler().handle(
        logging.makeLogRecord({"msg": "FAIL [x] [thrd:y]: " + RECORDED["untrusted CA"][1], "levelno": 40})
    )
    assert refusals.first.startswith("TLS with 127.0.0.1:19192 failed: its certificate is not trusted")
