"""Group learning on a real broker: worker processes in one consumer group share one model.

Three members (``iolstream run`` processes, tests/crash_worker.py) read 6-partition features and labels
topics (one-row messages keyed by id, labels 300 rows late, shuffled in windows of 50, 2 % never sent,
2 % twice). Once the group has settled (every input committed, every member's input learned and published,
every member holding every member's newest sums: read from their /metrics, never waited for by the clock),
every member's A, c, β and A_r must equal one uninterrupted single-worker pass over the same messages
(rtol 1e-9 of their scale), with the scaling the group agreed on; under exactly-once a read_committed reader
sees one prediction per row. Each member is stopped in turn, and its final snapshot must hold every record
published before its stop (docs/scaling.md, "A member's stop"). The chaos run kills one member with SIGKILL
mid-stream and restarts it, stops another for good (a rebalance hands its partitions over), and ends with
the same state: nothing counted twice or lost.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from kafka_util import (
    STARTUP_SECONDS,
    assert_one_prediction_per_row,
    committed_offsets,
    consume_all,
    unique_group,
)
from prometheus_client.parser import text_string_to_metric_families

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


def group_config(
    bootstrap: str, topics: dict, snap_dir: Path, group: str, *, exactly_once: bool, session_timeout_ms: int
) -> dict:
    return {
        "model": {"n_inputs": 6, "classes": [0, 1, 2], "n_nodes": 24, "n_layers": 2, "warmup_rows": 128},
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": group,
            "consumer": {"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": 500},
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Member:
    """One member's successive processes (same member id, same snapshot directory), each with its /metrics."""

    started: list[
        subprocess.Popen
    ] = []  # every member's processes of the test (``group_rig`` stops those left)

    def __init__(self, tmp_path: Path, config_path: Path, member: str):
        self.tmp, self.config_path, self.member = tmp_path, config_path, member
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    def start(self) -> None:
        """A new process of this member, returned once its /metrics answers. The port is chosen free here and
        bound by the process a moment later: should another process take it in between (a client's outgoing
        connection may), the process exits saying so, and it is started again on another port."""
        for _ in range(5):
            self.runs += 1
            self.log = self.tmp / f"{self.member}-run{self.runs}.log"
            self.port = free_port()
            env = {
                **os.environ,
                "IOLSTREAM_GROUP__MEMBER_ID": self.member,
                "IOLSTREAM_METRICS__HOST": "127.0.0.1",
                "IOLSTREAM_METRICS__PORT": str(self.port),
            }
            cmd = [sys.executable, str(CRASH_WORKER), str(self.config_path), "--idle-stop-seconds", "600"]
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb")
            )
            Member.started.append(self.proc)
            if self._serving():
                return
        raise AssertionError(f"{self.member}: five free ports were taken before the process bound them")

    def _serving(self) -> bool:
        """Until its /metrics answers (True) or it exited because its port was taken meanwhile (False); any other
        exit fails the test with its log."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=10):
                    return True
            except urllib.error.HTTPError:  # 503 while it starts: the port is its own
                return True
            except OSError:
                pass
            if self.proc.poll() is not None:
                if "Address already in use" in self.log.read_text():
                    return False
                self.alive()
            time.sleep(0.1)
        raise AssertionError(f"{self.member}: /metrics did not answer within {STARTUP_SECONDS:.0f} s")

    def alive(self) -> None:
        assert self.proc.poll() is None, (
            f"{self.member} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
        )

    def metrics(self) -> dict[tuple, float] | None:
        """Its /metrics now: {(name, (label, value)...): value}; None while the endpoint does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
                text = r.read().decode()
        except OSError:
            return None
        return {
            (sample.name, *sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def wait(self, condition, what: str, timeout: float = STARTUP_SECONDS) -> dict:
        """Until ``condition(metrics)`` holds on a scrape (the process alive meanwhile); returns that scrape."""
        deadline = time.monotonic() + timeout
        while True:
            self.alive()
            scrape = self.metrics()
            if scrape is not None and condition(scrape):
                return scrape
            assert time.monotonic() < deadline, f"{self.member}: not {what} within {timeout:.0f} s"
            time.sleep(0.2)

    def wait_log(self, condition, what: str, timeout: float = STARTUP_SECONDS) -> str:
        """Until ``condition(its log's text)`` holds (the process alive meanwhile); returns that text."""
        deadline = time.monotonic() + timeout
        while not condition(text := self.log.read_text()):
            self.alive()
            assert time.monotonic() < deadline, (
                f"{self.member}: not {what} within {timeout:.0f} s: {text[-3000:]}"
            )
            time.sleep(0.2)
        return text

    def stop(self, sig=signal.SIGTERM, timeout: float = 120.0) -> int:
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


def ready(scrape: dict) -> bool:
    """/readyz's condition: partitions assigned, replay over, broker reachable."""
    return scrape.get(("iolstream_ready",)) == 1.0


def deltas_end(bootstrap: str, topic: str) -> int:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group("probe")})
    try:
        return probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        probe.close()


