"""Plain-NumPy twins of the kernels, a plain prediction encoder, and literal transcriptions of the paper's algorithms.

Slow and obvious on purpose: the reference every fast path is tested against.
Batches are numbered t = 1, 2, … as in docs/design.md §2.
"""

from __future__ import annotations

import numpy as np
import orjson

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


def activation(z, name):
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if name == "tanh":
        return np.tanh(z)
    if name == "selu":
        return SELU_SCALE * np.where(z > 0, z, SELU_ALPHA * (np.exp(z) - 1.0))
    if name == "swish":
        return z / (1.0 + np.exp(-z))
    if name == "leaky_relu":
        return np.where(z > 0, z, 0.01 * z)
    raise ValueError(name)


def edrvfl_features(x, weights_t, biases, act, bias_column=True):
    """D_l = [H_l | X | 1] for every layer, eqs. (1)-(2): list of (b, n) arrays."""
    ds, h = [], None
    for layer, (w_t, b) in enumerate(zip(weights_t, biases)):
        inputs = x if layer == 0 else np.hstack([h, x])
        h = activation(inputs @ w_t.T + b, act)
        cols = [h, x] + ([np.ones((x.shape[0], 1))] if bias_column else [])
        ds.append(np.hstack(cols))
    return ds


def woodbury(eta, d):
    """η − η Dᵀ (I + D η Dᵀ)⁻¹ D η, as printed in Algorithms 1 and 2."""
    s = np.eye(d.shape[0]) + d @ eta @ d.T
    return eta - eta @ d.T @ np.linalg.inv(s) @ d @ eta


