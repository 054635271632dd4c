"""Snapshots already on disk keep loading: a snapshot written before the join buffer stored its
remembered ids as fingerprints (``join/done_ids``) restores, and the run continues as a run of the
current code that never stopped: the same join buffer, duplicates, expiries and dead letters
(tests/data/SOURCES.txt says how the file was made)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iolstream.core import state_io
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka import snapshots as snapshot
from iolstream.stream.config import StreamConfig
from iolstream.stream.joinbuffer import EXPIRED, LABELLED
from iolstream.stream.processor import StreamProcessor
from iolstream.stream.recent_ids import fingerprints

OLD_SNAPSHOT = Path(__file__).parents[1] / "data" / "snapshot-before-fingerprints.iolsnap"

CFG = StreamConfig(
    batch_rows=4,
    label_batch_rows=4,
    max_batch_latency_ms=10,
    max_label_latency_ms=10,
    max_pending_rows=50,
    row_ttl_ms=None,
    row_ttl_batches=3,
    early_label_ttl_ms=1000,
    max_early_labels=20,
    remember_done=10,
)


def fresh() -> StreamProcessor:
    model = EdRVFL(
        ModelConfig(
            n_inputs=3, classes=("a", "b", "c"), n_nodes=8, n_layers=2, scaler="none", seed=3, mode="forward"
        )  # the old file's model: -F, the default when it was written
    )
    return StreamProcessor(model, CFG)


def phase1() -> list[tuple[str, bytes, int]]:
    """12 batches of 4 rows, their labels one message later except some that never come (those rows
    expire), and a few early labels: the snapshot file holds the state after these messages."""
    rng = np.random.default_rng(7)
    msgs, t = [], 0
    for i in range(12):
        ids = [f"row-{i}-{j}" for j in range(4)]
        msgs.append(
            ("f", json.dumps({"ids": ids, "x": rng.normal(size=(4, 3)).round(4).tolist()}).encode(), t)
        )
        if i >= 1:
            prev = [f"row-{i - 1}-{j}" for j in range(4) if (i + j) % 5]
            ys = [["a", "b", "c"][(i + j) % 3] for j in range(len(prev))]
            msgs.append(("l", json.dumps({"ids": prev, "y": ys}).encode(), t))
        if i % 4 == 2:
            msgs.append(("l", json.dumps({"id": f"row-{i + 1}-0", "y": "c"}).encode(), t))  # early label
        t += 20
    return msgs


def phase2() -> list[tuple[str, bytes, int]]:
    """After the snapshot: duplicates of remembered ids, a label of an expired row, a label of an id
    forgotten long ago, new rows and their labels."""
    rng = np.random.default_rng(8)
    t = 12 * 20
    return [
        ("l", json.dumps({"ids": ["row-10-1", "row-9-2", "row-11-0"], "y": ["a", "a", "b"]}).encode(), t),
        ("l", json.dumps({"id": "row-7-2", "y": "b"}).encode(), t),
        (
            "f",
            json.dumps(
                {
                    "ids": ["row-10-2", "new-0", "row-6-3", "new-1"],
                    "x": rng.normal(size=(4, 3)).round(4).tolist(),
                }
            ).encode(),
            t,
        ),
        ("l", json.dumps({"id": "row-0-1", "y": "a"}).encode(), t + 5),
        (
            "f",
            json.dumps(
                {"ids": ["new-2", "new-3", "new-4", "new-5"], "x": rng.normal(size=(4, 3)).round(4).tolist()}
            ).encode(),
            t + 10,
        ),
        (
            "l",
            json.dumps({"ids": [f"new-{i}" for i in range(6)], "y": ["a", "b", "c", "a", "b", "c"]}).encode(),
            t + 20,
        ),
        ("l", json.dumps({"ids": ["new-0", "row-11-2"], "y": ["a", "b"]}).encode(), t + 30),
    ]


def feed(proc: StreamProcessor, msgs) -> list:
    out = []
    for n, (kind, value, t) in enumerate(msgs):
        dead = (proc.on_features if kind == "f" else proc.on_labels)(value, (kind, 0, n), t)
        step = proc.step(t)
        out.append(
            (
                [(d.bad.reason, d.value) for d in dead + step.dead_letters],
                [key for key, _ in step.predictions],
            )
        )
    return out


# what the code that wrote the file did with phase 2 after loading it
OLD_CODE_COUNTERS = {
    "rows_added": 54,
    "rows_duplicate": 2,
    "rows_expired": 8,
    "rows_evicted": 0,
    "labels_received": 52,
    "labels_joined": 44,
    "labels_early_held": 6,
    "labels_early_joined": 5,
    "labels_duplicate": 6,
    "labels_orphan": 0,
    "labels_expired_id": 1,
    "labels_forgotten_id": 0,  # counters added since: zero from an old snapshot
    "rows_forgotten_id": 0,
    "labels_handed_over": 0,  # a counter the old code did not have: 0 when loaded
}
OLD_CODE_DEAD = ["expired_id", "duplicate_id", "duplicate_id"]


def assert_same_state(a: StreamProcessor, b: StreamProcessor, *, stamps_unknown: bool = False) -> None:
    """Same join buffer, batcher and model sums. Not compared: what depends on how the processor
    groups label folds (the label queue, fold counters, last losses), which this test is not about."""
    _, x = a.to_state()
    _, y = b.to_state()
    # not in the old format, so started at the load: the class counts and the calibration, and what it emitted
    names = [
        n
        for n in x
        if n.split("/")[0] in ("join", "batcher", "held", "model")
        and not n.endswith(("class_counts", "/calibration"))
    ]
    assert "join/done_fingerprints" in names and "join/done_ids" not in names
    assert set(names) == {
        n
        for n in y
        if n.split("/")[0] in ("join", "batcher", "held", "model")
        and not n.endswith(("class_counts", "/calibration"))
    }
    for name in names:
        if (
            name == "join/pending_X"
        ):  # the last m columns: the probabilities emitted, calibrated since the load
            m = a.model.config.m
            x[name], y[name] = x[name][:, :-m], y[name][:, :-m]
        if (
            name == "join/pending_X" and stamps_unknown
        ):  # column 4: the stamp, unknown in the old file (never forgets)
            x[name], y[name] = np.delete(x[name], 4, axis=1), np.delete(y[name], 4, axis=1)
        if x[name].dtype.kind == "f":  # sums and layer outputs: summation order may differ
            np.testing.assert_allclose(x[name], y[name], rtol=1e-9, atol=1e-12, err_msg=name)
        else:  # ids, fingerprints, kinds, batch numbers, counters: exactly
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)


def test_the_file_is_a_snapshot_of_the_old_format():
    snap = snapshot.read(OLD_SNAPSHOT)
    assert "join/done_ids" in snap.arrays and "join/done_fingerprints" not in snap.arrays
    assert snap.arrays["join/done_kind"].tolist().count(EXPIRED) == 2


def test_a_snapshot_with_remembered_ids_loads_and_continues_like_a_run_that_never_stopped():
    snap = snapshot.read(OLD_SNAPSHOT)
    restored = StreamProcessor.from_state(snap.manifest, snap.arrays, CFG)
    # the remembered ids came back as their fingerprints, oldest first, with their kinds
    fps, kinds = restored.join._done.to_arrays()
    assert np.array_equal(fps, fingerprints(snap.arrays["join/done_ids"]))
    assert kinds.tolist() == snap.arrays["join/done_kind"].tolist() and set(kinds.tolist()) == {
        LABELLED,
        EXPIRED,
    }

    never_stopped = fresh()
    feed(never_stopped, phase1())
    assert_same_state(restored, never_stopped, stamps_unknown=True)

    outputs = [feed(proc, phase2()) for proc in (restored, never_stopped)]
    assert (
        outputs[0] == outputs[1]
    )  # the same dead letters (reasons and bytes) and predicted ids, step by step
    assert [reason for dead, _ in outputs[0] for reason, _ in dead] == OLD_CODE_DEAD
    assert restored.join.counters == never_stopped.join.counters == OLD_CODE_COUNTERS
    assert_same_state(restored, never_stopped, stamps_unknown=True)  # rows of phase 1 may still be pending
    # a restored snapshot written by this code round-trips in the new format
    manifest, arrays = restored.to_state()
    again = StreamProcessor.from_state(*snapshot.decode(snapshot.encode(manifest, arrays)), CFG)
    for name, value in again.to_state()[1].items():
        np.testing.assert_array_equal(value, arrays[name], err_msg=name)


def test_the_old_file_is_version_1_and_its_config_is_the_fresh_one():
    """Version 1 knew no forgetting and no target scaling: the config it reads back (what a worker compares
    with its own) is the one this scenario runs with today."""
    snap = snapshot.read(OLD_SNAPSHOT)
    assert (
        snapshot.read_header(OLD_SNAPSHOT.read_bytes())["version"] == 1
        and snap.manifest["format_version"] == 1
    )
    assert "forgetting" not in snap.manifest["config"]
    assert state_io.saved_config(snap.manifest) == fresh().model.config


def _old_reader(commit: str, path_in_repo: str, tmp_path: Path):
    """The snapshot reader of an older build, from git (skips when the history is not there)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{commit}:{path_in_repo}"],
            cwd=Path(__file__).parent,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"git history with {commit} not available")
    path = tmp_path / f"reader_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"reader_{commit}", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # its dataclasses look their module up
    try:
        spec.loader.exec_module(old)
    finally:
        del sys.modules[spec.name]
    return old


