"""``iolstream seed`` and the snapshot API: a seed is the offline fit of the CSV in batches of
stream.batch_rows (warm-up scaler included), ``load_snapshot`` and ``from_snapshot`` give it back for batch
scoring, and a worker resumed from the seed predicts its first rows as that model does (real broker)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import orjson
import pytest
import yaml
from numpy.testing import assert_allclose

import iolstream
from iolstream.core.model import EdRVFL
from iolstream.core.snapshot_file import SnapshotError
from iolstream.estimators import EdRVFLClassifier, EdRVFLRegressor
from iolstream.kafka.config import load_config
from iolstream.tools.cli import main

N_ROWS, BATCH = 300, 32


def data(n=N_ROWS, k=4, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, k)) * [1.0, 3.0, 0.5, 2.0][:k] + [0.0, 5.0, -1.0, 2.0][:k]
    score = X @ rng.standard_normal(k)
    y = (
        score + 0.1 * rng.standard_normal(n)
        if regression
        else np.where(score > np.median(score), "up", "down")
    )
    return X, y


def write(tmp_path, X, y, *, model=None, **sections):
    header = ",".join(f"x{j}" for j in range(X.shape[1])) + ",label"
    rows = [",".join(repr(float(v)) for v in x) + f",{t}" for x, t in zip(X, y)]
    csv = tmp_path / "history.csv"
    csv.write_text("\n".join([header, *rows]) + "\n")
    raw = {
        "model": {
            "n_inputs": X.shape[1],
            "classes": ["down", "up"],
            "n_nodes": 24,
            "warmup_rows": 64,
            **(model or {}),
        },
        "stream": {"batch_rows": BATCH},
        "metrics": {"port": 0},
        "snapshot": {"dir": str(tmp_path / "snapshots")},
        **sections,
    }
    cfg = tmp_path / "worker.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return str(cfg), str(csv)


def offline(cfg_path, X, y) -> EdRVFL:
    """The model fitted offline: the warm-up scaler on the first warmup_rows rows, then batch by batch each
    batch observed (-F: its Gram in) and its labels learned."""
    model = EdRVFL(load_config(cfg_path, environ={}).model)
    if model.config.scaler == "warmup":
        model.scaler.partial_fit(X[: model.config.warmup_rows])
        model.scaler.freeze()
    for start in range(0, len(X), BATCH):
        pred = model.observe(X[start : start + BATCH])
        model.learn(
            pred.features_t, model.encode_labels(y[start : start + BATCH]), predicted=pred.layer_outputs
        )
    return model


@pytest.mark.parametrize("mode", ["forward", "ridge"])
@pytest.mark.parametrize("scaler", ["warmup", "none"])
def test_a_seed_is_the_offline_fit(tmp_path, capsys, mode, scaler):
    X, y = data()
    cfg, csv = write(tmp_path, X, y, model={"mode": mode, "scaler": scaler})
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 0
    assert "seeded" in capsys.readouterr().out
    seeded, reference = iolstream.load_snapshot(tmp_path / "snapshots"), offline(cfg, X, y)
    X_new, _ = data(50, seed=1)
    assert seeded.version == reference.version
    assert_allclose(
        seeded.predict_batch(X_new).proba, reference.predict_batch(X_new).proba, rtol=1e-9, atol=1e-12
    )


def test_the_estimators_round_trip_a_snapshot(tmp_path):
    X, y = data()
    cfg, csv = write(tmp_path, X, y)
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 0
    snap_file = sorted((tmp_path / "snapshots").glob("snap-*.iolsnap"))[-1]
    model = iolstream.load_snapshot(snap_file)  # a file, as a directory gives its newest
    clf = EdRVFLClassifier.from_snapshot(tmp_path / "snapshots")
    X_new, _ = data(40, seed=2)
    assert list(clf.classes_) == ["down", "up"] and clf.n_features_in_ == 4
    assert (clf.predict(X_new) == model.predict(X_new)).all()
    assert_allclose(clf.predict_proba(X_new), model.predict_batch(X_new).proba)
    assert clf.score(X, y) > 0.8
    with pytest.raises(ValueError, match="holds a classification model; use EdRVFLClassifier"):
        EdRVFLRegressor.from_snapshot(snap_file)


def test_a_regression_seed_round_trips(tmp_path):
    X, y = data(regression=True)
    cfg, csv = write(tmp_path, X, y, model={"classes": None, "n_outputs": 1})
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 0
    reg = EdRVFLRegressor.from_snapshot(tmp_path / "snapshots")
    model = iolstream.load_snapshot(tmp_path / "snapshots")
    assert reg.predict(X[:10]).shape == (10,)
    assert_allclose(reg.predict(X[:10]), model.predict(X[:10]))
    assert reg.score(X, y) > 0.5


def test_a_seed_shorter_than_the_warm_up_fixes_the_scaling_from_its_rows(tmp_path, capsys):
    """40 rows, warmup_rows 64: the seed is the offline fit with the scaler on those 40 (``offline`` takes the
    first 64, here all), every row learned; the worker resumed from it holds nothing for a warm-up, so it never
    predicts (and emits) the seed's rows, and predicts its own first batch at once."""
    from iolstream.core.snapshot_file import load_newest
    from iolstream.kafka.resume import restored

    X, y = data(40)
    cfg_path, csv = write(tmp_path, X, y, model={"mode": "forward"})
    assert main(["seed", "-c", cfg_path, "--csv", csv, "--target", "label"]) == 0
    out = capsys.readouterr()
    assert "40 learned" in out.out and "the input scaling is fixed from these 40" in out.err
    seeded, reference = iolstream.load_snapshot(tmp_path / "snapshots"), offline(cfg_path, X, y)
    X_new, _ = data(BATCH, seed=1)
    assert_allclose(
        seeded.predict_batch(X_new).proba, reference.predict_batch(X_new).proba, rtol=1e-9, atol=1e-12
    )
    cfg = load_config(cfg_path, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"})
    proc = restored(cfg, load_newest(tmp_path / "snapshots"), None).processor
    assert proc.model.ready and not proc.held
    message = orjson.dumps({"ids": [f"s{i}" for i in range(BATCH)], "x": X_new[:BATCH].tolist()})
    assert proc.on_features(message, None, 0, b"s0") == []
    assert proc.step(0).predictions is not None  # a full batch: predicted at once, no warm-up to wait for
    (tmp_path / "one.csv").write_text("x0,x1,x2,x3,label\n1,2,3,4,up\n")
    assert (
        main(["seed", "-c", cfg_path, "--csv", str(tmp_path / "one.csv"), "--target", "label", "--replace"])
        == 2
    )
    assert "1 rows: a seed needs at least 2 to fix the input scaling" in capsys.readouterr().err


def test_a_worker_resumes_from_a_seed_of_three_classes(tmp_path, capsys):
    """The seed's prequential metric starts empty with the model's classes: seeded with two (its shape by
    default), a three-class worker could not restore it ("cannot reshape array of size 4 into shape (3,3)")."""
    from iolstream.core.snapshot_file import load_newest
    from iolstream.kafka.resume import restored

    X, y = data()
    y = np.where(X[:, 0] > 0.5, "flat", y)
    cfg_path, csv = write(tmp_path, X, y, model={"classes": ["down", "flat", "up"]})
    assert main(["seed", "-c", cfg_path, "--csv", csv, "--target", "label"]) == 0
    cfg = load_config(cfg_path, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"})
    loaded = restored(cfg, load_newest(tmp_path / "snapshots"), None)
    assert loaded.processor.metric.confusion.shape == (3, 3) and loaded.processor.metric.n == 0
    assert loaded.processor.model.version == iolstream.load_snapshot(tmp_path / "snapshots").version > 0


def test_seed_refusals_are_one_line_exit_2(tmp_path, capsys):
    X, y = data()
    cfg, csv = write(tmp_path, X, y)
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 0
    capsys.readouterr()
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 2
    assert "already holds snapshots" in capsys.readouterr().err
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label", "--replace"]) == 0
    assert len(list((tmp_path / "snapshots").glob("snap-*.iolsnap"))) == 2
    wide, _ = data(k=3)
    other = tmp_path / "other"
    other.mkdir()
    cfg3, csv3 = write(other, wide, y, model={"n_inputs": 4})
    assert main(["seed", "-c", cfg3, "--csv", csv3, "--target", "label"]) == 2
    assert "3 features per row, model.n_inputs is 4" in capsys.readouterr().err


def test_load_snapshot_names_what_is_missing(tmp_path):
    with pytest.raises(SnapshotError, match="no snapshot"):
        iolstream.load_snapshot(tmp_path)
    with pytest.raises(SnapshotError, match="no such snapshot file"):
        iolstream.load_snapshot(tmp_path / "nothing.iolsnap")
    (tmp_path / "snap-000000000001.iolsnap").write_bytes(b"IOLSNAP\n garbage")
    with pytest.raises(SnapshotError):
        iolstream.load_snapshot(tmp_path / "snap-000000000001.iolsnap")


@pytest.mark.kafka
def test_a_seeded_worker_predicts_its_first_rows_as_the_offline_model(
    tmp_path, kafka_bootstrap, kafka_topics
):
    from kafka_util import consume_all, produce_json, unique_group

    X, y = data()
    names = kafka_topics("f", "l", "p", "d")
    topics = dict(zip(["features", "labels", "predictions", "dead_letters"], names))
    cfg, csv = write(
        tmp_path,
        X,
        y,
        model={"mode": "ridge"},
        topics=topics,
        kafka={"bootstrap_servers": kafka_bootstrap, "group_id": unique_group("seed")},
    )
    assert main(["seed", "-c", cfg, "--csv", csv, "--target", "label"]) == 0
    model = iolstream.load_snapshot(tmp_path / "snapshots")
    X_new, _ = data(40, seed=3)
    ids = [f"new-{i}" for i in range(len(X_new))]
    produce_json(kafka_bootstrap, names[0], [{"id": i, "x": x} for i, x in zip(ids, X_new.tolist())], key=ids)
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOLSTREAM_")}
    run = subprocess.run(
        [sys.executable, "-m", "iolstream", "run", "-c", cfg, "--stop-at-end", "--max-seconds", "90"],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "loaded snapshot snap-000000000001.iolsnap" in run.stderr
    got = {
        orjson.loads(v)["id"]: orjson.loads(v)
        for _, v, *_ in consume_all(kafka_bootstrap, names[2], expected=40)
    }
    assert sorted(got) == sorted(ids)
    want = model.predict_batch(X_new)  # -R: every row predicted with the seed's β (no label came)
    proba = np.array([got[i]["proba"] for i in ids])
    assert_allclose(proba, want.proba, rtol=1e-9, atol=1e-12)
    assert [got[i]["y_hat"] for i in ids] == list(model.predict(X_new))


def test_a_default_spelled_out_resumes_the_same_model(tmp_path, capsys):
    """ensemble: softmax is what ensemble: null means for classes: a worker whose config spells it out resumes
    the snapshot (it was refused, "model.ensemble (None there, 'softmax' here)"); vote is another model."""
    import dataclasses

    from iolstream.core.snapshot_file import load_newest
    from iolstream.kafka.resume import mismatch

    X, y = data()
    cfg_path, csv = write(tmp_path, X, y)
    assert main(["seed", "-c", cfg_path, "--csv", csv, "--target", "label"]) == 0
    cfg = load_config(cfg_path, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"})
    snap = load_newest(tmp_path / "snapshots")
    assert cfg.model.ensemble is None and mismatch(cfg, snap) is None
    spelled = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, ensemble="softmax"))
    assert mismatch(spelled, snap) is None
    vote = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, ensemble="vote"))
    assert "model.ensemble ('softmax' there, 'vote' here)" in mismatch(vote, snap)
