"""docs/operations.md lists every metric a worker exports, and nothing it does not: a scrape of a worker with
auto candidates and group learning's families, against the table of "Health, readiness, metrics, logs"."""

from __future__ import annotations

import re
import time
import types
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.kafka.checkpoints import Checkpoint
from iolstream.kafka.config import config_from_dict
from iolstream.ops.metrics import Metrics
from iolstream.stream.config import StreamConfig
from iolstream.stream.processor import StreamProcessor

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
MODEL = {"n_inputs": 4, "classes": [0, 1], "n_nodes": 16, "lam": "auto", "scaler": "none"}


def documented() -> set[str]:
    """The names in the metrics table (its rows' first cells, `a`, `b` ...), without the prefix."""
    section = OPERATIONS.read_text().split("**Metrics**", 1)[1].split("\n\n", 2)[1]
    names = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            names.update(re.findall(r"`(\w+)`", row.split("|")[1]))
    return names


def exported() -> set[str]:
    cfg = config_from_dict({"model": MODEL, "metrics": {"port": 0}}, environ={})
    proc = StreamProcessor(EdRVFL(ModelConfig(**{**MODEL, "classes": (0, 1)})), StreamConfig(batch_rows=8))
    group = {
        "members": 2,
        "lag_ms": {"w2": 800},
        "lag_rows": {"w2": 12.0},
        "records": {},
        "bytes_out": 0,
        "bytes_in": 0,
        "sequences": {"w1": 3, "w2": 2},
        "log_positions": {0: 17},
        "unpublished": False,
    }  # every key kafka.group's status gives
    worker = types.SimpleNamespace(
        processor=proc,
        checkpoint=Checkpoint(),
        starting=None,
        last_tick=time.monotonic(),
        stopping=False,
        connected=True,
        partitions=1,
        replay_pending=False,
        broker_unreachable_seconds=None,
        group_status=group,
    )
    metrics = Metrics(cfg)
    metrics.attach(worker)
    metrics.on_stats(
        '{"topics": {"f": {"partitions": {"0": {"desired": true, "hi_offset": 5, "app_offset": 2}}}}}'
    )
    text = generate_latest(metrics.registry).decode()
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus-client's creation time of its own counters
            continue
        name = family.name.removeprefix("iolstream_")
        names.add(name + "_total" if family.type == "counter" else name)
    return names


def test_every_exported_metric_is_in_the_operations_table_and_no_other():
    docs, scraped = documented(), exported()
    assert scraped - docs == set(), (
        f"exported, not documented in docs/operations.md: {sorted(scraped - docs)}"
    )
    assert docs - scraped == set(), f"documented, not exported: {sorted(docs - scraped)}"
