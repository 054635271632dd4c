"""Each refusal of a secured broker ends ``iolstream run`` (and ``iolstream produce``) with exit code 6 and one
line naming what failed — the mechanism and user, the certificate, or the resource and operation — logged once,
never the password; ``iolstream check`` run before prints the same line and exits 6 too. Each case grants the
worker's ACLs (``iolstream.kafka.required_acls``) but one, or breaks one setting.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections import Counter

import pytest
from kafka_util import produce_json
from secure_kafka import (
    IOLSTREAM,
    REPO,
    feature_and_label_messages,
    run_worker,
    stream,
    worker_raw,
    write_config,
)

from iolstream.kafka import required_acls
from iolstream.kafka.config import config_from_dict
from iolstream.ops.lifecycle import EXIT_ACCESS

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def rogue_ca(tmp_path_factory) -> str:
    """A CA the broker's certificate was not signed by."""
    d = tmp_path_factory.mktemp("rogue")
    args = "req -x509 -newkey rsa:2048 -nodes -days 2 -subj".split() + ["/CN=rogue CA"]
    subprocess.run(
        ["openssl", *args, "-keyout", str(d / "rogue.key"), "-out", str(d / "rogue.pem")],
        check=True,
        capture_output=True,
    )
    return str(d / "rogue.pem")


def setup(secure_kafka, tmp_path, *, exactly_once=False, create=False):
    """Fresh topics holding 20 rows (sent by the producer user), and the worker's config."""
    features, labels, predictions, dead = secure_kafka.topics("features", "labels", "predictions", "dead")
    topics = {"features": features, "labels": labels, "predictions": predictions, "dead_letters": dead}
    if create:
        topics["predictions"] += "-new"
    secure_kafka.grant(required_acls.producer_acls(features, labels), "producer")
    f, lab = feature_and_label_messages(*stream(20))
    produce_json(secure_kafka.bootstrap, features, f, conf=secure_kafka.client("producer"))
    produce_json(secure_kafka.bootstrap, labels, lab, conf=secure_kafka.client("producer"))
    raw = worker_raw(secure_kafka, topics, tmp_path / "snap")
    raw["durability"] = {"exactly_once": exactly_once}
    raw["topics"]["create"] = create
    return raw


