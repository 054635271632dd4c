"""The core suite's measurement: one full -F step of a config, its minimal FLOPs per row and the GEMM
rate NumPy reaches on the same shapes in the same run (``bench --suite core``; ``bench_kafka`` reuses it
for the learner-only rate beside the end-to-end one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from iolstream.core import candidates
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.work import minimal_flops_per_row

# setting name -> ModelConfig overrides (``--settings``); "fixed" is one -F learner, the others' yardstick
SETTINGS = {
    "fixed": {"mode": "forward"},
    "lam-auto": {"mode": "forward", "lam": "auto"},
    "forgetting-auto": {"mode": "forward", "forgetting": "auto"},
    "auto": {"mode": "forward", "lam": "auto", "forgetting": "auto"},
    "mode-auto": {"mode": "auto"},  # -F and -R: 2 candidates, one set of sums (A and A_r)
    "mode-lam-auto": {"mode": "auto", "lam": "auto"},
    "all-auto": {"mode": "auto", "lam": "auto", "forgetting": "auto"},
    # the fixed learner without the calibration (proba the mean of the layers' softmax): what calibrating costs
    "uncalibrated": {"mode": "forward", "calibration": "none"},
}

CONFIGS = {
    # name: (k, m, N, L, b)
    "small": (10, 10, 128, 4, 256),
    "poker": (10, 10, 989, 5, 2200),
}


def gemm_rate(shape_mk_kn: list[tuple[int, int, int]], dtype, seconds: float = 0.6) -> float:
    """GFLOP/s NumPy's matmul reaches on these (M, K, N) shapes: the better of one thread and
    all cores (on a shared machine either can win), each shape weighted like the workload."""
    import os

    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    operands = [
        (rng.standard_normal((m_, k_)).astype(dtype), rng.standard_normal((k_, n_)).astype(dtype))
        for m_, k_, n_ in shape_mk_kn
    ]
    best = 0.0
    for threads in sorted({1, os.cpu_count() or 1}):
        with threadpool_limits(limits=threads, user_api="blas"):
            total_flops, total_time = 0.0, 0.0
            for a, b in operands:
                a @ b  # warm
                reps, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds / len(operands):
                    a @ b
                    reps += 1
                total_time += time.perf_counter() - t0
                total_flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1] * reps
        best = max(best, total_flops / total_time / 1e9)
    return best


@dataclass
class CoreResult:
    """One measurement of the core suite: rows/s of a full -F step, its FLOPs and the GEMM rate."""

    config: str
    dtype: str
    k: int
    m: int
    n_nodes: int
    n_layers: int
    batch: int
    rows_per_second: float
    minimal_flops_per_row: float
    achieved_gflops: float
    gemm_gflops: float
    efficiency: float
    seconds: float
    flops_breakdown: dict
    setting: str = "fixed"
    candidates: int = 1
    cost_vs_fixed: float | None = None  # fixed rows/s ÷ these rows/s, same config and dtype, same run


def bench_core_step(
    name: str,
    dtype: str,
    *,
    seconds: float = 5.0,
    solver: str = "auto",
    setting: str = "fixed",
    gemm: float | None = None,
    mode: str | None = None,
) -> CoreResult:
    """One config, dtype and setting (SETTINGS); ``gemm``: the GEMM rate if already measured in this run; ``mode``:
    the setting's ``model.mode`` replaced (``bench --suite kafka --modes``)."""
    k, m, n_nodes, n_layers, b = CONFIGS[name]
    model = _bench_model(name, dtype, setting, solver=solver, mode=mode)
    rows_s, elapsed = _time_steps(model, k, m, b, seconds)
    flops = minimal_flops_per_row(k, m, n_nodes, n_layers, b)
    if gemm is None:
        shapes = [(b, k, n_nodes)] + [(b, n_nodes + k, n_nodes)] * (n_layers - 1)
        gemm = gemm_rate(shapes, np.float64 if dtype == "float64" else np.float32)
    achieved = flops["total"] * rows_s / 1e9
    return CoreResult(
        name,
        dtype,
        k,
        m,
        n_nodes,
        n_layers,
        b,
        rows_s,
        flops["total"],
        achieved,
        gemm,
        achieved / gemm,
        elapsed,
        flops,
        setting,
        len(model.learners),
    )


