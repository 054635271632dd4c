"""The snapshot store (docs/design.md §6): format, checksum, atomic write, retention, fallback, inspect.

No broker needed: the worker's use of snapshots is tested on a real broker in
tests/kafka/test_durability_kafka.py.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka import snapshots as snapshot
from iolstream.kafka.errors import WorkerError
from iolstream.kafka.snapshots import SnapshotError, SnapshotStore, SnapshotVersionError, decode, encode
from iolstream.ops import faults
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor
from iolstream.tools import cli

SEED = 7


def sample(seed: int = SEED) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    manifest = {
        "offsets": [["t.features", 0, 12], ["t.labels", 0, 9]],
        "note": "é✓",
        "nested": {"a": [1, 2.5, None]},
    }
    arrays = {
        "a": rng.normal(size=(5, 4)),
        "ints": np.arange(7, dtype=np.int64),
        "ids": np.array(["r1", "r22", "ünï"]),
        "empty": np.empty((0, 3)),
        "scalar": np.array(True),
    }
    return manifest, arrays


def test_encode_decode_round_trip():
    manifest, arrays = sample()
    got_manifest, got_arrays = decode(encode(manifest, arrays))
    assert got_manifest == manifest
    assert set(got_arrays) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(got_arrays[name], value, err_msg=name)
        assert got_arrays[name].dtype == value.dtype


def test_object_arrays_are_refused_when_written():
    with pytest.raises(TypeError, match="object dtype"):
        encode({}, {"bad": np.array([{"x": 1}], dtype=object)})


@pytest.mark.parametrize("cut", [0, 10, snapshot.HEADER.size, snapshot.HEADER.size + 1, -1, "half"])
def test_truncated_snapshot_is_detected(cut):
    blob = encode(*sample())
    end = len(blob) // 2 if cut == "half" else cut
    with pytest.raises(SnapshotError, match="truncated"):
        decode(blob[:end])


@pytest.mark.parametrize("where", ["digest", "body-start", "body-middle", "body-end"])
def test_flipped_bit_is_detected(where):
    blob = bytearray(encode(*sample()))
    at = {
        "digest": 20,
        "body-start": snapshot.HEADER.size,
        "body-middle": len(blob) // 2,
        "body-end": len(blob) - 1,
    }[where]
    blob[at] ^= 0x04
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        decode(bytes(blob))


def test_bad_magic_and_other_versions_are_named():
    blob = encode(*sample())
    with pytest.raises(SnapshotError, match="bad magic"):
        decode(b"NOTASNAP" + blob[8:])
    newer = snapshot.HEADER.pack(snapshot.MAGIC, snapshot.FORMAT_VERSION + 1, blob[12:44]) + blob[44:]
    with pytest.raises(SnapshotVersionError, match=f"format version {snapshot.FORMAT_VERSION + 1}"):
        decode(newer)


def test_a_valid_checksum_over_a_pickled_archive_is_refused():
    """The body is read with allow_pickle=False: nothing in a snapshot can run code."""
    import hashlib
    import io

    buf = io.BytesIO()
    np.savez(buf, __manifest__=np.frombuffer(b"{}", dtype=np.uint8), evil=np.array([object()], dtype=object))
    body = buf.getvalue()
    blob = snapshot.HEADER.pack(snapshot.MAGIC, snapshot.FORMAT_VERSION, hashlib.sha256(body).digest()) + body
    with pytest.raises(SnapshotError, match="unreadable archive"):
        decode(blob)


def test_store_keeps_the_newest_k_and_numbers_them_in_order(tmp_path):
    store = SnapshotStore(tmp_path, keep=3)
    manifest, arrays = sample()
    for i in range(5):
        snap = store.write({**manifest, "i": i}, arrays)
        assert snap.size_bytes == snap.path.stat().st_size and snap.seconds > 0
    assert [p.name for p in store.paths()] == [f"snap-{s:012d}.iolsnap" for s in (5, 4, 3)]
    latest = store.load_latest()
    assert latest.manifest["i"] == 4 and latest.manifest["sequence"] == 5
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "empty", "unreadable"])
def test_load_latest_skips_a_damaged_newest_with_a_warning(tmp_path, caplog, damage):
    store = SnapshotStore(tmp_path, keep=3)
    manifest, arrays = sample()
    for i in range(3):
        store.write({**manifest, "i": i}, arrays)
    newest = store.paths()[0]
    blob = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(blob[: len(blob) - 100])
    elif damage == "bitflip":
        blob[len(blob) // 3] ^= 0x80
        newest.write_bytes(blob)
    elif damage == "empty":
        newest.write_bytes(b"")
    else:  # cannot be read at all (OSError)
        newest.unlink()
        newest.mkdir()
    with caplog.at_level(logging.WARNING, logger="iolstream.snapshot"):
        snap = store.load_latest()
    assert snap.manifest["i"] == 1
    assert f"skipping damaged snapshot {newest.name}" in caplog.text


def test_load_latest_with_every_snapshot_damaged_returns_none(tmp_path):
    store = SnapshotStore(tmp_path, keep=2)
    for i in range(2):
        store.write({"i": i}, {})
    for path in store.paths():
        path.write_bytes(b"garbage")
    assert store.load_latest() is None


def test_a_newer_format_version_stops_the_load(tmp_path):
    """Falling back past a snapshot this build cannot read would silently roll the model back."""
    store = SnapshotStore(tmp_path, keep=3)
    store.write({"i": 0}, {})
    newest = store.write({"i": 1}, {}).path
    blob = newest.read_bytes()
    newest.write_bytes(blob[:8] + (snapshot.FORMAT_VERSION + 1).to_bytes(4, "little") + blob[12:])
    with pytest.raises(SnapshotVersionError, match=newest.name):
        store.load_latest()


def test_crash_in_the_middle_of_a_write_leaves_the_previous_snapshots(tmp_path):
    """A process killed during a write leaves a partial temporary file, never a partial snapshot."""
    store = SnapshotStore(tmp_path, keep=3)
    store.write({"i": 0}, {"x": np.zeros(10_000)})
    code = (
        "import numpy as np; from iolstream.kafka.snapshots import SnapshotStore; "
        f"SnapshotStore({str(tmp_path)!r}, keep=3).write({{'i': 1}}, {{'x': np.ones(10_000)}})"
    )
    env = {**os.environ, faults.CRASH_ENV: "in_snapshot:1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == faults.CRASH_EXIT_CODE, r.stderr
    assert len(list(tmp_path.glob(".tmp-*"))) == 1 and len(store.paths()) == 1
    assert store.load_latest().manifest["i"] == 0
    assert not list(tmp_path.glob(".tmp-*")), "a stale temporary file is removed on load"


def test_fault_points_fire_at_the_chosen_hit(monkeypatch):
    monkeypatch.setenv(faults.CRASH_ENV, "a:3,b:1")
    monkeypatch.setattr(faults, "_hits", {})
    assert [faults.fault_point("a") for _ in range(4)] == [False, False, True, False]
    assert faults.fault_point("b") and not faults.fault_point("c")
    monkeypatch.delenv(faults.CRASH_ENV)
    assert not faults.fault_point("b")


def test_stream_processor_state_round_trips_through_a_snapshot(tmp_path):
    """Model, scaler, batcher, warm-up hold, join buffer and label queue, with string ids, come back equal."""
    rng = np.random.default_rng(SEED)
    model = EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1), n_nodes=16, n_layers=2, warmup_rows=20))
    proc = StreamProcessor(model, StreamConfig(batch_rows=8, label_batch_rows=5, row_ttl_ms=None))
    for i in range(6):
        x = rng.normal(size=(7, 4)).round(3).tolist()
        proc.on_features(
            json.dumps({"ids": [f"r{i}-{j}" for j in range(7)], "x": x}).encode(), ("f", 0, i), 0
        )
        proc.on_labels(
            json.dumps({"ids": [f"r{i}-{j}" for j in range(3)], "y": [0, 1, 1]}).encode(), ("l", 0, i), 0
        )
        proc.on_labels(json.dumps({"id": f"r{i + 1}-0", "y": 1}).encode(), ("l", 0, 100 + i), 0)  # early
        proc.step(0)
    manifest, arrays = proc.to_state()
    snap = SnapshotStore(tmp_path).write(manifest, arrays)
    loaded = snapshot.read(snap.path)
    again = StreamProcessor.from_state(loaded.manifest, loaded.arrays, proc.cfg)
    manifest2, arrays2 = again.to_state()
    assert set(arrays2) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(arrays2[name], value, err_msg=name)
    assert json.loads(json.dumps(manifest2)) == json.loads(json.dumps(manifest))


# ------------------------------------------------------------------------- inspect command
@pytest.fixture
def snap_dir(tmp_path):
    store = SnapshotStore(tmp_path / "snaps", keep=3)
    manifest, arrays = sample()
    manifest.update(
        config={"n_inputs": 4, "n_nodes": 16},
        counters={"rows_observed": 40},
        stream={"counters": {"rows_in": 40, "rows_learned": 30}, "dead_letters": {"malformed_json": 2}},
        worker={"exactly_once": True, "group_id": "g"},
    )
    for i in range(2):
        store.write({**manifest, "i": i}, arrays)
    return store


def test_inspect_prints_what_a_snapshot_holds(snap_dir, capsys):
    path = snap_dir.paths()[0]
    assert cli.main(["snapshot", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for text in (
        f"valid: format version {snapshot.FORMAT_VERSION}, SHA-256 checksum ok",
        "sequence   2",
        "exactly_once=True",
        "n_inputs=4",
        "rows_in=40 rows_learned=30",
        "rows_observed=40",
        "malformed_json=2",
        "t.features[0] 12",
        "t.labels[0] 9",
        "5 arrays",
        "a    ",
        "float64",
        "5×4",
        "ids",
    ):
        assert text in out, f"{text!r} not in:\n{out}"


def test_inspect_reports_damage_and_exits_1(snap_dir, capsys):
    path = snap_dir.paths()[0]
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 1
    path.write_bytes(blob)
    assert cli.main(["snapshot", "inspect", str(path)]) == 1
    assert "DAMAGED: checksum mismatch" in capsys.readouterr().out
    assert cli.main(["snapshot", "inspect", str(snap_dir.dir)]) == 0  # the directory still has a valid one
    out = capsys.readouterr().out
    assert "snap-000000000002.iolsnap" in out and "DAMAGED" in out and "sequence   1" in out


def test_inspect_json_and_errors(snap_dir, capsys, tmp_path):
    assert cli.main(["snapshot", "inspect", "--json", str(snap_dir.paths()[0])]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["valid"] and d["checksum_ok"] and d["format_version"] == snapshot.FORMAT_VERSION
    assert d["manifest"]["offsets"] == [["t.features", 0, 12], ["t.labels", 0, 9]]
    assert d["arrays"]["a"] == {"dtype": "float64", "shape": [5, 4], "bytes": 160}
    assert cli.main(["snapshot", "inspect", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "emptydir").mkdir()
    assert cli.main(["snapshot", "inspect", str(tmp_path / "emptydir")]) == 1


def test_a_worker_loads_a_snapshot_of_the_previous_version(tmp_path):
    """A version-1 snapshot (no forgetting, no target scaling in its config) restores in a worker whose
    config is the one it was made with: the comparison reads the saved config as this build spells it."""
    import shutil

    from iolstream.kafka.config import config_from_dict
    from iolstream.kafka.worker import Worker

    old = Path(__file__).parents[1] / "data" / "snapshot-before-fingerprints.iolsnap"
    (tmp_path / "snapshots").mkdir()
    shutil.copy(old, tmp_path / "snapshots" / "snap-000000000001.iolsnap")
    raw = {
        "model": {
            "n_inputs": 3,
            "classes": ["a", "b", "c"],
            "n_nodes": 8,
            "n_layers": 2,
            "scaler": "none",
            "seed": 3,
            "mode": "forward",  # the default when it was made (now auto): a deployment upgrading names it
        },
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "snapshot": {"dir": str(tmp_path / "snapshots")},
        "metrics": {"port": 0},
    }
    worker = Worker(config_from_dict(raw, environ={}))
    assert (
        worker.processor.counters["rows_in"] == 48 and worker.checkpoint.snapshot_bytes == old.stat().st_size
    )
    del raw["model"]["mode"]  # left to the default, auto since: another model, refused naming the key
    with pytest.raises(WorkerError, match="model.mode"):
        Worker(config_from_dict(raw, environ={}))
    raw["model"]["mode"] = "forward"
    raw["model"]["forgetting"] = 1000.0  # a different model: refused, naming the key
    with pytest.raises(WorkerError, match="model.forgetting"):
        Worker(config_from_dict(raw, environ={}))


def test_a_restart_may_change_the_scoring_share_and_nothing_else_of_the_model(tmp_path):
    """``model.scoring_share`` sets which batches the candidates not in force are scored on, not what the sums
    hold: a worker restarts from a snapshot made with another share and scores with its own; another λ grid
    setting is still refused. Group members may differ in it too (it is not in the model digest)."""
    from iolstream.kafka.config import config_from_dict
    from iolstream.kafka.worker import Worker
    from iolstream.stream.group import model_digest

    model_raw = {"n_inputs": 3, "classes": ["a", "b"], "n_nodes": 8, "n_layers": 2, "scaler": "none"}
    model_raw["lam"] = "auto"
    cfg = ModelConfig(**{**model_raw, "classes": ("a", "b")})
    proc = StreamProcessor(EdRVFL(cfg), StreamConfig(batch_rows=4, row_ttl_ms=None))
    rng = np.random.default_rng(5)
    for i in range(5):
        x = rng.normal(size=(4, 3)).round(3).tolist()
        proc.on_features(
            json.dumps({"ids": [f"r{i}-{j}" for j in range(4)], "x": x}).encode(), ("f", 0, i), 0
        )
        proc.on_labels(
            json.dumps({"ids": [f"r{i}-{j}" for j in range(4)], "y": ["a", "b", "a", "b"]}).encode(),
            ("l", 0, i),
            0,
        )
        proc.step(0)
    manifest, arrays = proc.to_state()
    manifest["offsets"] = []
    SnapshotStore(tmp_path / "snapshots").write(manifest, arrays)
    raw = {
        "model": {**model_raw, "scoring_share": "all"},
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "snapshot": {"dir": str(tmp_path / "snapshots")},
        "metrics": {"port": 0},
    }
    worker = Worker(config_from_dict(raw, environ={}))
    restored = worker.processor.model
    assert restored.config.scoring_share == "all" and restored.scoring.share == float("inf")
    assert worker.processor.counters["rows_in"] == 20
    assert restored.scoring.rows == proc.model.scoring.rows  # the budget's counts came back, its share is new
    assert model_digest(restored.config) == model_digest(cfg)
    raw["model"]["lam"] = 0.5
    with pytest.raises(WorkerError, match="model.lam"):
        Worker(config_from_dict(raw, environ={}))


def test_delete_older_removes_every_snapshot_before_the_named_one(tmp_path):
    """A snapshot holding the model without a forgotten row makes the older ones go (docs/design.md §13)."""
    from iolstream.kafka.snapshots import SnapshotStore

    store = SnapshotStore(tmp_path, keep=5)
    assert store.next_name() == "snap-000000000001.iolsnap"
    names = [store.write({"i": i}, {"x": np.zeros(1)}).path.name for i in range(4)]
    assert store.next_name() == "snap-000000000005.iolsnap"
    assert store.delete_older(names[2]) == [names[1], names[0]]
    assert [p.name for p in store.paths()] == [names[3], names[2]]
    assert store.load_latest().manifest["i"] == 3
