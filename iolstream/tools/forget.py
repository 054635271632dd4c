"""``iolstream forget -c CONFIG ID ...``: ask the worker to forget rows, and see the proof (docs/data-protection.md).

Sends one request per id to ``topics.forget``, keyed by the id (as labels are: in a group, the member that
holds the row's partition gets it). With ``--wait S`` it then reads, for up to S seconds, each id's receipt
from ``topics.forget_receipts`` (the snapshot that first holds the model without the row is durable) or its
refusal from the dead-letter topic, and prints one JSON line per id. Exit 0 when every id has a receipt, 1
when one was refused or nothing came in time.

``--verify`` sends nothing: on the machine the worker runs on, it looks in the worker's snapshot directory
and retention store (``snapshot.dir``, ``retention.dir`` of the config) for what they hold of each id: which
snapshot files still hold the row (waiting for its label, in the micro-batcher or the warm-up hold, in the
label queue), which one a receipt names, and the retention store's records of it (their status, and whether
their features and label are still there). Exit 0 when nothing holds an id's data, 1 otherwise. The model's
sums are numbers, not rows: their proof is the receipt's snapshot.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

EXIT_OK, EXIT_NOT_DONE = 0, 1


def add_parser(subparsers):
    from iolstream.tools.arguments import non_negative_float

    p = subparsers.add_parser(
        "forget",
        help="ask the worker to forget rows by id, wait for their receipts, or verify what its disk holds of them",
        description=(
            "Send forget requests (topics.forget) for the ids given, one message per id keyed by it; with --wait, "
            "print each id's receipt or refusal. With --verify, send nothing: report what the worker's snapshots "
            "and retention store on this machine hold of each id."
        ),
    )
    p.add_argument("-c", "--config", required=True, help="the worker's YAML (see config/worker.yaml)")
    p.add_argument("ids", nargs="*", metavar="ID", help="row ids to forget")
    p.add_argument("--ids-file", metavar="FILE", help="more ids, one per line")
    p.add_argument("--bootstrap", metavar="HOST:PORT", help="override kafka.bootstrap_servers")
    p.add_argument(
        "--wait",
        type=non_negative_float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for every receipt or refusal (default: do not wait)",
    )
    p.add_argument("--verify", action="store_true", help="send nothing: what the disk holds of the ids")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    import dataclasses

    from iolstream.kafka.config import ConfigError, load_config

    ids = list(args.ids)
    if args.ids_file:
        ids += [line.strip() for line in Path(args.ids_file).read_text().splitlines() if line.strip()]
    if not ids:
        raise ValueError("no id given (ID arguments or --ids-file)")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"config: {exc}", file=sys.stderr)
        return 2
    if args.bootstrap:
        cfg = dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=args.bootstrap))
    if cfg.topics.forget is None:
        print("topics.forget is not set in the config: the worker takes no forget requests", file=sys.stderr)
        return 2
    if args.verify:
        return verify(cfg, ids)
    sent_ms = int(time.time() * 1000)
    send(cfg, ids)
    print(f"{len(ids)} forget request(s) sent to {cfg.topics.forget}", file=sys.stderr)
    if not args.wait:
        return EXIT_OK
    outcomes = wait(cfg, set(ids), args.wait, since_ms=sent_ms)
    for row_id in ids:
        print(json.dumps(outcomes.get(row_id, {"id": row_id, "outcome": "none yet"})))
    done = all(outcomes.get(i, {}).get("outcome") == "receipt" for i in ids)
    return EXIT_OK if done else EXIT_NOT_DONE


def send(cfg, ids: list[str]) -> None:
    from confluent_kafka import Producer

    from iolstream.kafka.clients import client_conf

    producer = Producer({**client_conf(cfg), "enable.idempotence": True, "acks": "all"})
    for row_id in ids:
        producer.produce(cfg.topics.forget, json.dumps({"id": row_id}).encode(), key=row_id.encode())
        producer.poll(0)
    left = producer.flush(cfg.kafka.call_timeout_seconds)
    if left:
        raise RuntimeError(f"{left} forget request(s) not delivered to {cfg.topics.forget}")


def wait(cfg, ids: set[str], seconds: float, since_ms: int = 0) -> dict[str, dict]:
    """Each id's receipt or refusal produced since ``since_ms`` (a receipt of an earlier request is not this
    one's), read from the receipts and dead-letter topics."""
    from confluent_kafka import Consumer

    from iolstream.kafka.clients import client_conf

    consumer = Consumer(
        {
            **client_conf(cfg),
            "group.id": f"iolstream-forget-{uuid.uuid4().hex[:12]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([cfg.topics.forget_receipts, cfg.topics.dead_letters])
    out: dict[str, dict] = {}
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not ids <= set(out):
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None or msg.timestamp()[1] < since_ms:
                continue
            if msg.topic() == cfg.topics.forget_receipts:
                receipt = json.loads(msg.value())
                if receipt.get("id") in ids:
                    out[receipt["id"]] = {"outcome": "receipt", **receipt}
                continue
            headers = dict(msg.headers() or [])
            if headers.get("iolstream.source.topic", b"").decode() != cfg.topics.forget:
                continue
            try:
                row_id = json.loads(msg.value()).get("id")
            except (ValueError, AttributeError):
                continue
            if row_id in ids and out.get(row_id, {}).get("outcome") != "receipt":
                out[row_id] = {
                    "id": row_id,
                    "outcome": "refused",
                    "reason": headers.get("iolstream.reason", b"").decode(),
                    "detail": headers.get("iolstream.detail", b"").decode(),
                }
    finally:
        consumer.close()
    return out


def verify(cfg, ids: list[str]) -> int:
    """What the snapshots and the retention store on this machine hold of ``ids`` (module docstring)."""
    from iolstream.kafka import snapshots
    from iolstream.stream.retention import record_shape, scan

    held = False
    report = {row_id: {"id": row_id, "snapshots_holding": [], "named_by_receipt": None} for row_id in ids}
    for path in snapshots.SnapshotStore(cfg.snapshot_dir, keep=cfg.snapshot.keep).paths():
        try:
            snap = snapshots.read(path)
        except snapshots.SnapshotError as exc:
            print(f"{path.name}: cannot be read ({exc})", file=sys.stderr)
            continue
        rows = set()
        for key in ("join/pending_ids", "join/early_ids", "batcher/ids", "held/ids", "queue/ids"):
            if key in snap.arrays:
                rows.update(str(i) for i in snap.arrays[key].tolist())
        erasure = snap.manifest.get("stream", {}).get("erasure", {})
        for receipt in erasure.get("sealed", []):
            if receipt.get("id") in report:
                report[receipt["id"]]["named_by_receipt"] = receipt.get("snapshot")
        for row_id in ids:
            if row_id in rows:
                report[row_id]["snapshots_holding"].append(path.name)
                held = True
    if cfg.retention_dir is not None and Path(cfg.retention_dir).is_dir():
        records = scan(cfg.retention_dir, ids, **record_shape(cfg.model))
        for row_id, found in records.items():
            report[row_id]["retention"] = found
            held |= any(r["data"] for r in found)
    for row_id in ids:
        print(json.dumps(report[row_id]))
    return EXIT_NOT_DONE if held else EXIT_OK