def _time_steps(model: EdRVFL, k: int, m: int, b: int, seconds: float) -> tuple[float, float]:
    """rows/s of full -F steps (observe batch t+1, learn batch t), after warm-up steps that load
    every kernel, let the model's StepTuner time each of its settings once and pass the scoring budget's early rows
    (``candidates.SCORE_ALL_ROWS``, every candidate scored on every batch: a stream's start, not its steady state)."""
    rng = np.random.default_rng(0)
    pool = 8
    xs = [rng.standard_normal((b, k)) for _ in range(pool)]
    ys = [np.eye(m)[rng.integers(0, m, b)] for _ in range(pool)]
    prev = model.observe(xs[0])
    steps, t0 = 0, time.perf_counter()
    tuner = model.thread_tuner
    warm = 2 + (2 * len(tuner.settings) if tuner is not None else 0)
    if len(model.learners) > 1:
        warm = max(warm, -(-candidates.SCORE_ALL_ROWS // b))
    while True:
        if steps == warm:
            t0 = time.perf_counter()
        i = steps + 1
        pred = model.observe(xs[i % pool])  # -F: Gram in, then predict
        # labels one batch late; each candidate (auto) judged on its own prediction, rows at their stamps
        model.learn(prev.features_t, ys[(i - 1) % pool], predicted=prev.predicted, observed_at=prev.clock)
        prev = pred
        steps += 1
        if steps > warm + 2 and time.perf_counter() - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    return (steps - warm) * b / elapsed, elapsed


@dataclass
class ForgetResult:
    """Forgetting b rows on request against learning b rows, the same model, interleaved in one run.

    learn_rows_per_second  : rows/s of full -F steps (observe batch t, learn batch t − 1)
    forget_rows_per_second : rows/s of taking b learned rows back out: their features recomputed from x, then
                             every candidate's sums at each row's weight and the refactorisation
                             (``EdRVFL.erase``, what a forget request costs the model)
    forget_vs_learn        : forget's seconds per row ÷ learn's (≤ 1: forgetting costs no more than learning)
    stamps                 : 1: the rows erased are one learned batch (one stamp: one Gram for every half-life);
                             2: halves of two batches (the general route: a Gram per half-life)
    """

    config: str
    dtype: str
    setting: str
    batch: int
    learn_rows_per_second: float
    forget_rows_per_second: float
    forget_vs_learn: float
    steps: int
    stamps: int = 1


def bench_forget_step(
    name: str, dtype: str, *, seconds: float = 5.0, setting: str = "fixed", stamps: int = 1
) -> ForgetResult:
    """Steps of ``CONFIGS[name]`` in ``setting``, each followed by the erasure of b learned rows (with their
    labels, at their stamps): the batch learned ``KEPT_BATCHES`` steps before (``stamps`` 1), or the second half
    of that one and the first half of the one after it (``stamps`` 2); both timed, in turn."""
    if stamps not in (1, 2):
        raise ValueError(f"stamps must be 1 or 2, got {stamps}")
    k, m, n_nodes, n_layers, b = CONFIGS[name]
    model = _bench_model(name, dtype, setting)
    rng = np.random.default_rng(0)
    learned: list[tuple] = []  # (x, targets, stamps) of the rows learned and not erased, oldest first
    prev = None
    learn_s = forget_s = 0.0
    half = b // 2
    steps, warm, started = 0, 4, time.perf_counter()
    while steps < warm + 3 or time.perf_counter() - started < seconds:
        x, y = rng.standard_normal((b, k)), np.eye(m)[rng.integers(0, m, b)]
        t0 = time.perf_counter()
        pred = model.observe(x)
        if prev is not None:
            model.learn(prev[0].features_t, prev[2], predicted=prev[0].predicted, observed_at=prev[0].clock)
            learned.append((prev[1], prev[2], np.full(b, prev[0].clock)))
        t1 = time.perf_counter()
        prev = (pred, x, y)
        forgot = 0.0
        if len(learned) > KEPT_BATCHES:
            if stamps == 1:
                old_x, old_y, old_s = learned.pop(0)
            else:  # the oldest batch's rows left (its second half), and the first half of the next one
                (ax, ay, a_s), (bx, by, b_s) = learned[0], learned[1]
                take = b - len(ax)
                old_x, old_y, old_s = (
                    np.concatenate([ax, bx[:take]]),
                    np.concatenate([ay, by[:take]]),
                    np.concatenate([a_s, b_s[:take]]),
                )
                learned[1] = (bx[take:], by[take:], b_s[take:]) if len(ax) != b else learned[1]
                if len(ax) == b:  # the first erasure: half of the oldest, to start the halves going
                    old_x, old_y, old_s = ax[:half], ay[:half], a_s[:half]
                    learned[0] = (ax[half:], ay[half:], a_s[half:])
                else:
                    learned.pop(0)
            t2 = time.perf_counter()
            model.erase(model.features(old_x), old_y, np.ones(len(old_x), dtype=bool), old_s)
            forgot = time.perf_counter() - t2
            erased_rows = len(old_x)
        else:
            erased_rows = 0
        steps += 1
        if steps == warm:
            started = time.perf_counter()
            learn_s = forget_s = 0.0
            timed_erased = 0
        elif steps > warm:
            learn_s += t1 - t0
            forget_s += forgot
            timed_erased += erased_rows
    timed = steps - warm
    learn_rate, forget_rate = timed * b / learn_s, timed_erased / forget_s
    return ForgetResult(
        name, dtype, setting, b, learn_rate, forget_rate, learn_rate / forget_rate, timed, stamps
    )


KEPT_BATCHES = 2  # the rows erased were learned this many steps before (or one more)


def _bench_model(
    name: str, dtype: str, setting: str, solver: str = "auto", mode: str | None = None
) -> EdRVFL:
    """A model of ``CONFIGS[name]`` in ``setting`` (SETTINGS), unscaled, no regret tracking, its thread pools set as
    the worker sets them; ``mode``: the setting's ``model.mode`` replaced."""
    from iolstream.core import step_tuner

    k, m, n_nodes, n_layers, _ = CONFIGS[name]
    model = EdRVFL(
        ModelConfig(
            n_inputs=k,
            n_outputs=m,
            n_nodes=n_nodes,
            n_layers=n_layers,
            scaler="none",
            dtype=dtype,
            solver=solver,
            track_regret=False,
            **{**SETTINGS[setting], **({} if mode is None else {"mode": mode})},
        )
    )
    step_tuner.configure_for_model(model)
    return model