def published_sequences(bootstrap: str, topic: str, below: int) -> dict[str, int]:
    """The newest sequence of every member's sums published (committed) below offset ``below`` of the deltas topic:
    a record counts once its last chunk is there."""
    newest: dict[str, int] = {}
    for _, _, headers, _, offset in consume_all(
        bootstrap, topic, timeout=30, isolation_level="read_committed"
    ):
        h = {k: v.decode() for k, v in headers}
        index, count = h["iolstream.chunk"].split("/")
        if offset < below and h["iolstream.kind"] == "sums" and int(index) == int(count) - 1:
            member, seq = h["iolstream.member"], int(h["iolstream.seq"])
            newest[member] = max(newest.get(member, 0), seq)
    return newest


def held_sequences(snap) -> dict[str, int]:
    """The sequence of every member's sums a snapshot holds (its own: the last it published)."""
    group = snap.manifest["group"]
    return {group["member"]: group["own_seq"], **{m: v[0] for m, v in group["members"].items()}}


def stop_holding_everything_published(member: Member, snap_dir: Path, bootstrap: str, topic: str) -> None:
    """Stop ``member`` gracefully; its final snapshot must hold every record published before the stop (it read
    the deltas topic to an end at or past the one here before the signal, and missed nothing below it)."""
    end = deltas_end(bootstrap, topic)
    assert member.stop() == 0, member.log.read_text()[-3000:]
    snap = member.newest(snap_dir)
    stop = snap.manifest["group"].get("stop")
    assert stop is not None and stop["behind"] == [], f"{member.member}'s stop: {stop}"
    assert dict(map(tuple, stop["ends"]))[0] >= end, f"{member.member} read to {stop['ends']}, before {end}"
    held = held_sequences(snap)
    for other, seq in published_sequences(bootstrap, topic, below=end).items():
        assert held.get(other, 0) >= seq, (
            f"{member.member} stopped holding {other}#{held.get(other)}, not #{seq}"
        )


def settle_stop_and_compare(
    members, bootstrap: str, raw: dict, snap_dir: Path, messages, context: str
) -> None:
    """Once the group settled (``wait_settled``), stop every member (each holding everything published) and
    compare their states with one worker's on the same stream (``assert_group_state``)."""
    wait_settled(members, bootstrap, raw)
    for m in members:
        stop_holding_everything_published(m, snap_dir, bootstrap, raw["topics"]["model_deltas"])
    assert_group_state(members, snap_dir, raw, messages, context)


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


def wait_settled(members, bootstrap: str, raw: dict, timeout: float = STARTUP_SECONDS) -> None:
    """Until the group has settled: every input message committed (at-least-once: covered by a snapshot); then,
    on one scrape of each running member that shows it has read the deltas topic up to its end E (so the scrape
    was made after E was there), nothing unpublished and every member's newest sequence held; and E still the
    end. From then on no member changes its sums without new input, and all hold the same ones."""
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
    while behind:
        for m in members:
            m.alive()
        committed = {
            (t, p): o
            for t in topics
            for p, o in committed_offsets(bootstrap, raw["kafka"]["group_id"], t, PARTITIONS).items()
        }
        behind = {key: end for key, end in ends.items() if (committed[key] or 0) < end}
        assert time.monotonic() < deadline, (
            f"input not all committed within {timeout:.0f} s: behind on {behind}"
        )
        time.sleep(0.5)
    topic = raw["topics"]["model_deltas"]
    while True:
        end = deltas_end(bootstrap, topic)
        newest = published_sequences(bootstrap, topic, below=end)
        scrapes = {m.member: m.metrics() for m in members}
        waiting = {}
        for name, scrape in scrapes.items():
            if scrape is None:
                waiting[name] = "no /metrics"
                continue
            read_to = scrape.get(("iolstream_group_log_position", ("partition", "0")), -1)
            held = {key[1][1]: value for key, value in scrape.items() if key[0] == "iolstream_group_sequence"}
            missing = {m: seq for m, seq in newest.items() if held.get(m) != seq}
            if read_to < end or scrape.get(("iolstream_group_unpublished",)) != 0 or missing:
                waiting[name] = (
                    f"read to {read_to} of {end}, unpublished {scrape.get(('iolstream_group_unpublished',))}, "
                    f"holds {held} of {newest}"
                )
        if not waiting and deltas_end(bootstrap, topic) == end:
            return
        for m in members:
            m.alive()
        assert time.monotonic() < deadline, f"the group did not settle within {timeout:.0f} s: {waiting}"
        time.sleep(0.25)


