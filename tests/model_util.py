"""A model streamed the way the paper's protocol and ``iolstream evaluate`` stream it, for the core tests."""

from __future__ import annotations


def stream_one_batch_late(model, x, y, b: int):
    """Predict each batch of b rows, learn its labels one batch late; with ``auto`` each candidate is judged on
    its own prediction (``Prediction.predicted``) and rows enter at their stamps (``Prediction.clock``).
    Returns ``model``."""
    prev = None
    for start in range(0, len(x), b):
        pred = model.observe(x[start : start + b])
        if prev is not None:
            model.learn(prev[0].features_t, prev[1], predicted=prev[0].predicted, observed_at=prev[0].clock)
        prev = (pred, model.encode_labels(y[start : start + b]))
    return model
