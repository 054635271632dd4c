"""The River baseline of ``iolstream bench --suite kafka``: River's ``SoftmaxRegression`` (after a
``StandardScaler``), predict-then-learn one row at a time, as a plain consumer loop on the same topics as
the worker: a label that comes before its row waits for it, as in the worker's join. It reads array
messages and named-field events (whose fields are River's dict of features as they come).
"""

from __future__ import annotations

import time
import uuid

import orjson

from iolstream.kafka import clients


def river_loop(bootstrap, features, labels, rows: int, timeout: float) -> float:
    """River SoftmaxRegression, predict-then-learn, as a plain consumer loop (rows/s from its first
    message)."""
    from river import linear_model, optim, preprocessing

    model = preprocessing.StandardScaler() | linear_model.SoftmaxRegression(optimizer=optim.SGD(0.01))
    c = clients.consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"river-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([features, labels])
    pending: dict[str, dict] = {}
    early: dict[str, object] = {}
    done = 0
    t0 = None
    deadline = time.monotonic() + timeout
    while done < rows and time.monotonic() < deadline:
        for msg in c.consume(500, 0.5):
            if msg.error():
                continue
            if t0 is None:
                t0 = time.monotonic()
            obj = orjson.loads(msg.value())
            is_features = msg.topic() == features
            events = obj if type(obj) is list else [obj] if "x" not in obj and "ids" not in obj else None
            if events is not None:  # named-field events (or a one-row label): River's own dicts
                ids = [e["id"] for e in events]
                values = (
                    [{k: v for k, v in e.items() if k not in ("id", "ts")} for e in events]
                    if is_features
                    else [e["y"] for e in events]
                )
            else:
                ids = obj["ids"] if "ids" in obj else [obj["id"]]
                key = "x" if is_features else "y"
                values = obj[key] if "ids" in obj else [obj[key]]
            if is_features:
                for i, x in zip(ids, values):
                    xd = x if type(x) is dict else dict(enumerate(x))
                    model.predict_one(xd)
                    if i in early:
                        model.learn_one(xd, early.pop(i))
                        done += 1
                    else:
                        pending[i] = xd
            else:
                ys = values
                for i, yv in zip(ids, ys):
                    xd = pending.pop(i, None)
                    if xd is None:
                        early[i] = yv
                    else:
                        model.learn_one(xd, yv)
                        done += 1
    seconds = time.monotonic() - (t0 or time.monotonic())
    c.close()
    return done / max(seconds, 1e-9)
