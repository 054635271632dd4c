"""config/worker.yaml documents every key with its default, and the loader refuses what a newcomer gets
wrong silently otherwise: classes with n_outputs, an environment variable that looks like an override but
names no key (no broker needed)."""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from iolstream.core.model import ModelConfig
from iolstream.kafka import config as config_module
from iolstream.kafka.config import ConfigError, check_environment, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[2]
WORKER_YAML = REPO / "config" / "worker.yaml"
SECTIONS = {"model": ModelConfig, **config_module._SECTIONS}
# keys whose value in worker.yaml is an example, not the default: the model of the data set it is set up for
EXAMPLES = {("model", "n_inputs"), ("model", "classes")}
BASE = {"model": {"n_inputs": 3, "classes": ["a", "b"]}}
MISTAKES = {"IOLSTREAM_STREAM_BATCH_ROWS"}  # the docs' example of a mistyped override
# the project's own variables (tests, scripts, containers): not configuration overrides, never refused
OTHER_VARIABLES = frozenset(
    {
        "IOLSTREAM_CONTAINER_STATE",
        "IOLSTREAM_CONTAINER_TEST",
        "IOLSTREAM_CRASH_AT",
        "IOLSTREAM_IMAGE",
        "IOLSTREAM_INSTALL_SYSTEM",
        "IOLSTREAM_KAFKA_CACHE",
        "IOLSTREAM_KAFKA_CLUSTER_DATA",
        "IOLSTREAM_KAFKA_DATA",
        "IOLSTREAM_KAFKA_IMAGE",
        "IOLSTREAM_PROMETHEUS_IMAGE",
        "IOLSTREAM_TEST_BOOTSTRAP",
        "IOLSTREAM_TEST_CLUSTER_PORT",
        "IOLSTREAM_TEST_DOCKER",
        "IOLSTREAM_TEST_KAFKA_IMAGE",
        "IOLSTREAM_TEST_OUTAGE_PORT",
        "IOLSTREAM_TEST_RESTART_PORT",
        "IOLSTREAM_TEST_SECURE_DATA",
        "IOLSTREAM_TEST_SECURE_PORT",
        "IOLSTREAM_TEST_SEED",
        "IOLSTREAM_TEST_STARTUP_SECONDS",
    }
)


def documented_keys() -> dict[str, dict[str, object]]:
    """{section: {key: value}} of worker.yaml, with the keys shown commented out (``  # n_outputs: 1``)."""
    raw = yaml.safe_load(WORKER_YAML.read_text())
    keys = {name: dict(raw.get(name) or {}) for name in raw}
    section = None
    for line in WORKER_YAML.read_text().splitlines():
        if m := re.match(r"^(\w+):", line):
            section = m.group(1)
        elif section and (m := re.match(r"^  # (\w+): (\S+)", line)):
            keys[section].setdefault(m.group(1), yaml.safe_load(m.group(2)))
    return keys


def default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def test_worker_yaml_lists_every_key_and_no_other():
    keys = documented_keys()
    assert set(keys) == set(SECTIONS), "sections"
    for name, cls in SECTIONS.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(keys[name]) - fields == set(), f"{name}: keys worker.yaml shows that the config has not"
        assert fields - set(keys[name]) == set(), f"{name}: keys of the config worker.yaml does not show"


def test_worker_yaml_shows_the_defaults():
    keys = documented_keys()
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if (name, f.name) in EXAMPLES:
                continue
            shown, want = keys[name][f.name], default(f)
            if isinstance(want, tuple):
                want = list(want)
            assert shown == want, f"{name}.{f.name}: worker.yaml shows {shown!r}, the default is {want!r}"


def test_worker_yaml_loads_and_lam_mentions_auto():
    cfg = load_config(WORKER_YAML, environ={})
    assert cfg.model.task == "classification"
    lam_comment = next(
        line for line in WORKER_YAML.read_text().splitlines() if line.strip().startswith("lam:")
    )
    assert "auto" in lam_comment