def check(config) -> tuple[int, str]:
    """``iolstream check -c config``: (exit code, its lines)."""
    r = subprocess.run(
        [str(IOLSTREAM), "check", "-c", str(config), "--timeout", "20"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not r.stderr.strip(), r.stderr[-3000:]  # nothing raw from librdkafka, no traceback
    return r.returncode, r.stdout


def run_refused(secure_kafka, tmp_path, raw, *, leave_out=(), add=()) -> str:
    """Grant the worker's ACLs less those matching ``leave_out`` ((topic/group/txn name, operation) pairs) plus
    ``add``; ``iolstream check`` must exit 6; run the worker: it must exit 6 with one fatal line, logged once,
    and check must have printed that very line as a FAIL; return the line."""
    want = required_acls.worker_acls(config_from_dict(raw))
    granted = [a for a in want if (a.name, a.operation) not in leave_out]
    assert len(want) - len(granted) == len(leave_out), "a left-out ACL is not among the worker's"
    secure_kafka.grant(granted + list(add), "worker")
    config = write_config(raw, tmp_path / "worker.yaml")
    checked, check_out = check(config)
    assert checked == EXIT_ACCESS, check_out
    code, out, seconds = run_worker(config, "--max-seconds", "60")
    assert code == EXIT_ACCESS, f"exit {code} after {seconds:.0f} s:\n{out[-4000:]}"
    fatal = [line for line in out.splitlines() if "fatal:" in line or "cannot start:" in line]
    assert len(fatal) == 1, out[-4000:]
    assert seconds < 30, f"{seconds:.0f} s to give up:\n{out[-3000:]}"
    loud = Counter(
        re.sub(r"^\S+ ", "", line) for line in out.splitlines() if " ERROR " in line or " WARNING " in line
    )
    assert max(loud.values()) == 1, f"repeated: {loud.most_common(2)}"
    for password in secure_kafka.passwords.values():
        assert password not in out and password not in check_out
    line = fatal[0].split("fatal: ", 1)[-1].split("cannot start: ", 1)[-1]
    assert any(c.startswith("FAIL") and c.endswith(": " + line) for c in check_out.splitlines()), (
        line,
        check_out,
    )
    return line


def test_a_wrong_password_names_the_mechanism_and_the_user(secure_kafka, tmp_path):
    raw = setup(secure_kafka, tmp_path)
    raw["kafka"]["client"]["sasl.password"] = "not-the-password"
    line = run_refused(secure_kafka, tmp_path, raw)
    assert line.startswith("authentication failed at 127.0.0.1:"), line
    assert "SASL SCRAM-SHA-512 as user 'worker' refused: wrong password or no such user" in line, line
    assert "not-the-password" not in line


def test_a_password_that_is_a_word_leaves_the_line_alone(secure_kafka, tmp_path):
    """Redaction masks the password in librdkafka's text only: the password "wrong" must not turn the line's own
    "wrong password" into "*** password"."""
    raw = setup(secure_kafka, tmp_path)
    raw["kafka"]["client"]["sasl.password"] = "wrong"
    line = run_refused(secure_kafka, tmp_path, raw)
    assert "refused: wrong password or no such user" in line and "***" not in line, line


def test_a_plaintext_client_on_the_sasl_ssl_port_names_the_protocol(secure_kafka, tmp_path):
    """No security settings against the SASL_SSL listener: the broker closes the connection at the first request,
    which librdkafka reports only as a transport failure; the line names the likely protocol mismatch (exit 3)."""
    raw = setup(secure_kafka, tmp_path)
    raw["kafka"]["client"] = {}
    config = write_config(raw, tmp_path / "worker.yaml")
    checked, out = check(config)
    assert checked == 3, out
    (line,) = [c for c in out.splitlines() if c.startswith("FAIL  broker:")]
    assert (
        "closed the connection at the first request, as a TLS or SASL port does to a PLAINTEXT client" in line
    )
    assert "kafka.client.security.protocol" in line and "Broker transport failure" not in line, line


def test_an_untrusted_certificate_names_the_broker_and_the_ca_file(secure_kafka, tmp_path, rogue_ca):
    raw = setup(secure_kafka, tmp_path)
    raw["kafka"]["client"]["ssl.ca.location"] = rogue_ca
    line = run_refused(secure_kafka, tmp_path, raw)
    assert line.startswith("TLS with 127.0.0.1:") and "certificate is not trusted" in line, line
    assert "certificate verify failed" in line and rogue_ca in line, line


@pytest.mark.parametrize("role", ["features", "labels"])
def test_no_read_on_an_input_topic(secure_kafka, tmp_path, role):
    raw = setup(secure_kafka, tmp_path)
    topic = raw["topics"][role]
    line = run_refused(secure_kafka, tmp_path, raw, leave_out=[(topic, "Read")])
    assert f"user 'worker' (SCRAM-SHA-512) may not Read topic '{topic}'" in line, line


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_no_read_on_the_group(secure_kafka, tmp_path, exactly_once):
    raw = setup(secure_kafka, tmp_path, exactly_once=exactly_once)
    group = raw["kafka"]["group_id"]
    line = run_refused(secure_kafka, tmp_path, raw, leave_out=[(group, "Read")])
    assert f"may not Read group '{group}'" in line, line


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
@pytest.mark.parametrize("describe", [False, True], ids=["nothing", "Describe granted"])
def test_no_write_on_the_predictions_topic(secure_kafka, tmp_path, exactly_once, describe):
    """Without Describe the start-up probe sees it; with Describe only writing does (the transaction, or the
    producer)."""
    raw = setup(secure_kafka, tmp_path, exactly_once=exactly_once)
    topic = raw["topics"]["predictions"]
    add = [required_acls.Acl("topic", topic, "Describe")] if describe else []
    line = run_refused(secure_kafka, tmp_path, raw, leave_out=[(topic, "Write")], add=add)
    assert f"may not Write topic '{topic}'" in line, line


def test_no_write_on_the_transactional_id(secure_kafka, tmp_path):
    raw = setup(secure_kafka, tmp_path, exactly_once=True)
    txn = config_from_dict(raw).transactional_id
    line = run_refused(secure_kafka, tmp_path, raw, leave_out=[(txn, "Write")])
    assert f"may not Write transactional id '{txn}'" in line, line


def test_no_create_for_a_topic_the_worker_must_create(secure_kafka, tmp_path):
    raw = setup(secure_kafka, tmp_path, create=True)
    topic = raw["topics"]["predictions"]
    line = run_refused(secure_kafka, tmp_path, raw, leave_out=[(topic, "Create")])
    assert f"may not Create topic '{topic}'" in line, line


def test_produce_with_a_wrong_password_exits_6_in_one_line(secure_kafka, tmp_path):
    raw = setup(secure_kafka, tmp_path)
    raw["kafka"]["client"] = secure_kafka.client("producer", password="not-the-password")
    config = write_config(raw, tmp_path / "producer.yaml")
    r = subprocess.run(
        [str(IOLSTREAM), "produce", "-c", str(config), "--dataset", "wine", "--rows", "5", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == EXIT_ACCESS, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("iolstream produce: error:")]
    assert len(errors) == 1 and "authentication failed" in errors[0] and "'producer'" in errors[0], r.stderr[
        -3000:
    ]
    assert "not-the-password" not in r.stderr


def test_produce_without_write_names_the_topic(secure_kafka, tmp_path):
    raw = setup(secure_kafka, tmp_path)
    features, labels = secure_kafka.topics("features", "labels")
    raw["topics"].update(features=features, labels=labels)
    secure_kafka.grant([required_acls.Acl("topic", labels, "Write")], "producer")  # not features
    raw["kafka"]["client"] = secure_kafka.client("producer")
    config = write_config(raw, tmp_path / "producer.yaml")
    r = subprocess.run(
        [str(IOLSTREAM), "produce", "-c", str(config), "--dataset", "wine", "--rows", "5", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == EXIT_ACCESS, r.stderr[-3000:]
    assert f"may not Write topic '{features}'" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("create", [False, True], ids=["topics exist", "topics.create"])
def test_check_names_each_missing_acl_of_the_workers_list(secure_kafka, tmp_path, create):
    """Every ACL of ``iolstream acls`` for an exactly-once worker, left out in turn (fresh topics, group and
    transactional id each time): ``check`` names its operation and resource and exits 6, but for
    DescribeConfigs, which the worker can run without (a warning, exit 0). With ``topics.create`` on and the
    topics not there yet, the ACLs left out are the Creates."""

    def fresh() -> dict:
        roles = ("features", "labels", "predictions", "dead_letters")
        if create:
            tag = uuid.uuid4().hex[:8]
            names = [f"s-{tag}-{role}" for role in roles]  # not created
        else:
            names = secure_kafka.topics(*roles)
        raw = worker_raw(secure_kafka, dict(zip(roles, names)), tmp_path / "snap")
        raw["durability"] = {"exactly_once": True}
        raw["topics"]["create"] = create
        return raw

    count = len(required_acls.worker_acls(config_from_dict(fresh())))
    checked = 0
    for i in range(count):
        raw = fresh()
        want = required_acls.worker_acls(config_from_dict(raw))
        left = want[i]
        if create and left.operation != "Create":
            continue
        secure_kafka.grant(want[:i] + want[i + 1 :], "worker")
        code, out = check(write_config(raw, tmp_path / f"check-{i}.yaml"))
        kind = {"transactional-id": "transactional id"}.get(left.resource, left.resource)
        named = f"may not {left.operation} {kind} '{left.name}'"
        status = "warn" if left.operation == "DescribeConfigs" else "FAIL"
        assert any(c.startswith(status) and named in c for c in out.splitlines()), (left, out)
        assert code == (0 if status == "warn" else EXIT_ACCESS), (left, out)
        checked += 1
    assert checked == (4 if create else count)