@pytest.fixture
def group_rig(tmp_path, kafka_bootstrap, kafka_topics):
    def make(exactly_once: bool, session_timeout_ms: int = 10_000):
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
        raw = group_config(
            kafka_bootstrap,
            topics,
            snap_dir,
            unique_group("grp"),
            exactly_once=exactly_once,
            session_timeout_ms=session_timeout_ms,
        )
        path = tmp_path / "worker.yaml"
        path.write_text(yaml.safe_dump(raw))
        return raw, path, snap_dir, topics

    yield make
    # a test that failed midway leaves its members running (alone, for --idle-stop-seconds): they would load the
    # machine under the tests after it
    for proc in Member.started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    Member.started.clear()


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
    # sent at once: members join while it flows, and rebalances move partitions with rows and labels waiting
    send(kafka_bootstrap, topics, messages)
    wait_settled(members, kafka_bootstrap, raw)
    for m in members:
        stop_holding_everything_published(m, snap_dir, kafka_bootstrap, topics["model_deltas"])
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


EARLY = 12  # the stream's first 12 messages: feature rows, spread over the partitions by their keys


def first_member_holding_the_first_rows(tmp_path, path, bootstrap: str, topics: dict, messages) -> Member:
    """m0 alone, once it has read the stream's first ``EARLY`` messages: too few rows for the group's warm-up
    scaling, so it holds them."""
    assert all(m.kind == "features" for m in messages[:EARLY])
    first = Member(tmp_path, path, "m0")
    first.start()
    send(bootstrap, topics, messages[:EARLY])
    first.wait(lambda s: s.get(("iolstream_rows_in_total",), 0) >= EARLY, f"reading the first {EARLY} rows")
    return first


@pytest.mark.kafka
def test_rows_held_for_the_scaling_when_their_partitions_went_are_handed_over_once_learned(
    group_rig, kafka_bootstrap, tmp_path
):
    """The first member reads rows of every partition before the others join: too few for the group's warm-up
    scaling, so its revoke cannot wait them out and they stay held, to be learned by it once the scaling is agreed,
    while their labels go to the partitions' next owners. Handed over once learned, they join there, and once the
    input is quiet every member holds one worker's state (before, those labels waited as early labels until the
    first member's stop handed its rows over: the members stopped before it missed them)."""
    raw, path, snap_dir, topics = group_rig(False)
    messages = make_stream()
    first = first_member_holding_the_first_rows(tmp_path, path, kafka_bootstrap, topics, messages)
    members = [first, *(Member(tmp_path, path, f"m{i}") for i in (1, 2))]
    for m in members[1:]:
        m.start()
    # the rest only once m0's revoke went on with its rows held: sent earlier, under load m0 could learn enough of
    # them alone to agree the scaling before the others joined, and nothing would be held. It goes on as soon as it
    # has read every proposal published before the revoke (none), not after kafka.call_timeout_seconds (30 s here)
    first.wait_log(
        lambda text: "before this revoke is read, and none made it" in text, "holding its rows at the revoke"
    )
    send(kafka_bootstrap, topics, messages[EARLY:])
    context = "rows held for the scaling when their partitions went"
    settle_stop_and_compare(members, kafka_bootstrap, raw, snap_dir, messages, context)


@pytest.mark.kafka
def test_rows_held_for_the_scaling_in_a_snapshot_are_handed_over_once_learned_after_a_restart(
    group_rig, kafka_bootstrap, tmp_path
):
    """The first member stops with rows of every partition still held for the group's warm-up scaling (its
    snapshot keeps them), and comes back to a group whose other members own most of those partitions: learned
    by it once the scaling is agreed, they are handed over, so their labels, which go to the partitions' new
    owners, join there (before, a restart handed over only the rows already waiting for labels)."""
    raw, path, snap_dir, topics = group_rig(False)
    messages = make_stream()
    first = first_member_holding_the_first_rows(tmp_path, path, kafka_bootstrap, topics, messages)
    assert first.stop() == 0, first.log.read_text()[-3000:]
    assert first.newest(snap_dir).manifest["stream"]["counters"]["rows_in"] >= EARLY
    members = [first, *(Member(tmp_path, path, f"m{i}") for i in (1, 2))]
    for m in members[1:]:
        m.start()
    for m in members[1:]:
        m.wait(ready, "ready")
    first.start()
    first.wait(ready, "ready again")
    mine = assigned_in(first.log.read_text())
    assert 0 < len(mine) < 2 * PARTITIONS, f"m0 came back to the partitions {sorted(mine)}"
    assert first.metrics().get(("iolstream_held_rows",), 0) > 0, "m0 came back holding no rows"
    send(kafka_bootstrap, topics, messages[EARLY:])
    context = "rows held for the scaling in a restarted member's snapshot"
    settle_stop_and_compare(members, kafka_bootstrap, raw, snap_dir, messages, context)