def test_new_snapshots_are_version_3_and_older_readers_refuse_them(tmp_path):
    """The readers of versions 1 (snapshot.py as of 52cdf64) and 2 (core/snapshot_file.py as of 7f30f43, before
    the model kept only what cannot be derived), run from git, stop on a file written now with
    SnapshotVersionError naming both versions, instead of misreading it."""
    proc = fresh()
    feed(proc, phase1())
    blob = snapshot.encode(*proc.to_state())
    assert snapshot.read_header(blob)["version"] == snapshot.FORMAT_VERSION == 3
    assert proc.to_state()[0]["format_version"] == state_io.FORMAT_VERSION == 3
    first = _old_reader("52cdf64", "iolstream/snapshot.py", tmp_path)
    assert first.FORMAT_VERSION == 1
    with pytest.raises(first.SnapshotVersionError, match="format version 3; this build reads version 1"):
        first.decode(blob)
    second = _old_reader("7f30f43", "iolstream/core/snapshot_file.py", tmp_path)
    assert second.FORMAT_VERSION == 2
    with pytest.raises(
        second.SnapshotVersionError, match="format version 3; this build reads versions 1 to 2"
    ):
        second.decode(blob)


def test_a_version_1_state_never_forgets():
    """A version-1 state has no row stamps: asking it to forget (an edited config) is refused, not guessed."""
    snap = snapshot.read(OLD_SNAPSHOT)
    manifest = json.loads(json.dumps(snap.manifest))
    manifest["config"]["forgetting"] = 1000.0
    with pytest.raises(ValueError, match="version-1 state has no row stamps"):
        StreamProcessor.from_state(manifest, snap.arrays, CFG)


