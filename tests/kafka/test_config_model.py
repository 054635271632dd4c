"""The worker's model section: forgetting and lam auto load from YAML and from IOLSTREAM_MODEL__* variables,
and bad values are refused naming the key (no broker needed)."""

from __future__ import annotations

import pytest

from iolstream.kafka.config import ConfigError, config_from_dict, load_config

BASE = {"model": {"n_inputs": 3, "classes": ["a", "b"]}}


@pytest.mark.parametrize(
    "env,lam,forgetting,candidates",  # candidates: λ × half-life × 2 modes (mode: auto, the default: -F and -R)
    [
        ({"IOLSTREAM_MODEL__FORGETTING": "auto"}, 0.5, "auto", 6),
        ({"IOLSTREAM_MODEL__FORGETTING": "AUTO", "IOLSTREAM_MODEL__LAM": "auto"}, "auto", "auto", 18),
        ({"IOLSTREAM_MODEL__FORGETTING": "2048", "IOLSTREAM_MODEL__LAM": "Auto"}, "auto", 2048, 6),
        ({"IOLSTREAM_MODEL__FORGETTING": "1e4"}, 0.5, 1e4, 2),
        ({"IOLSTREAM_MODEL__FORGETTING": "null"}, 0.5, None, 2),
        ({"IOLSTREAM_MODEL__FORGETTING": "off"}, 0.5, None, 2),
        ({}, 0.5, None, 2),
        ({"IOLSTREAM_MODEL__MODE": "forward", "IOLSTREAM_MODEL__LAM": "auto"}, "auto", None, 3),
    ],
)
def test_forgetting_and_lam_from_the_environment(env, lam, forgetting, candidates):
    model = config_from_dict(BASE, env).model
    assert (model.lam, model.forgetting, len(model.candidates)) == (lam, forgetting, candidates)


def test_forgetting_and_lam_from_yaml(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text("model:\n  n_inputs: 4\n  n_outputs: 1\n  lam: auto\n  forgetting: 16384\n")
    model = load_config(path, environ={}).model
    assert (model.lam, model.forgetting, model.task) == ("auto", 16384, "regression")
    overridden = load_config(path, environ={"IOLSTREAM_MODEL__FORGETTING": "auto"}).model
    assert overridden.forgetting == "auto" and len(overridden.candidates) == 18


@pytest.mark.parametrize(
    "env,match",
    [
        ({"IOLSTREAM_MODEL__FORGETTING": "-3"}, r"model\.forgetting: must be null \(never forget\), auto"),
        ({"IOLSTREAM_MODEL__FORGETTING": "yes"}, r"model\.forgetting: .* got True"),
        ({"IOLSTREAM_MODEL__FORGETTING": "automatic"}, r"model\.forgetting: .* got 'automatic'"),
        ({"IOLSTREAM_MODEL__LAM": "automatic"}, r"model\.lam: must be .* or auto"),
        ({"IOLSTREAM_MODEL__FORGETTING": "auto", "IOLSTREAM_MODEL__SOLVER": "woodbury"}, r"model\.solver"),
    ],
)
def test_bad_values_name_the_key(env, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict(BASE, env)


def test_class_weight_threshold_and_primary_from_yaml(tmp_path):
    path = tmp_path / "worker.yaml"
    path.write_text(
        "model:\n  n_inputs: 4\n  classes: [ok, fraud]\n  class_weight: {fraud: 20}\n  threshold: 0.3\n"
        "metrics:\n  primary: roc_auc\nstream:\n  emit_scores: true\n"
    )
    cfg = load_config(path, environ={})
    assert cfg.model.class_weight == (1.0, 20.0) and cfg.model.threshold == 0.3
    assert cfg.metrics.primary == "roc_auc" and cfg.stream.emit_scores
    env = {"IOLSTREAM_MODEL__CLASS_WEIGHT": "balanced", "IOLSTREAM_METRICS__PRIMARY": "log_loss"}
    cfg = load_config(path, environ=env)
    assert cfg.model.class_weight == "balanced" and cfg.metrics.primary == "log_loss"


@pytest.mark.parametrize(
    "raw,key",
    [
        (
            {"model": {"n_inputs": 3, "classes": ["a", "b", "c"]}, "metrics": {"primary": "roc_auc"}},
            "metrics.primary",
        ),
        ({"model": {"n_inputs": 3, "n_outputs": 1}, "metrics": {"primary": "log_loss"}}, "metrics.primary"),
        ({"model": {"n_inputs": 3, "classes": ["a", "b"]}, "metrics": {"primary": "f1"}}, "metrics.primary"),
        ({"model": {"n_inputs": 3, "classes": ["a", "b"], "class_weight": {"c": 2}}}, "model.class_weight"),
        ({"model": {"n_inputs": 3, "classes": ["a", "b"], "threshold": 1.5}}, "model.threshold"),
        ({"model": {"n_inputs": 3, "classes": ["a", "b"], "calibration": "isotonic"}}, "model.calibration"),
    ],
)
def test_bad_probability_settings_are_refused_naming_the_key(raw, key):
    with pytest.raises(ConfigError, match=key):
        config_from_dict(raw, {})