ASSIGNED = re.compile(r"(t-[^\s,\[]+)\[(\d+)\]@")


def assigned_in(text: str) -> set[tuple[str, int]]:
    """The partitions of every "assigned" line of a worker log."""
    lines = [line for line in text.splitlines() if " assigned " in line]
    return {(t, int(p)) for line in lines for t, p in ASSIGNED.findall(line)}


def restart_keeping_partitions(members, index: int) -> None:
    """kill -9 ``members[index]`` and start it again; asserts that it was back before its session timed out: no other
    member was assigned its partitions meanwhile (docs/operations.md: otherwise not exact)."""
    victim, others = members[index], [m for i, m in enumerate(members) if i != index]
    before = [len(m.log.read_text()) for m in others]
    mine = assigned_in(victim.log.read_text())
    assert victim.stop(signal.SIGKILL) == -signal.SIGKILL
    victim.start()  # static membership: its partitions wait for it
    victim.wait(ready, "ready again after kill -9")
    for m, offset in zip(others, before):
        taken = assigned_in(m.log.read_text()[offset:]) & mine
        assert not taken, (
            f"{m.member} was assigned {sorted(taken)} while {victim.member} restarted: the restart took longer than "
            f"session.timeout.ms ({victim.log.read_text()[-2000:]})"
        )


