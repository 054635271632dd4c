"""The table "What forgetting costs" of docs/benchmarks.md: rows/s of full -F steps (``mode: forward``; observe
batch t+1, learn batch t one batch late, with its stamp) with and without ``forgetting``, same run, one BLAS
thread.

Without forgetting a small batch (b·6 ≤ n) takes the Woodbury route (O(b·n² + b²·n + b³) per layer);
with forgetting every batch scales A by 2^(−b/h) off the prior, a change of A by a multiple of I and
not of rank b, so every batch is Gram + Cholesky (b·n² + n³/3 per layer), plus one pass over A and c
for the scaling (n² per layer) and, for labels whose weight is not 1, a √w-scaled copy of D (n·b).

    nice -n 10 .venv/bin/python benchmarks/forgetting_cost.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from iolstream.core.model import EdRVFL, ModelConfig

CASES = [  # (name, k, m, N, L, b)
    ("small b=256", 10, 10, 128, 4, 256),
    ("small b=16", 10, 10, 128, 4, 16),
    ("default b=256", 10, 2, 512, 2, 256),
    ("default b=32", 10, 2, 512, 2, 32),
    ("default b=1", 10, 2, 512, 2, 1),
]


def rows_per_second(k, m, n_nodes, n_layers, b, forgetting, seconds) -> float:
    model = EdRVFL(
        ModelConfig(
            n_inputs=k,
            n_outputs=m,
            n_nodes=n_nodes,
            n_layers=n_layers,
            mode="forward",
            scaler="none",
            track_regret=False,
            forgetting=forgetting,
        )
    )
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((b, k)) for _ in range(8)]
    ys = [rng.standard_normal((b, m)) for _ in range(8)]
    prev = model.observe(xs[0])
    steps, t0, warm = 0, time.perf_counter(), 3
    while True:
        if steps == warm:
            t0 = time.perf_counter()
        pred = model.observe(xs[(steps + 1) % 8])
        model.learn(prev.features_t, ys[steps % 8], predicted=prev.layer_outputs, observed_at=prev.clock)
        prev = pred
        steps += 1
        if steps > warm + 2 and time.perf_counter() - t0 >= seconds:
            return (steps - warm) * b / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with threadpool_limits(1):
        for name, k, m, n_nodes, n_layers, b in CASES:
            off = rows_per_second(k, m, n_nodes, n_layers, b, None, args.seconds)
            on = rows_per_second(k, m, n_nodes, n_layers, b, 5000.0, args.seconds)
            print(
                f"{name:15s} n={n_nodes + k + 1:4d}  off {off:10.0f} rows/s   forgetting {on:10.0f} rows/s   ratio {on / off:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
