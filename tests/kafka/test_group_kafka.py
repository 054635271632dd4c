"""Group learning on a real broker (issue 15): worker processes in one consumer group share one model.

Three members (``iolstream run`` processes, tests/crash_worker.py) read 6-partition features and labels
topics (one-row messages keyed by id, labels 300 rows late, shuffled in windows of 50, 2 % never sent,
2 % twice). After quiescence every member's A, c, β and A_r must equal one uninterrupted single-worker
pass over the same messages (rtol 1e-9 of their scale), with the scaling the group agreed on; under
exactly-once a read_committed reader sees one prediction per row. The chaos run kills one member with
SIGKILL mid-stream and restarts it, stops another for good (a rebalance hands its partitions over), and
ends with the same state: nothing counted twice or lost.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from kafka_util import committed_offsets, consume_all, unique_group

from iolstream.core.model import EdRVFL
from iolstream.core.snapshot_file import load_snapshot
from iolstream.kafka import snapshots
from iolstream.kafka.config import config_from_dict
from iolstream.stream.processor import StreamProcessor
from iolstream.tools import produce

REPO = Path(__file__).resolve().parents[2]
CRASH_WORKER = REPO / "tests" / "crash_worker.py"
N_ROWS = 6000
PARTITIONS = 6
MODEL_ARRAYS = re.compile(r"model/(cand\d+/)?(gram|rhs|gram_labelled)$")  # cand: auto
AUTO_ARRAYS = re.compile(
    r"model/cand\d+/(gram|rhs|gram_labelled)$"
)  # lam / forgetting auto: each half-life's sums


def make_stream(seed: int = 7, regression: bool = False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_ROWS, 6))
    y = (x @ rng.normal(size=(6, 3)) + 0.3 * rng.normal(size=(N_ROWS, 3))).argmax(axis=1)
    if regression:  # targets far from 0: the group's target scaling matters
        y = 40.0 + 5.0 * np.sin(x[:, 0]) + 3.0 * x[:, 1] * x[:, 2] + 0.3 * rng.normal(size=N_ROWS)
    options = produce.PlanOptions(
        batch_rows=1,
        label_delay_rows=300,
        missing_fraction=0.02,
        duplicate_fraction=0.02,
        shuffle_window=50,
        seed=seed,
    )
    return produce.plan(x, y, options)


def group_config(bootstrap: str, topics: dict, snap_dir: Path, group: str, *, exactly_once: bool) -> dict:
    return {
        "model": {"n_inputs": 6, "classes": [0, 1, 2], "n_nodes": 24, "n_layers": 2, "warmup_rows": 128},
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": group,
            "consumer": {"session.timeout.ms": 10000, "heartbeat.interval.ms": 500},
        },
        "topics": {**topics, "create": True, "partitions": PARTITIONS},
        "stream": {"batch_rows": 64, "row_ttl_ms": None, "early_label_ttl_ms": 3_600_000},
        "snapshot": {"dir": str(snap_dir), "every_batches": 20, "every_seconds": 1.0, "keep": 3},
        "durability": {"exactly_once": exactly_once},
        "group": {
            "enabled": True,
            "sync_every_ms": 200,
            "chunk_bytes": 4096,
        },  # small chunks: several per record
        "metrics": {"port": 0},
        "logging": {"status_every_seconds": 2},
    }


class Member:
    """One member's successive processes (same member id, same snapshot directory)."""

    def __init__(self, tmp_path: Path, config_path: Path, member: str):
        self.tmp, self.config_path, self.member = tmp_path, config_path, member
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        self.log = self.tmp / f"{self.member}-run{self.runs}.log"
        env = {**os.environ, "IOLSTREAM_GROUP__MEMBER_ID": self.member}
        cmd = [sys.executable, str(CRASH_WORKER), str(self.config_path), "--idle-stop-seconds", "600"]
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb")
        )

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(
                f"{self.member} did not stop within {timeout} s:\n{self.log.read_text()[-3000:]}"
            ) from None

    def newest(self, snap_dir: Path) -> snapshots.Snapshot:
        snap = snapshots.SnapshotStore(snap_dir / self.member, keep=3).load_latest()
        assert snap is not None, f"{self.member}: no snapshot"
        return snap


