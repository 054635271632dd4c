"""Forget requests on a real broker (docs/design.md §13), at-least-once and exactly-once, with kill -9.

The stream: 6,000 rows (8 features, 3 classes) in batch messages of 100, labels 300 rows late, sent in two
halves; between them, forget requests for 400 rows of the first half (most labelled by then, the last ones
still waiting for their labels), one id never seen and one asked twice. Worker processes (the ``iolstream
run`` path, tests/crash_worker.py) die at chosen points — right after a request, after the snapshot that holds
the removal and before its receipts, in the middle of a snapshot — and restart. At the end:

- the model (``mode: auto``: the -F learner's A, c and A_r, which the -R candidate reads) is the one an
  uninterrupted pass over the stream without those rows gives, and so are its row counters;
- a receipt names every forgotten id, the model version and a snapshot; exactly-once, a read_committed reader
  sees each once; at-least-once, at least once, the same each time;
- the unknown id and the repeat are dead letters with their reasons (read_committed: once, exactly-once), and
  so are the late labels of rows forgotten while they waited (forgotten_id);
- no snapshot left on disk holds a forgotten row (join buffer, batcher, label queue), the retention store's
  files hold none of their features, and the metrics counted them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import orjson
import pytest
from kafka_util import MODEL_ARRAYS, committed_offsets, consume_all, produce_json, reference_state
from test_durability_kafka import CRASHED, LEARNER_COUNTERS, WorkerRig, base_config, snapshot_offsets

from iolstream.kafka import snapshots
from iolstream.tools import produce

N_ROWS = 6_000
SEED = 20261127
FORGOTTEN = [f"r{i}" for i in range(500, 2_900, 6)]  # 400 rows of the first half: labelled, or still waiting


def the_stream():
    rng = np.random.default_rng(SEED)
    X = rng.normal(size=(N_ROWS, 8))
    y = (X @ rng.normal(size=(8, 3)) + 0.3 * rng.normal(size=(N_ROWS, 3))).argmax(axis=1)
    options = produce.PlanOptions(batch_rows=100, label_delay_rows=300, seed=SEED)
    messages = produce.plan(X, y, options)
    half = next(i for i, m in enumerate(messages) if m.kind == "features" and m.obj["ids"][0] == "r3000")
    return X, messages[:half], messages[half:]


def without(messages, ids: set[str]):
    """The messages with the rows of ``ids`` left out (what a model that never saw them was fed)."""
    out = []
    for m in messages:
        keep = [i for i, row_id in enumerate(m.obj["ids"]) if row_id not in ids]
        if not keep:
            continue
        field = "x" if m.kind == "features" else "y"
        obj = {"ids": [m.obj["ids"][i] for i in keep], field: [m.obj[field][i] for i in keep]}
        out.append(dataclasses.replace(m, obj=obj, rows=len(keep)))
    return out


def assert_model_without(snap, reference, context: str) -> None:
    """Every learned array (of every candidate) and the learners' row counters are the reference's; the rows
    still waiting for labels are its too."""
    ref_manifest, ref_arrays = reference
    compared = 0
    for name, ref in ref_arrays.items():
        if MODEL_ARRAYS.match(name):
            compared += 1
            np.testing.assert_allclose(
                snap.arrays[name], ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max(), err_msg=f"{name}: {context}"
            )
        elif name.startswith("model/scaler/"):
            np.testing.assert_array_equal(snap.arrays[name], ref, err_msg=f"{name}: {context}")
    assert compared >= 3, context  # A, c and A_r of the -F learner (the -R candidate's are these: none saved)
    pairs = zip(
        snap.manifest.get("candidates", [snap.manifest]), ref_manifest.get("candidates", [ref_manifest])
    )
    for ours, theirs in pairs:
        assert {k: ours["counters"][k] for k in LEARNER_COUNTERS} == {
            k: theirs["counters"][k] for k in LEARNER_COUNTERS
        }, context
    assert sorted(snap.arrays["join/pending_ids"].tolist()) == sorted(ref_arrays["join/pending_ids"].tolist())


def requests() -> list[dict]:
    """Forget requests in batches of 50 ids, one for an id never seen, and one id asked again."""
    out = [{"ids": FORGOTTEN[i : i + 50]} for i in range(0, len(FORGOTTEN), 50)]
    return out + [{"id": "never-seen"}, {"id": FORGOTTEN[7]}]


@pytest.mark.kafka
@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_rows_forgotten_across_kills_leave_the_model_without_them_with_one_receipt_each(
    tmp_path, kafka_bootstrap, kafka_topics, exactly_once
):
    X, first, second = the_stream()
    names = kafka_topics("features", "labels", "predictions", "dead", "forget", "receipts")
    topics = dict(
        zip(["features", "labels", "predictions", "dead_letters", "forget", "forget_receipts"], names)
    )
    for half in (first, [], second):
        if not half:  # between the halves: the requests
            produce_json(kafka_bootstrap, topics["forget"], requests())
            continue
        produce.send(
            half,
            producer_conf={"bootstrap.servers": kafka_bootstrap},
            features_topic=topics["features"],
            labels_topic=topics["labels"],
        )
    rig = WorkerRig(tmp_path, kafka_bootstrap, topics, exactly_once=exactly_once)
    rig.raw["snapshot"]["keep"] = 3
    rig.write_config()
    crashes = ["mid_batch:35", "after_forget:3", "before_receipts:1", "in_snapshot:1"]
    for crash in crashes:
        rc, log = rig.run(crash)
        assert rc == CRASHED, f"{crash}: exit {rc}, expected the crash point to be reached\n{log[-3000:]}"
    rc, log = rig.run()
    assert rc == 0, log[-3000:]

    # the model: as if those rows had never come
    gone = set(FORGOTTEN)
    raw = base_config("-", {}, tmp_path, "-", exactly_once=False)
    reference = reference_state(raw, without(first, gone) + without(second, gone))
    newest = rig.newest()
    assert_model_without(newest, reference, f"seed {SEED}, forgotten across crashes {crashes}")

    # the receipts: one per id forgotten, naming a snapshot and the model version after its removal. A request
    # may overtake its row (the topics are aligned by time only so far): then it is refused as never seen, and
    # the row refused when it comes; the model is the same either way
    isolation = "read_committed"
    got = consume_all(kafka_bootstrap, topics["forget_receipts"], timeout=3, isolation_level=isolation)
    receipts = [orjson.loads(v) for _, v, _, _, _ in got]
    counts = Counter(r["id"] for r in receipts)
    dead = consume_all(kafka_bootstrap, topics["dead_letters"], timeout=3, isolation_level=isolation)
    refused = [(dict(h)["iolstream.reason"].decode(), orjson.loads(v)["id"]) for _, v, h, _, _ in dead]
    reasons = Counter(reason for reason, _ in refused)
    unknown = {row_id for reason, row_id in refused if reason == "forget_unknown_id"}
    assert gone <= set(counts) | unknown, (
        f"neither receipt nor refusal: {sorted(gone - set(counts) - unknown)[:5]}"
    )
    assert len(set(counts) & gone) >= len(gone) // 2, f"only {len(counts)} receipts"
    assert set(counts) <= gone and "never-seen" in unknown
    if exactly_once:  # one outcome per id, once
        assert max(counts.values()) == 1, f"receipts twice: {[i for i, n in counts.items() if n > 1][:5]}"
        assert not set(counts) & unknown
        assert reasons["forget_already_forgotten"] == 1
    for r in receipts:
        assert r["snapshot"].startswith("snap-") and r["request"][0] == topics["forget"], r
        assert r["stage"] in ("labelled", "joined", "waiting", "queued", "label_only"), r
        assert r["model_version"] >= 0, r
    by_id: dict[str, set] = {}
    for r in receipts:
        by_id.setdefault(r["id"], set()).add((r["snapshot"], r["model_version"], r["stage"]))
    if exactly_once:
        assert all(len(v) == 1 for v in by_id.values())
    # the late labels of rows forgotten while they waited are refused, and nothing else is
    waiting = {r["id"] for r in receipts if r["stage"] == "waiting"}  # (by timing: waiting, or labelled)
    assert reasons["forgotten_id"] >= len(waiting), (Counter(r["stage"] for r in receipts), reasons)
    assert set(reasons) <= {"forget_unknown_id", "forget_already_forgotten", "forgotten_id"}, reasons

    # nothing keeps the rows: no snapshot on disk, no retention record
    for path in rig.store().paths():
        snap = snapshots.read(path)
        for key in ("join/pending_ids", "batcher/ids", "held/ids", "queue/ids"):
            if key in snap.arrays:
                held = {str(i) for i in snap.arrays[key].tolist()}
                assert not held & gone, f"{path.name} {key} holds forgotten rows"
        assert not snap.manifest["stream"]["erasure"]["waiting"], f"{path.name}: removals not sealed"
        # every snapshot left was written after the last removal: the ones before it, holding rows, are gone
        ids_forgotten = snap.manifest["stream"]["erasure"]["counters"]["ids_forgotten"]
        assert ids_forgotten == newest.manifest["stream"]["erasure"]["counters"]["ids_forgotten"], path.name
    files = b"".join(p.read_bytes() for p in (rig.snap_dir / "retention").glob("seg-*.rows"))
    assert files, "the retention store holds the rows not forgotten"
    for row_id in FORGOTTEN[::10]:
        assert np.ascontiguousarray(X[int(row_id[1:])]).tobytes() not in files, f"{row_id} is on disk"
    assert np.ascontiguousarray(X[4000]).tobytes() in files  # a row not forgotten is there
    counters = newest.manifest["stream"]["erasure"]["counters"]
    # every id not refused as never seen (a request that overtook its row, above) was forgotten
    assert counters["ids_forgotten"] >= len(gone - unknown) and counters["ids_refused"] >= 2, (
        counters,
        len(gone & unknown),
    )
    offsets = snapshot_offsets(newest)
    assert rig.committed() == {k: v for k, v in offsets.items() if k[0] != topics["forget"]}
    # the forget partition's commit is not held back by its receipts: it is the snapshot's, like the others'
    forget_committed = committed_offsets(kafka_bootstrap, rig.group, topics["forget"], 1)
    assert forget_committed == {0: offsets[(topics["forget"], 0)]}


@pytest.mark.kafka
def test_the_forget_command_sends_waits_for_the_receipts_and_verifies_the_disk(
    tmp_path, kafka_bootstrap, kafka_topics, capsys
):
    """``iolstream forget``: the requests out, each id's receipt (or refusal) printed once its snapshot is
    durable; ``--verify`` then finds no snapshot and no retention record holding their data."""
    from iolstream.tools import cli

    X, first, _ = the_stream()
    names = kafka_topics("features", "labels", "predictions", "dead", "forget", "receipts")
    topics = dict(
        zip(["features", "labels", "predictions", "dead_letters", "forget", "forget_receipts"], names)
    )
    produce.send(
        first[:20],
        producer_conf={"bootstrap.servers": kafka_bootstrap},
        features_topic=topics["features"],
        labels_topic=topics["labels"],
    )
    rig = WorkerRig(tmp_path, kafka_bootstrap, topics, exactly_once=False)
    worker, log = rig.start(idle=600)
    try:
        config = str(rig.config_path)
        capsys.readouterr()
        assert cli.main(["forget", "-c", config, "r500", "r610", "--wait", "90"]) == 0, log.read_text()[
            -3000:
        ]
        lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(r["id"], r["outcome"]) for r in lines] == [("r500", "receipt"), ("r610", "receipt")]
        assert cli.main(["forget", "-c", config, "r610", "--wait", "60"]) == 1  # asked again: refused
        (again,) = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert again["outcome"] == "refused" and again["reason"] == "forget_already_forgotten"
    finally:
        worker.terminate()
        worker.wait(60)
    assert cli.main(["forget", "-c", config, "--verify", "r500", "r610", "r700"]) == 1  # r700 is kept
    report = {r["id"]: r for r in map(orjson.loads, capsys.readouterr().out.splitlines())}
    for row_id in ("r500", "r610"):
        assert not report[row_id]["snapshots_holding"]
        assert report[row_id]["retention"] and not any(r["data"] for r in report[row_id]["retention"])
        assert [r["status"] for r in report[row_id]["retention"]] == ["erased"]
    assert [r["status"] for r in report["r700"]["retention"]] == ["labelled"] and report["r700"]["retention"][
        0
    ]["data"]
    assert cli.main(["forget", "-c", config, "--verify", "r500", "r610"]) == 0
