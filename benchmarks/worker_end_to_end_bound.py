"""The bound of "The worker end to end" (where the worker's time goes) in docs/benchmarks.md: how fast the worker
would be with free JSON, an upper bound for a compiled codec.

    .venv/bin/python benchmarks/worker_end_to_end_bound.py [--rows 240000] [--repeat 2] [--bootstrap HOST:PORT]

The kafka bench's worker run (small config, 256-row batch messages, a pre-produced stream on the
local broker; ``iolstream run`` in its own process), three ways, alternating:

- ``as_is``: the worker as shipped;
- ``decode_free``: the worker process reads its input topics before it starts and decodes every
  message with the real decoders; the timed run takes the decoded rows instead of decoding;
- ``json_free``: that, and every prediction is one constant message of the real size (encoding
  free; the produce calls, one per row, and the broker's work stay).

The learner alone (``bench_core_step``, the kafka bench's baseline) is measured before and after;
each worker rate is reported with its ratio to the learner's mean. If ``json_free`` stays below
0.6 of the learner, no JSON codec can reach it: what is left is the join, the step's bookkeeping, the
produce calls and the kernels. Needs a broker (``bash scripts/kafka.sh start``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

MODES = ("as_is", "decode_free", "json_free")


def _child(mode: str, argv: list[str]) -> int:
    """``iolstream run`` with the JSON of the chosen ``mode`` made free (see the module docstring)."""
    from confluent_kafka import Consumer, TopicPartition

    from iolstream.kafka.config import load_config
    from iolstream.stream import codec, encoding
    from iolstream.stream import processor as stream
    from iolstream.tools.cli import main

    if mode == "as_is":
        return main(["run", *argv])
    cfg = load_config(argv[argv.index("-c") + 1])
    mc = cfg.model
    target = codec.TargetSpec(mc.task, mc.classes, mc.m)
    decoded = {}  # (topic, partition, offset) -> what the decoder returns for that message
    consumer = Consumer(
        {
            "bootstrap.servers": cfg.kafka.bootstrap_servers,
            "group.id": "worker-bound-preread",
            "enable.auto.commit": False,
        }
    )
    for topic in (cfg.topics.features, cfg.topics.labels):
        for partition in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            consumer.assign([TopicPartition(topic, partition, low)])
            got = 0
            while got < high - low:
                for msg in consumer.consume(10_000, 1.0):
                    if msg.error() is None:
                        got += 1
                        if topic == cfg.topics.features:
                            value = codec.decode_features(
                                msg.value(), mc.n_inputs, max_bytes=cfg.stream.max_message_bytes
                            )
                        else:
                            value = codec.decode_labels(
                                msg.value(), target, max_bytes=cfg.stream.max_message_bytes
                            )
                        decoded[(topic, partition, msg.offset())] = value
    consumer.close()

    source = [None]  # of the message being handed to the processor
    on_features, on_labels = stream.StreamProcessor.on_features, stream.StreamProcessor.on_labels
    decode_features, decode_labels = codec.decode_features, codec.decode_labels

    def with_source(handler):
        def handle(self, value, src, now_ms):
            source[0] = src
            return handler(self, value, src, now_ms)

        return handle

    def cached(decode):
        def lookup(value, spec, *, max_bytes):
            hit = decoded.pop(source[0], None)  # warm-up messages are not in it: decoded as usual
            return hit if hit is not None else decode(value, spec, max_bytes=max_bytes)

        return lookup

    stream.StreamProcessor.on_features = with_source(on_features)
    stream.StreamProcessor.on_labels = with_source(on_labels)
    codec.decode_features, codec.decode_labels = cached(decode_features), cached(decode_labels)
    if mode == "json_free":
        import numpy as np

        proba = np.full((1, mc.m), 1.0 / 3)  # 0.3333333333333333: as long as most probabilities print
        one = encoding.encode_predictions(
            ["b123456"],
            np.array([1]),
            proba,
            model_version=12345,
            ts_in=np.array([1795677314784]),
            ts_out_ms=1795677314799,
            mode=mc.mode,
            classes=mc.classes,
        )[0]
        encoding.encode_predictions = lambda ids, *args, **kwargs: [one] * len(ids)
    return main(["run", *argv])


def _run(mode: str, rows: int, bootstrap: str, workdir: Path) -> float:
    from iolstream.tools import bench_kafka as bk
    from iolstream.tools import bench_names

    X, y = bk._data(rows)
    topics = bk._topics(f"bound-{mode}")
    try:
        n_nodes, n_layers = bk.CONFIGS["small"]
        snap_dir = workdir / f"snap-{topics[0]}"
        cfg = bk._worker_cfg(
            bootstrap, topics, n_nodes, n_layers, snap_dir, tuple(range(bk.M)), bk.BATCH["small"]
        )
        bk._ensure(cfg)
        bk._produce_stream(bk._producer(bootstrap), topics[0], topics[1], X, y, batch_rows=bk.BATCH["small"])
        worker = bk.WorkerProcess(
            cfg, workdir, stop_at_end=True, command=[sys.executable, __file__, "--child", mode]
        )
        worker.check(worker.wait(timeout=900))
        n, rate, _ = bk._prediction_times(bootstrap, topics[2], skip=bk.BATCH["small"])
        if n != rows:
            raise RuntimeError(f"{mode}: {n} predictions for {rows} rows; worker log: {worker.log}")
        return rate
    finally:
        bench_names.delete_topics(bootstrap, topics)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return _child(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=240_000)
    p.add_argument("--repeat", type=int, default=2, help="rounds of the three modes, alternating")
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    args = p.parse_args()
    from iolstream.tools.bench_core import bench_core_step

    learner = [bench_core_step("small", "float64", seconds=3.0).rows_per_second]
    rates = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="worker-bound-") as tmp:
        for _ in range(args.repeat):
            for mode in MODES:
                rates[mode].append(_run(mode, args.rows, args.bootstrap, Path(tmp)))
                print(f"{mode}: {rates[mode][-1]:,.0f} rows/s", file=sys.stderr, flush=True)
    learner.append(bench_core_step("small", "float64", seconds=3.0).rows_per_second)
    base = sum(learner) / len(learner)
    out = {
        "learner_rows_per_second": [round(r) for r in learner],
        "worker_rows_per_second": {m: [round(r) for r in rs] for m, rs in rates.items()},
        "worker_vs_learner": {m: [round(r / base, 3) for r in rs] for m, rs in rates.items()},
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
