"""The worker's ACLs: derived from its config setting by setting, rendered as kafka-acls lines and AclBindings,
printed by ``iolstream acls``, and shown in docs/operations.md exactly as the code renders them."""

from __future__ import annotations

import re
from pathlib import Path

from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from iolstream.kafka import required_acls
from iolstream.kafka.config import config_from_dict, load_config
from iolstream.tools import cli

REPO = Path(__file__).resolve().parents[2]


def cfg(**sections):
    raw = {
        "model": {"n_inputs": 2, "classes": [0, 1]},
        "kafka": {"group_id": "g"},
        "topics": {"create": False},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return config_from_dict(raw, environ={})


def as_tuples(acl_list):
    return {(a.resource, a.name, a.operation, a.pattern) for a in acl_list}


def test_each_setting_adds_what_it_uses():
    base = as_tuples(required_acls.worker_acls(cfg()))
    assert base == {
        ("topic", "iol.features", "Read", "literal"),
        ("topic", "iol.labels", "Read", "literal"),
        ("group", "g", "Read", "literal"),
        ("topic", "iol.predictions", "Write", "literal"),
        ("topic", "iol.dead-letters", "Write", "literal"),
        ("topic", "iol.predictions", "DescribeConfigs", "literal"),
        ("topic", "iol.dead-letters", "DescribeConfigs", "literal"),
    }
    eos = as_tuples(required_acls.worker_acls(cfg(durability={"exactly_once": True}))) - base
    assert eos == {("transactional-id", "g-worker", "Write", "literal")}
    named = (
        as_tuples(required_acls.worker_acls(cfg(durability={"exactly_once": True, "transactional_id": "t1"})))
        - base
    )
    assert named == {("transactional-id", "t1", "Write", "literal")}
    group = as_tuples(
        required_acls.worker_acls(
            cfg(group={"enabled": True, "member_id": "a"}, durability={"exactly_once": True})
        )
    )
    assert group - base == {
        ("topic", "iol.model-deltas", "Read", "literal"),
        ("topic", "iol.model-deltas", "Write", "literal"),
        ("group", "g.deltas.", "Read", "prefixed"),
        ("transactional-id", "g-", "Write", "prefixed"),
    }
    create = as_tuples(required_acls.worker_acls(cfg(topics={"create": True}))) - base
    assert create == {
        ("topic", t, "Create", "literal")
        for t in ("iol.features", "iol.labels", "iol.predictions", "iol.dead-letters")
    }


def test_kafka_acls_lines_and_bindings_say_the_same():
    wanted = [
        required_acls.Acl("topic", "t", "DescribeConfigs"),
        required_acls.Acl("group", "g.deltas.", "Read", "prefixed"),
    ]
    assert required_acls.kafka_acls_lines(
        wanted, "User:w", bootstrap="b:1", command_config="a.properties"
    ) == [
        "kafka-acls.sh --bootstrap-server b:1 --command-config a.properties --add --allow-principal User:w "
        "--operation DescribeConfigs --topic t",
        "kafka-acls.sh --bootstrap-server b:1 --command-config a.properties --add --allow-principal User:w "
        "--operation Read --group g.deltas. --resource-pattern-type prefixed",
    ]
    first, second = required_acls.acl_bindings(wanted, "User:w")
    assert (first.restype, first.name, first.operation) == (
        ResourceType.TOPIC,
        "t",
        AclOperation.DESCRIBE_CONFIGS,
    )
    assert (second.restype, second.resource_pattern_type) == (
        ResourceType.GROUP,
        ResourcePatternType.PREFIXED,
    )
    assert second.principal == "User:w"


def test_the_docs_show_what_the_code_renders():
    doc = (REPO / "docs" / "operations.md").read_text()
    shown = re.search(r"<!-- acls:begin[^\n]*-->\n(.*?)<!-- acls:end -->", doc, re.S)
    assert shown, "docs/operations.md: no <!-- acls:begin --> ... <!-- acls:end --> block"
    rendered = required_acls.render_markdown(load_config(REPO / "config" / "secure-example.yaml", environ={}))
    assert shown.group(1) == rendered, (
        "docs/operations.md's ACL block is stale: paste render_markdown's output"
    )


def test_iolstream_acls_prints_the_lines_for_a_config(capsys, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(
        "model: {n_inputs: 2, classes: [0, 1]}\n"
        "kafka: {bootstrap_servers: 'b:9093', group_id: g, client: {sasl.username: svc}}\n"
        "topics: {create: false}\ndurability: {exactly_once: true}\n"
    )
    assert cli.main(["acls", "-c", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == required_acls.kafka_acls_lines(
        required_acls.worker_acls(load_config(path, environ={})), "User:svc", bootstrap="b:9093"
    )
    assert cli.main(["acls", "-c", str(path), "--producer", "--principal", "User:p", "--create-topics"]) == 0
    out = capsys.readouterr().out
    assert out.count("--allow-principal User:p") == 4 and "--operation Create --topic iol.labels" in out
    assert cli.main(["acls", "-c", str(path), "--principal", "nobody"]) == 2