@pytest.mark.kafka
@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_kill_restart_and_leave_count_everything_once(group_rig, kafka_bootstrap, tmp_path, exactly_once):
    raw, path, snap_dir, topics = group_rig(exactly_once, session_timeout_ms=45_000)
    messages = make_stream(seed=11)
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    first, second = messages[: len(messages) // 2], messages[len(messages) // 2 :]
    members = [Member(tmp_path, path, f"m{i}") for i in range(3)]
    for m in members:
        m.start()
    for m in members:
        m.wait(ready, "ready")
    sender = threading.Thread(target=send, args=(kafka_bootstrap, topics, first, 600.0))  # ~5 s of input
    sender.start()
    # mid-stream, no goodbye: once its first predictions are committed (a kill during the group's warm-up, its
    # rows committed while held for the scaling: test_rows_committed_while_held_for_the_scaling_are_predicted_...)
    first = members[1].wait(lambda s: s.get(("iolstream_predictions_total",), 0) > 0, "predicting")
    committed = ("iolstream_transactions_total", ("outcome", "committed"))
    if exactly_once:  # a transaction committed after them: theirs, or a later one
        members[1].wait(lambda s: s.get(committed, 0) > first.get(committed, 0), "committing its predictions")
    restart_keeping_partitions(members, 1)
    # for good: its partitions go to the others once its session times out (static membership)
    stop_holding_everything_published(members[2], snap_dir, kafka_bootstrap, topics["model_deltas"])
    sender.join()
    send(kafka_bootstrap, topics, second)  # its partitions' share waits for the rebalance
    survivors = members[:2]
    wait_settled(survivors, kafka_bootstrap, raw)
    for m in survivors:
        stop_holding_everything_published(m, snap_dir, kafka_bootstrap, topics["model_deltas"])
    context = f"kill -9, restart, leave, exactly_once={exactly_once}"
    assert_group_state(survivors, snap_dir, raw, messages, context)
    if exactly_once:
        assert_one_prediction_per_row(kafka_bootstrap, topics["predictions"], ids, context)


@pytest.mark.kafka
def test_rows_committed_while_held_for_the_scaling_are_predicted_after_a_kill(
    group_rig, kafka_bootstrap, tmp_path
):
    """Exactly-once: a member commits the rows it reads while they wait for the group's warm-up scaling, none
    predicted. Killed then (its snapshot older than those commits), it comes back to a group that agreed the
    scaling meanwhile and re-learns them (kafka/relearn.py): their predictions, never sent, go out with its first
    transaction, so every row has one prediction (before, those were missing)."""
    raw, path, snap_dir, topics = group_rig(True, session_timeout_ms=45_000)
    raw["snapshot"].update(every_seconds=3600, every_batches=100_000)  # no snapshot after the first
    path.write_text(yaml.safe_dump(raw))
    messages = make_stream(seed=17)
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    early = 60  # feature rows, fewer than either member's warm-up (128): held, no proposal
    assert all(m.kind == "features" for m in messages[:early])
    members = [Member(tmp_path, path, f"m{i}") for i in range(2)]
    victim = members[0]
    victim.start()
    victim.wait(ready, "ready")
    before = len(victim.log.read_text())
    members[1].start()
    members[1].wait(ready, "ready")
    # the rebalance m1's join began is over for m0 too: its share assigned to it again
    victim.wait_log(lambda text: " assigned " in text[before:], "assigned its share")
    send(kafka_bootstrap, topics, messages[:early])
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:  # every one of them committed (a transaction's offsets), none predicted
        committed = committed_offsets(
            kafka_bootstrap, raw["kafka"]["group_id"], topics["features"], PARTITIONS
        )
        if sum(o or 0 for o in committed.values()) >= early:
            break
        assert time.monotonic() < deadline, f"the first {early} rows not committed: {committed}"
        time.sleep(0.2)
    scrape = victim.wait(lambda s: s.get(("iolstream_rows_in_total",), 0) > 0, "reading some of them")
    assert not scrape.get(("iolstream_predictions_total",))
    assert (
        victim.newest(snap_dir).manifest["stream"]["counters"]["rows_in"] == 0
    )  # they are past its snapshot
    assert victim.stop(signal.SIGKILL) == -signal.SIGKILL
    send(kafka_bootstrap, topics, messages[early:])  # its partitions wait for it (static membership)
    members[1].wait(
        lambda s: s.get(("iolstream_predictions_total",), 0) > 0, "predicting: the scaling agreed"
    )
    victim.start()
    text = victim.wait_log(lambda text: "re-learned " in text, "re-learning what it committed")
    context = "rows committed while held for the scaling, then kill -9"
    settle_stop_and_compare(members, kafka_bootstrap, raw, snap_dir, messages, context)
    assert_one_prediction_per_row(kafka_bootstrap, topics["predictions"], ids, context)
    owed = re.search(r"; (\d+) rows committed before any was predicted are predicted now", text)
    assert owed is not None and int(owed.group(1)) > 0, text[-3000:]


@pytest.mark.kafka
def test_a_member_restarted_without_its_snapshot_takes_its_own_sums_back(
    group_rig, kafka_bootstrap, tmp_path
):
    """Its snapshot directory lost: it takes back its newest record (sums and the input positions they cover) and
    the rows it was waiting on (its last handover), so the group's state stays exact, nothing learned twice."""
    raw, path, snap_dir, topics = group_rig(True, session_timeout_ms=45_000)
    messages = make_stream(seed=13)
    ids = [m.obj["id"] for m in messages if m.kind == "features"]
    half = len(messages) // 2
    members = [Member(tmp_path, path, f"m{i}") for i in range(2)]
    for m in members:
        m.start()
    send(kafka_bootstrap, topics, messages[:half])
    wait_settled(members, kafka_bootstrap, raw)
    stop_holding_everything_published(members[1], snap_dir, kafka_bootstrap, topics["model_deltas"])
    mine = assigned_in(members[1].log.read_text())
    shutil.rmtree(snap_dir / "m1")
    before = len(members[0].log.read_text())
    members[1].start()  # within the session timeout: its partitions wait for it (static membership)
    members[1].wait(ready, "ready again without its snapshot")
    assert not assigned_in(members[0].log.read_text()[before:]) & mine, (
        "m1's session timed out while it restarted"
    )
    send(kafka_bootstrap, topics, messages[half:])
    wait_settled(members, kafka_bootstrap, raw)
    for m in members:
        stop_holding_everything_published(m, snap_dir, kafka_bootstrap, topics["model_deltas"])
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
        (features, 2): (40, commit_metadata("w1", None, held=True)),
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
    held: set = set()
    ahead = relearn.own_commits_ahead(cfg, positions, bases, held)
    assert ahead == {(features, 0): 90, (features, 1): 250, (features, 2): 40}
    assert bases == {(features, 1): 200}
    assert held == {(features, 2)}  # committed before the member predicted any row
    assert positions == {
        (features, 0): 60,
        (labels, 0): 30,
    }  # moved by the re-learning itself, message by message