def softmax(z):
    """Row-wise softmax, shifted by the row maximum (the textbook stable form)."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def paper_ridge(ds, ys, lam, etas=None):
    """Algorithm 1 / Theorem 2 for one layer. Returns [β_2, …, β_{T+1}] and the β that predicted each batch.
    ``etas``, if a list, receives η_1, …, η_T.

    η_t = η_{t-1} − η_{t-1} D_tᵀ (I + D_t η_{t-1} D_tᵀ)⁻¹ D_t η_{t-1}
    β_{t+1} = β_t − η_t (D_tᵀ D_t β_t − D_tᵀ Y_t)        (batch t predicted with β_t)
    """
    n, m = ds[0].shape[1], ys[0].shape[1]
    eta = np.eye(n) / lam
    beta = np.zeros((n, m))
    betas, used = [], []
    for d, y in zip(ds, ys):
        used.append(beta)
        eta = woodbury(eta, d)
        if etas is not None:
            etas.append(eta)
        beta = beta - eta @ (d.T @ d @ beta - d.T @ y)
        betas.append(beta)
    return betas, used


def paper_forward(ds, ys, lam, etas=None):
    """Algorithm 2 / Theorem 3 for one layer, labels one batch late.

    η_1 = (λI + D_1ᵀD_1)⁻¹, β_1 = 0; for t = 1 … T−1:
    η_{t+1} = η_t − η_t D_{t+1}ᵀ (I + D_{t+1} η_t D_{t+1}ᵀ)⁻¹ D_{t+1} η_t
    β_{t+1} = β_t − η_{t+1} (D_{t+1}ᵀ D_{t+1} β_t − D_tᵀ Y_t)       (batch t+1 predicted with β_{t+1})
    Returns [β_2, …, β_T] (β after labels of batch t and features of batch t+1).
    ``etas``, if a list, receives η_1, …, η_T.
    """
    n, m = ds[0].shape[1], ys[0].shape[1]
    eta = woodbury(np.eye(n) / lam, ds[0])
    if etas is not None:
        etas.append(eta)
    beta = np.zeros((n, m))
    betas = []
    for t in range(len(ds) - 1):
        d_next = ds[t + 1]
        eta = woodbury(eta, d_next)
        if etas is not None:
            etas.append(eta)
        beta = beta - eta @ (d_next.T @ d_next @ beta - ds[t].T @ ys[t])
        betas.append(beta)
    return betas


def offline_expert(ds_gram, ds_labelled, ys, lam, shape=None):
    """Closed form: argmin ½λ‖β‖² + ½Σ‖D_qβ − Y_q‖² + ½Σ_{unlabelled}‖Dβ‖² (Theorem 1).

    ``shape`` = (n, m) is needed only when both lists may be empty (then β = 0).
    """
    n, m = shape if shape is not None else ((ds_gram or ds_labelled)[0].shape[1], ys[0].shape[1])
    a = lam * np.eye(n) + sum((d.T @ d for d in ds_gram), np.zeros((n, n)))
    c = sum((d.T @ y for d, y in zip(ds_labelled, ys)), np.zeros((n, m)))
    return np.linalg.solve(a, c)


def expert_objective(ds_labelled, ys, lam):
    """min_β ½λ‖β‖² + Σ_q ½‖D_q β − Y_q‖², evaluated at the minimiser from the data itself (docs/design.md §3)."""
    beta = offline_expert(ds_labelled, ds_labelled, ys, lam)
    return 0.5 * lam * float((beta**2).sum()) + sum(
        0.5 * float(((d @ beta - y) ** 2).sum()) for d, y in zip(ds_labelled, ys)
    )


def forward_layer(a, c, d):
    """One layer of a -F step, Algorithm 2 in closed form: A ← A + DᵀD, β = A⁻¹c, prediction Dβ.

    a : (n, n) symmetric; c : (n, m); d : (b, n). Returns (A, β, Dβ)."""
    a = a + d.T @ d
    beta = np.linalg.solve(a, c)
    return a, beta, d @ beta


def fold_labels(c, d, y):
    """c ← c + DᵀY: labelled rows enter the right-hand side (both rules)."""
    return c + d.T @ y


def encode_predictions(
    ids, y_hat, proba, *, model_version, ts_in, ts_out_ms, mode, classes, scores=None, interval=None
) -> list[bytes]:
    """codec.encode_predictions, one dict and one orjson.dumps per row: the plain reference."""
    b = len(ids)
    if classes is not None:
        labels = [classes[i] for i in np.asarray(y_hat).reshape(b).tolist()]
    else:
        values = np.asarray(y_hat, dtype=np.float64).reshape(b, -1)
        labels = values[:, 0].tolist() if values.shape[1] == 1 else values.tolist()
    probas = np.asarray(proba, dtype=np.float64).reshape(b, -1).tolist() if proba is not None else None
    raw = np.asarray(scores, dtype=np.float64).reshape(b, -1).tolist() if scores is not None else None
    event = np.asarray(ts_in).reshape(b).tolist() if ts_in is not None else [-1] * b
    bounds = None
    if interval is not None and classes is None:
        bounds = []
        for bound in interval:
            bound = np.asarray(bound, dtype=np.float64).reshape(b, -1)
            bounds.append(bound[:, 0].tolist() if bound.shape[1] == 1 else bound.tolist())
    out = []
    for i in range(b):
        msg = {"id": ids[i], "y_hat": labels[i]}
        if bounds is not None:
            msg["y_lo"], msg["y_hi"] = bounds[0][i], bounds[1][i]
        if probas is not None:
            msg["proba"] = probas[i]
        if raw is not None:
            msg["scores"] = raw[i]
        msg["model_version"] = int(model_version)
        msg["ts"] = int(ts_out_ms)
        if event[i] >= 0:
            msg["event_ts"] = event[i]
        msg["mode"] = mode
        out.append(orjson.dumps(msg))
    return out


def label_messages(arriving, feats, ys, observed, rng):
    """The labels that arrive at one step of a delayed stream, shuffled and split into 1–3 messages:
    yields (picked [(batch, row)], features_t (L, n, k) of those rows, their Y, gram_in: their batch observed)."""
    rng.shuffle(arriving)
    for chunk in np.array_split(np.arange(len(arriving)), int(rng.integers(1, 4))):
        if chunk.size == 0:
            continue
        picked = [arriving[j] for j in chunk]
        f = np.ascontiguousarray(np.stack([feats[t][:, :, i] for t, i in picked], axis=2))
        y = np.stack([ys[t][i] for t, i in picked])
        yield picked, f, y, np.array([bool(observed[t]) for t, _ in picked])