V2_AUTO_SNAPSHOT = Path(__file__).parents[1] / "data" / "snapshot-v2-auto.iolsnap"
# sha256 of the predictions ("id=message" lines) the code that wrote it emitted: phase 1 from a fresh start,
# phase 2 after loading the file (and the same without stopping)
OLD_CODE_PHASE1 = "3600669ea052330a296d811df6b3c698dbcab38eacc2cbd2e41b97726d5836b8"
OLD_CODE_PHASE2 = "c6be1dc2f97cdc686b6d23e55a821884b1b93f97b402e42c31155d5c30c32071"


def fresh_auto(calibration: str = "none") -> StreamProcessor:
    """The model of the version-2 file: ``mode: auto``, -F and -R on one set of sums; ``calibration: none`` is
    the code that wrote it (the softmax of the layers, the selector judging by 0/1 loss)."""
    model = EdRVFL(
        ModelConfig(
            n_inputs=3,
            classes=("a", "b", "c"),
            n_nodes=8,
            n_layers=2,
            scaler="none",
            seed=3,
            calibration=calibration,
        )
    )
    return StreamProcessor(model, CFG)


def predictions_digest(proc: StreamProcessor, msgs) -> str:
    import hashlib

    lines = []
    for n, (kind, value, t) in enumerate(msgs):
        (proc.on_features if kind == "f" else proc.on_labels)(value, (kind, 0, n), t)
        lines += [key.encode() + b"=" + bytes(message) for key, message in proc.step(t).predictions]
    return hashlib.sha256(b"\n".join(lines)).hexdigest()