def agreed_model(raw_cfg: dict, snap) -> dict:
    """The model section with the scaling the group agreed on (a member's snapshot) fixed: inputs, and targets."""
    model = {
        **raw_cfg["model"],
        "scaler": "fixed",
        "scaler_mean": snap.arrays["model/scaler/mean"].tolist(),
        "scaler_std": snap.arrays["model/scaler/scale"].tolist(),
    }
    if model.get("classes") is None:
        model.update(
            target_scaler="fixed",
            target_mean=snap.arrays["model/targets/mean"].tolist(),
            target_std=snap.arrays["model/targets/std"].tolist(),
        )
    return model


def reference_state(raw_cfg: dict, messages, model_section: dict) -> dict:
    """One uninterrupted single-worker pass (no Kafka), with the scaling the group agreed on."""
    raw = {**raw_cfg, "model": model_section, "group": {"enabled": False}}
    cfg = config_from_dict(raw, environ={})
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream)
    for i, m in enumerate(messages):
        (proc.on_features if m.kind == "features" else proc.on_labels)(m.encode(), (m.kind, 0, i), 0)
        proc.step(0)
    proc.step(0, force=True)
    return proc.to_state()


def closed_form(model_section: dict, messages) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (A, c) straight from the data: A = λI + Σ DᵀD over every row, c = Σ DᵀY over the rows whose
    label came (the first one: a repeated label is a duplicate), with the group's scaling (Y scaled like it)."""
    model = EdRVFL(config_from_dict({"model": model_section}, environ={}).model)
    rows = {m.obj["id"]: m.obj["x"] for m in messages if m.kind == "features"}
    labels: dict = {}
    for m in messages:
        if m.kind == "labels":
            labels.setdefault(m.obj["id"], m.obj["y"])
    ids = list(rows)
    d_t = model.features(np.array([rows[i] for i in ids]))
    y = np.zeros((len(ids), model.config.m))
    have = np.array([i in labels for i in ids])
    y[have] = model.targets.transform(model.encode_labels([labels[i] for i in ids if i in labels]))
    lam = model_section.get("lam", 0.5)
    return [(lam * np.eye(d.shape[0]) + d @ d.T, d @ y) for d in d_t]


def assert_group_state(members, snap_dir: Path, raw_cfg: dict, messages, context: str) -> None:
    snaps = [m.newest(snap_dir) for m in members]
    agreed = agreed_model(raw_cfg, snaps[0])
    for snap in snaps[1:]:  # one scaling for the whole group
        assert agreed_model(raw_cfg, snap) == agreed, context
    ref_manifest, ref = reference_state(raw_cfg, messages, agreed)
    closed = closed_form(agreed, messages)
    for member, snap in zip(members, snaps):
        why = f"{context}: member {member.member} ({snap.path})"
        compared = 0
        for name, want in ref.items():
            if MODEL_ARRAYS.match(name):
                np.testing.assert_allclose(
                    snap.arrays[name],
                    want,
                    rtol=1e-9,
                    atol=1e-9 * np.abs(want).max(),
                    err_msg=f"{name}: {why}",
                )
                compared += 1
        assert compared >= 2, why
        # mode: auto (the default): the first candidate, -F, makes the updates: A over every row seen
        first = load_snapshot(snap.path).learners[0].state
        for layer, (a, c) in enumerate(
            closed
        ):  # the offline solution over every row seen, every label joined
            got = np.tril(first.layers[layer].gram)  # the authoritative triangle
            np.testing.assert_allclose(
                got,
                np.tril(a),
                rtol=1e-9,
                atol=1e-9 * np.abs(a).max(),
                err_msg=f"closed-form A, layer {layer}: {why}",
            )
            np.testing.assert_allclose(
                first.layers[layer].beta,
                np.linalg.solve(a, c),
                rtol=1e-6,
                atol=1e-9,
                err_msg=f"closed-form β, layer {layer}: {why}",
            )
        for key in ("rows_observed", "rows_labelled"):
            got, want = (
                m.get("counters") or m["candidates"][0]["counters"] for m in (snap.manifest, ref_manifest)
            )
            assert got[key] == want[key], f"{key}: {why}"
        assert snap.manifest["group"]["member"] == member.member


