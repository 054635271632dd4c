"""``iolstream forget --verify`` on the disk alone (no broker): every store of a snapshot that can hold an id's
data is read, a label held for a row that has not come among them."""

from __future__ import annotations

import orjson
import yaml

from iolstream.core.model import EdRVFL
from iolstream.kafka.config import load_config
from iolstream.kafka.snapshots import SnapshotStore
from iolstream.stream.processor import StreamProcessor
from iolstream.tools import cli


def test_verify_finds_a_label_held_for_a_row_that_has_not_come(tmp_path, capsys):
    path = tmp_path / "worker.yaml"
    raw = {
        "model": {"n_inputs": 2, "classes": [0, 1], "n_nodes": 8},
        "snapshot": {"dir": str(tmp_path / "snap")},
        "topics": {"forget": "iol.forget", "forget_receipts": "iol.forget-receipts"},
        "metrics": {"port": 0},
    }
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path, environ={"IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": "b:9"})
    proc = StreamProcessor(EdRVFL(cfg.model), cfg.stream, events=cfg.events)
    assert proc.on_labels(orjson.dumps({"id": "e3", "y": 1}), ("labels", 0, 0), 0) == []  # held early
    manifest, arrays = proc.to_state()
    manifest["offsets"] = []
    snap = SnapshotStore(cfg.snapshot_dir, cfg.snapshot.keep).write(manifest, arrays)
    assert cli.main(["forget", "-c", str(path), "--verify", "e3", "e4"]) == 1  # e3's label is on disk
    report = {r["id"]: r for r in map(orjson.loads, capsys.readouterr().out.splitlines())}
    assert report["e3"]["snapshots_holding"] == [snap.path.name] and report["e4"]["snapshots_holding"] == []