def test_a_version_2_auto_snapshot_loads_and_continues_as_the_code_that_wrote_it():
    """A snapshot of ``mode: auto`` in format version 2 (every candidate's A, factor, β and c, written before the
    model kept only what cannot be derived) loads; the restored worker emits, byte for byte, what the code that
    wrote it emitted after loading it, which is also what a run of this code that never stopped emits; and this
    code predicts phase 1 with the very bytes the old code did (its fused kernels compute the same bits). The file
    predates calibrated probabilities: its config read with ``calibration: none`` is the code that wrote it; read
    as it is (``online``, the default), the sums and β are the same and the calibration starts at the load."""
    snap = snapshot.read(V2_AUTO_SNAPSHOT)
    assert snapshot.read_header(V2_AUTO_SNAPSHOT.read_bytes())["version"] == 2
    assert {"model/cand1/layer0/gram", "model/cand1/layer0/beta", "model/cand0/layer0/factor"} <= set(
        snap.arrays
    )
    assert "calibration" not in snap.manifest["config"]
    as_saved = StreamProcessor.from_state(snap.manifest, snap.arrays, CFG)
    assert as_saved.model.calibrated
    manifest = json.loads(json.dumps(snap.manifest))
    manifest["config"]["calibration"] = "none"
    restored = StreamProcessor.from_state(manifest, snap.arrays, CFG)
    never_stopped = fresh_auto()
    assert predictions_digest(never_stopped, phase1()) == OLD_CODE_PHASE1
    for loaded in (restored, as_saved):
        for a, b in zip(loaded.model.learners, never_stopped.model.learners):
            for la, lb in zip(a.state.layers, b.state.layers):
                np.testing.assert_array_equal(np.tril(la.gram), np.tril(lb.gram))
                np.testing.assert_array_equal(la.beta, lb.beta)
    predictions_digest(as_saved, phase2())  # read as it is: calibrated from the load on
    assert as_saved.model.learners[0].calibration_sums.any()
    assert (
        predictions_digest(restored, phase2())
        == predictions_digest(never_stopped, phase2())
        == OLD_CODE_PHASE2
    )
    # written again, it is version 3: the -F learner's A, A_r and c, and its P where a batch of 1 or 2 rows
    # (b·6 ≤ n) left it on the Woodbury route; the -R candidate's counters and calibration sums alone
    manifest, arrays = restored.to_state()
    assert manifest["format_version"] == 3
    model_arrays = {k for k in arrays if k.startswith("model/") and "/scaler/" not in k}
    assert {"model/cand0/gram", "model/cand0/gram_labelled", "model/cand0/rhs"} <= model_arrays
    assert model_arrays <= {"model/cand0/gram", "model/cand0/gram_labelled", "model/cand0/rhs"} | {
        f"model/cand0/layer{i}/inverse" for i in range(2)
    } | {"model/cand0/calibration", "model/cand1/calibration", "model/class_counts"}  # each candidate's own