def wait_quiet(members, bootstrap: str, raw: dict, timeout: float = 120.0) -> None:
    """Until the group has committed every input message (at-least-once: covered by a snapshot), then long
    enough for queued labels to fold in (max_label_latency_ms) and the last sums to go round (sync_every_ms)."""
    topics = [raw["topics"]["features"], raw["topics"]["labels"]]
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group("probe")})
    ends = {
        (t, p): probe.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
        for t in topics
        for p in range(PARTITIONS)
    }
    probe.close()
    deadline = time.monotonic() + timeout
    behind = ends
    while time.monotonic() < deadline:
        for m in members:
            assert m.proc.poll() is None, (
                f"{m.member} exited {m.proc.returncode}:\n{m.log.read_text()[-3000:]}"
            )
        committed = {
            (t, p): o
            for t in topics
            for p, o in committed_offsets(bootstrap, raw["kafka"]["group_id"], t, PARTITIONS).items()
        }
        behind = {key: end for key, end in ends.items() if (committed[key] or 0) < end}
        if not behind:
            break
        time.sleep(1.0)
    else:
        raise AssertionError(f"input not all committed within {timeout} s: behind on {behind}")
    # then until the members stop publishing (a member publishes only when its own sums changed): 2 s without
    # a new record on the deltas topic, every member having applied every other's last one
    deltas = TopicPartition(raw["topics"]["model_deltas"], 0)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group("probe")})
    last, quiet_since = None, time.monotonic()
    try:
        while time.monotonic() < deadline:
            end = probe.get_watermark_offsets(deltas, timeout=10, cached=False)[1]
            if end != last:
                last, quiet_since = end, time.monotonic()
            elif time.monotonic() - quiet_since >= 2.0:
                time.sleep(1.0)  # the last record's readers apply it within a cycle
                return
            time.sleep(0.25)
    finally:
        probe.close()
    raise AssertionError(f"the members did not stop publishing within {timeout} s")


def assert_one_prediction_per_row(bootstrap: str, topic: str, ids, context: str) -> None:
    got = consume_all(bootstrap, topic, expected=len(ids), timeout=15, isolation_level="read_committed")
    counts = Counter(orjson.loads(v)["id"] for _, v, _, _, _ in got)
    dupes = [i for i, n in counts.items() if n > 1]
    missing = set(ids) - set(counts)
    assert not dupes and not missing, (
        f"{context}: {len(dupes)} rows predicted twice {dupes[:5]}, {len(missing)} missing"
    )


@pytest.fixture
def group_rig(tmp_path, kafka_bootstrap, kafka_topics):
    def make(exactly_once: bool):
        names = kafka_topics("features", "labels", partitions=PARTITIONS)
        extra = kafka_topics(
            "predictions", "dead", "deltas"
        )  # the deltas topic is made by the first member (create)
        topics = {
            "features": names[0],
            "labels": names[1],
            "predictions": extra[0],
            "dead_letters": extra[1],
            "model_deltas": extra[2] + "-group",
        }
        snap_dir = tmp_path / "snapshots"
        raw = group_config(kafka_bootstrap, topics, snap_dir, unique_group("grp"), exactly_once=exactly_once)
        path = tmp_path / "worker.yaml"
        path.write_text(yaml.safe_dump(raw))
        return raw, path, snap_dir, topics

    return make


def send(bootstrap: str, topics: dict, messages, rate: float | None = None):
    return produce.send(
        messages,
        producer_conf={"bootstrap.servers": bootstrap},
        features_topic=topics["features"],
        labels_topic=topics["labels"],
        rate=rate,
    )


