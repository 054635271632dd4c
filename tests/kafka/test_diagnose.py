"""kafka/diagnose.py: every kind of Kafka problem becomes one line naming the address or the resource and
the key to look at, the most telling of several errors wins, and the password never shows (no broker)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from iolstream.kafka import diagnose

CONF = {
    "bootstrap.servers": "kafka-1.example:9093",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "iol-worker",
    "sasl.password": "hunter2-very-secret",
}


def err(code, text=""):
    return KafkaError(code, text)


@pytest.mark.parametrize(
    "error,needles",
    [
        (
            err(
                KafkaError._TRANSPORT,
                "kafka-1.example:9093/bootstrap: Connect to ipv4#10.1.2.3:9093 failed: "
                "Connection refused (after 0ms in state CONNECT)",
            ),
            [
                "cannot reach the broker at kafka-1.example:9093",
                "kafka.bootstrap_servers",
                "connection refused",
            ],
        ),
        (
            err(
                KafkaError._RESOLVE,
                "kafka-1.example:9093/bootstrap: Failed to resolve 'kafka-1.example:9093': "
                "Name or service not known",
            ),
            ["kafka-1.example:9093", "kafka.bootstrap_servers", "host name not resolved"],
        ),
        (
            err(
                KafkaError._AUTHENTICATION,
                "SASL authentication error: Authentication failed during authentication "
                "due to invalid credentials with SASL mechanism SCRAM-SHA-512",
            ),
            [
                "authentication failed at kafka-1.example:9093",
                "SCRAM-SHA-512",
                "'iol-worker'",
                "sasl.password",
            ],
        ),
        (
            err(
                KafkaError._SSL,
                "kafka-1.example:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
                "routines::certificate verify failed",
            ),
            [
                "TLS with kafka-1.example:9093 failed",
                "certificate verify failed",
                "kafka.client.ssl.ca.location",
            ],
        ),
    ],
)
def test_each_kind_is_one_line_naming_where_and_which_key(error, needles):
    line = diagnose.explain(error, CONF)
    assert "\n" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    assert CONF["sasl.password"] not in line


def test_authorisation_names_the_resource_and_the_operation():
    for code, resource in [
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, diagnose.named("topic", "iol.predictions")),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, diagnose.named("group", "iolstream")),
        (
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            diagnose.named("transactional id", "iolstream-worker"),
        ),
    ]:
        line = diagnose.explain(KafkaException(err(code)), CONF, operation="Write", resource=resource)
        assert line == (
            f"not authorised: user 'iol-worker' (SCRAM-SHA-512) may not Write {resource} "
            "(a missing ACL: iolstream acls prints those iolstream needs)"
        )
        assert line.refusal and line.rule == "authorisation"
    assert diagnose.named("topic", "p", "d") == "topic 'p' or 'd'"


def test_the_password_never_shows_even_when_the_broker_repeats_it():
    line = diagnose.explain(err(KafkaError._AUTHENTICATION, f"bad secret {CONF['sasl.password']}"), CONF)
    assert CONF["sasl.password"] not in line and "***" in line


def test_the_cause_seen_by_the_error_callback_explains_the_generic_failure():
    generic = KafkaException(
        err(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure")
    )
    seen = [
        err(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
        err(
            KafkaError._TRANSPORT,
            "kafka-1.example:9093/bootstrap: Connect to ipv4#10.1.2.3:9093 failed: "
            "Connection refused (after 1ms in state CONNECT)",
        ),
    ]
    assert diagnose.explain(generic, CONF, seen=seen).endswith("connection refused")
    seen.append(err(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"))
    assert diagnose.explain(generic, CONF, seen=seen).startswith("authentication failed")


def test_an_unknown_error_still_names_the_operation_and_address():
    line = diagnose.explain(RuntimeError("something odd"), {"bootstrap.servers": "b:1"}, operation="flush")
    assert line == "flush failed (at b:1): something odd"


def test_the_collector_keeps_what_librdkafka_reports_and_forwards_log_lines(caplog):
    collector = diagnose.Collector(forward=logging.getLogger("iolstream.kafka"))
    with caplog.at_level(logging.WARNING, logger="iolstream.kafka"):
        collector.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connection refused")
    collector.error(err(KafkaError._TRANSPORT, "x"))
    assert collector.lines == ["FAIL [rdkafka#producer-1] Connection refused"]
    assert [e.code() for e in collector.errors] == [KafkaError._TRANSPORT]
    assert caplog.records[0].getMessage() == "FAIL [rdkafka#producer-1] Connection refused"


def test_probe_of_a_dead_address_is_one_line():
    meta, why = diagnose.probe({"bootstrap.servers": "127.0.0.1:1"}, 1.0)
    assert meta is None
    assert why == "cannot reach the broker at 127.0.0.1:1 (kafka.bootstrap_servers): connection refused"


def test_a_refused_connection_to_a_tls_address_is_not_a_tls_failure():
    refused = err(
        KafkaError._TRANSPORT,
        "sasl_ssl://kafka-1.example:9093/bootstrap: Connect to ipv4#10.1.2.3:9093 failed: Connection refused "
        "(after 0ms in state CONNECT)",
    )
    assert diagnose.rule_of(refused).name == "unreachable"
    assert diagnose.explain(refused, CONF).endswith("(kafka.bootstrap_servers): connection refused")


def test_wait_for_broker_says_why_at_most_every_interval_and_returns_once_it_answers(monkeypatch, caplog):
    answers = iter(
        [(None, "cannot reach the broker at b:1 (kafka.bootstrap_servers): connection refused")] * 4
    )
    monkeypatch.setattr(diagnose, "probe", lambda conf, timeout: next(answers, ("metadata", None)))
    monkeypatch.setattr(diagnose.time, "sleep", lambda s: None)
    log = logging.getLogger("iolstream.worker")
    with caplog.at_level(logging.INFO, logger="iolstream.worker"):
        meta = diagnose.wait_for_broker({"bootstrap.servers": "b:1"}, diagnose.time.monotonic() + 60, log)
    assert meta == "metadata"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "cannot reach the broker at b:1 (kafka.bootstrap_servers)"
    )
    assert caplog.records[-1].getMessage().startswith("the broker at b:1 answers after")


def test_wait_for_broker_gives_up_at_the_deadline(monkeypatch, caplog):
    monkeypatch.setattr(diagnose, "probe", lambda conf, timeout: (None, "cannot reach the broker at b:1"))
    log = logging.getLogger("iolstream.worker")
    with caplog.at_level(logging.INFO, logger="iolstream.worker"):
        assert diagnose.wait_for_broker({}, diagnose.time.monotonic() + 1.5, log) is None
    assert caplog.records[-1].levelno == logging.ERROR and "gave up after" in caplog.records[-1].getMessage()