def test_classes_with_n_outputs_is_refused():
    raw = {"model": {"n_inputs": 3, "classes": ["a", "b"], "n_outputs": 2}}
    with pytest.raises(ConfigError, match=r"model\.n_outputs: not with model\.classes"):
        config_from_dict(raw, {})
    with pytest.raises(ConfigError, match=r"model\.n_outputs: not with model\.classes"):
        config_from_dict(BASE, {"IOLSTREAM_MODEL__N_OUTPUTS": "1"})
    assert config_from_dict({"model": {"n_inputs": 3, "n_outputs": 2}}, {}).model.m == 2


@pytest.mark.parametrize(
    "name,nearest",
    [
        ("IOLSTREAM_STREAM_BATCH_ROWS", "IOLSTREAM_STREAM__BATCH_ROWS"),
        ("IOLSTREAM_STREAM__BATCH_ROW", "IOLSTREAM_STREAM__BATCH_ROWS"),
        ("IOLSTREAM_KAFKA_BOOTSTRAP_SERVERS", "IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS"),
        ("IOLSTREAM_MODEL__FORGET", "IOLSTREAM_MODEL__FORGETTING"),
        ("IOLSTREAM_METRIC__PORT", "IOLSTREAM_METRICS__PORT"),
    ],
)
def test_a_mistyped_override_stops_with_the_nearest_name(name, nearest):
    with pytest.raises(ConfigError, match=rf"{name}: names no configuration key; did you mean {nearest}\?"):
        config_from_dict(BASE, {name: "1"})


def test_valid_overrides_free_mappings_and_the_projects_other_variables_pass():
    env = {
        "IOLSTREAM_STREAM__BATCH_ROWS": "64",
        "IOLSTREAM_KAFKA__CLIENT__SECURITY.PROTOCOL": "SSL",
        "IOLSTREAM_SOMETHING_ELSE": "x",  # not shaped like an override: not ours to judge
        **{name: "x" for name in OTHER_VARIABLES},
    }
    cfg = config_from_dict(BASE, env)
    assert cfg.stream.batch_rows == 64 and cfg.kafka.client == {"security.protocol": "SSL"}


@pytest.mark.parametrize(
    "name,refused",
    [
        ("IOLSTREAM_METRICS_PORT", "IOLSTREAM_METRICS__PORT"),  # a section, one underscore, a key
        ("IOLSTREAM_GROUP_ENABLE", "IOLSTREAM_GROUP__ENABLED"),  # ... a name close to a key
        ("IOLSTREAM_KAFKA_JARS", None),  # a section's name before a name of one's own: not an override
        ("IOLSTREAM_MODELS_DIR", None),
    ],
)
def test_a_single_underscore_is_an_override_only_before_a_key(name, refused):
    """Only a name that reads as an override with one underscore too few is refused; the worker needs no list of
    the project's (or a team's) own IOLSTREAM_ variables to leave them alone."""
    if refused is None:
        check_environment({name: "x"})
        return
    with pytest.raises(ConfigError, match=rf"{name}: names no configuration key; did you mean {refused}\?"):
        check_environment({name: "x"})


def test_the_list_of_other_variables_is_the_repositorys():
    """Every IOLSTREAM_ name the repository uses that is not an override is in OTHER_VARIABLES (which
    ``test_valid_overrides_free_mappings_and_the_projects_other_variables_pass`` runs past the worker's check),
    and the list names no variable the repository does not use."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    used = set()
    for rel in files:
        path = REPO / rel
        if path.suffix in {".png", ".iolsnap", ".csv", ".gz"} or not path.is_file() or path == Path(__file__):
            continue
        used |= set(re.findall(r"IOLSTREAM_[A-Z0-9_]+", path.read_text(errors="replace")))
    others = {name for name in used if "__" not in name} - MISTAKES
    assert others == set(OTHER_VARIABLES), (others - OTHER_VARIABLES, OTHER_VARIABLES - others)


def test_the_named_fields_example_of_the_configuration_page_loads():
    """docs/configuration.md's worked example: the schema and events sections load, and its width is the one
    the page states."""
    text = (REPO / "docs" / "configuration.md").read_text()
    block = (
        text.split("## Named fields: the feature schema", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    )
    cfg = config_from_dict(yaml.safe_load(block), environ={})
    assert cfg.model.n_inputs == 79 and "79 inputs" in text
    assert cfg.events.id_field == "order_id" and cfg.events.passthrough == ("country",)