def assert_members_agree(members, snap_dir: Path, n_rows: int, context: str) -> None:
    """With forgetting (no single-worker reference: its row order differs): every member holds the group clock
    (rows seen by all) and the same decayed sums (the weighted closed form is checked in tests/stream/test_group.py)."""
    snaps = [m.newest(snap_dir) for m in members]
    for m, snap in zip(members, snaps):
        for cand in snap.manifest["candidates"]:
            assert cand["counters"]["clock"] == n_rows, f"{context}: {m.member}'s clock"
    compared = 0
    for name, want in snaps[0].arrays.items():
        if AUTO_ARRAYS.match(name):
            compared += 1
            for m, snap in zip(members[1:], snaps[1:]):
                np.testing.assert_allclose(
                    snap.arrays[name],
                    want,
                    rtol=1e-9,
                    atol=1e-9 * np.abs(want).max(),
                    err_msg=f"{name}: {context}, {m.member} against {members[0].member}",
                )
    assert compared >= 3 * 2, (
        context
    )  # auto: the sums of each half-life's primary, A and c (β is solved from them)
    for m, snap in zip(members[1:], snaps[1:]):  # one selector for the group: the same recent losses
        np.testing.assert_allclose(
            snap.manifest["selection"]["loss"],
            snaps[0].manifest["selection"]["loss"],
            rtol=1e-9,
            err_msg=f"{context}: {m.member}'s selector",
        )


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("exactly_once", "variant"),
    [(False, None), (True, None), (False, "auto"), (True, "regression")],
    ids=["at-least-once", "exactly-once", "auto", "regression"],
)
def test_three_members_hold_one_model(group_rig, kafka_bootstrap, tmp_path, exactly_once, variant):
    raw, path, snap_dir, topics = group_rig(exactly_once)
    if (
        variant == "auto"
    ):  # forgetting and λ chosen online: every candidate's sums and the selector's are shared
        raw["model"].update(forgetting="auto", lam="auto")
    if (
        variant == "regression"
    ):  # the group agrees on the target scaling too (the first warm-up labels' proposal)
        raw["model"].update(classes=None, n_outputs=1)
    path.write_text(yaml.safe_dump(raw))
    messages = make_stream(regression=variant == "regression")
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    members = [Member(tmp_path, path, f"m{i}") for i in range(3)]
    for m in members:
        m.start()
    send(kafka_bootstrap, topics, messages)
    wait_quiet(members, kafka_bootstrap, raw)
    for m in members:
        assert m.stop() == 0, m.log.read_text()[-3000:]
    logs = [m.log.read_text() for m in members]
    assert sum("the group's warm-up scaling is member" in log for log in logs) == 3
    if variant == "regression":
        assert sum("the group's target scaling is member" in log for log in logs) == 3
    assert all(re.search(r"group=3 members", log) for log in logs), "the status line shows the group size"
    if variant != "auto":
        assert_group_state(members, snap_dir, raw, messages, f"3 members, exactly_once={exactly_once}")
    else:
        assert_members_agree(members, snap_dir, len(ids), "3 members, lam and forgetting auto")
    if exactly_once:
        assert_one_prediction_per_row(kafka_bootstrap, topics["predictions"], ids, "3 members")


