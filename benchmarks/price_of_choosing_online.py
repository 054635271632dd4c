"""How many rows ``mode: auto`` takes to put -F in force once -F predicts better, by how many batches its scoring
budget scores the candidate not in force (docs/benchmarks.md, "The price of choosing online").

The stream: N(0, 1) random weights, λ = 2⁻⁶ (the paper's regime), N = ``--nodes``, L = ``--layers``, k = 10,
regression, batches of ``--batch`` rows, labels one batch late. Its first ``--before`` rows (past the budget's early
rows, every batch of which is scored: ``candidates.SCORE_ALL_ROWS``) have a large linear target (Supplementary F's:
β ~ N(20, 1), 15 % noise), where -R predicts better and stays in force; then the target changes to a noisy sine
of the inputs, where -R overshoots on the ill-conditioned sums and -F predicts better (tests/core/test_modes.py).
The same stream and random features for every setting; each row of the output is one ``scoring_share``: ``all``
(every batch) and the given shares, with the share of batches the -F candidate was scored on and the rows after the
change at which -F came into force (median, min and max over the seeds; "never" if not within the stream).

    .venv/bin/python benchmarks/price_of_choosing_online.py [--seeds 0 1 2 3 4] [--shares 0.15 0.1]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from iolstream.core.model import EdRVFL, ModelConfig


def stream(seed: int, before: int, after: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((before + after, 10))
    beta = rng.normal(20.0, 1.0, 10)
    linear = x[:before] @ beta + 0.15 * np.linalg.norm(beta) * rng.standard_normal(before)
    sine = np.sin(x[before:] @ rng.standard_normal(10)) + 0.5 * rng.standard_normal(after)
    return x, np.concatenate([linear, sine])


def switch_row(seed: int, share, args) -> tuple[int | None, float, str]:
    """(rows after the change until -F is in force, or None; the share of batches scored; the mode before it)."""
    before, batch = args.before, args.batch
    x, y = stream(seed, before, args.after)
    config = ModelConfig(
        n_inputs=10,
        n_outputs=1,
        n_nodes=args.nodes,
        n_layers=args.layers,
        init="normal",
        lam=2**-6,
        scaler="none",
        target_scaler="none",
        seed=seed,
        scoring_share=share,
    )
    model = EdRVFL(config)
    prev, at_change, switched = None, None, None
    for start in range(0, len(x), batch):
        if start >= before and at_change is None:
            at_change = model.effective["mode"]
        pred = model.observe(x[start : start + batch])
        if prev is not None:
            model.learn(prev[0].features_t, prev[1], predicted=prev[0].predicted)
        prev = (pred, model.encode_labels(y[start : start + batch]))
        if start >= before and switched is None and model.effective["mode"] == "forward":
            switched = start + batch - before
    return switched, model.scoring.scored_share, at_change


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--shares", type=float, nargs="+", default=[0.15, 0.1])
    p.add_argument("--before", type=int, default=6000)
    p.add_argument("--after", type=int, default=12000)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    args = p.parse_args()
    print(f"`{' '.join(['python', 'benchmarks/price_of_choosing_online.py', *sys.argv[1:]])}`\n")
    print(
        "| scoring_share | batches scored | mode before the change | rows to -F after it: median (min–max) |"
    )
    print("|---|---|---|---|")
    for share in ["all", *args.shares]:
        rows, scored, before_modes = [], [], set()
        for seed in args.seeds:
            r, q, mode = switch_row(seed, share, args)
            rows.append(r)
            scored.append(q)
            before_modes.add(mode)
        found = sorted(r for r in rows if r is not None)
        never = len(rows) - len(found)
        cell = f"{int(np.median(found)):,} ({found[0]:,}–{found[-1]:,})" if found else "never"
        if never:
            cell += f", never in {never} of {len(rows)}"
        print(f"| {share} | {np.mean(scored):.2f} | {', '.join(sorted(before_modes))} | {cell} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