@pytest.mark.kafka
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_kill_restart_and_leave_count_everything_once(group_rig, kafka_bootstrap, tmp_path, exactly_once):
    raw, path, snap_dir, topics = group_rig(exactly_once)
    messages = make_stream(seed=11)
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    members = [Member(tmp_path, path, f"m{i}") for i in range(3)]
    for m in members:
        m.start()
    sender = threading.Thread(target=send, args=(kafka_bootstrap, topics, messages, 600.0))  # ~10 s of input
    sender.start()
    time.sleep(4.0)
    assert members[1].stop(signal.SIGKILL) == -signal.SIGKILL  # mid-stream, no goodbye
    time.sleep(1.0)
    members[1].start()  # static membership: its partitions wait for it (session timeout 10 s)
    time.sleep(2.0)
    assert members[2].stop() == 0, members[2].log.read_text()[
        -3000:
    ]  # for good: a rebalance hands its partitions over
    sender.join()
    survivors = members[:2]
    wait_quiet(survivors, kafka_bootstrap, raw, timeout=180)
    for m in survivors:
        assert m.stop() == 0, m.log.read_text()[-3000:]
    context = f"kill -9, restart, leave, exactly_once={exactly_once}"
    assert_group_state(survivors, snap_dir, raw, messages, context)
    if exactly_once:
        assert_one_prediction_per_row(kafka_bootstrap, topics["predictions"], ids, context)


@pytest.mark.kafka
def test_a_member_restarted_without_its_snapshot_takes_its_own_sums_back(
    group_rig, kafka_bootstrap, tmp_path
):
    """Its snapshot directory lost: it takes back its newest record (sums and the input positions they cover) and
    the rows it was waiting on (its last handover), so the group's state stays exact, nothing learned twice."""
    raw, path, snap_dir, topics = group_rig(True)
    messages = make_stream(seed=13)
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    half = len(messages) // 2
    members = [Member(tmp_path, path, f"m{i}") for i in range(2)]
    for m in members:
        m.start()
    send(kafka_bootstrap, topics, messages[:half])
    wait_quiet(members, kafka_bootstrap, raw)
    assert members[1].stop() == 0, members[1].log.read_text()[-3000:]
    shutil.rmtree(snap_dir / "m1")
    members[1].start()  # within the session timeout: its partitions wait for it (static membership)
    send(kafka_bootstrap, topics, messages[half:])
    wait_quiet(members, kafka_bootstrap, raw)
    for m in members:
        assert m.stop() == 0, m.log.read_text()[-3000:]
    log = members[1].log.read_text()
    assert "no snapshot" in log and "took back this member's own sums" in log
    assert_group_state(members, snap_dir, raw, messages, "a restart without a snapshot")
    assert_one_prediction_per_row(kafka_bootstrap, topics["predictions"], ids, "a restart without a snapshot")


def test_a_restart_relearns_own_commits_past_the_snapshot_from_where_the_member_began(
    kafka_bootstrap, kafka_topics
):
    """Which ranges a restarted exactly-once member re-learns (``relearn.own_commits_ahead``), from commits on a real
    broker: a partition in its snapshot, from the snapshot's position; one taken over from another member after the
    snapshot, from the take-over its commit names; one it read from the beginning after the snapshot, from there;
    another member's commits and commits not ahead of the state, not at all."""
    from iolstream.kafka import relearn
    from iolstream.kafka.offsets import commit_metadata

    features, labels = kafka_topics("features", "labels", partitions=4)
    group = unique_group("relearn")
    cfg = config_from_dict(
        {
            "model": {"n_inputs": 3, "classes": [0, 1]},
            "group": {"enabled": True, "member_id": "w1"},
            "kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": group},
            "topics": {"features": features, "labels": labels},
        },
        environ={},
    )
    commits = {
        (features, 0): (90, commit_metadata("w1", None)),
        (features, 1): (250, commit_metadata("w1", 200)),
        (features, 2): (40, commit_metadata("w1", None)),
        (features, 3): (70, commit_metadata("w2", None)),
        (labels, 0): (30, commit_metadata("w1", None)),
    }
    committer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        committer.commit(
            offsets=[TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in commits.items()],
            asynchronous=False,
        )
    finally:
        committer.close()
    positions = {(features, 0): 60, (labels, 0): 30}  # the snapshot's
    bases: dict = {}
    ahead = relearn.own_commits_ahead(cfg, positions, bases)
    assert ahead == {(features, 0): 90, (features, 1): 250, (features, 2): 40}
    assert bases == {(features, 1): 200}
    assert positions == {
        (features, 0): 60,
        (labels, 0): 30,
    }  # moved by the re-learning itself, message by message
