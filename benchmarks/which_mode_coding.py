"""The coding table of "Which mode: -F, -R or `auto`" in docs/benchmarks.md: is -F's accuracy loss inherent,
or a choice of ours?

Theorem 1 holds for any target coding (it is about the sums), so each data set is streamed by
``iolstream evaluate``'s protocol with ``mode: auto`` (its candidates are -F and -R, measured in one run) and
one change at a time: the class targets coded 0/1 one-hot (shipped), centred one-hot (y − 1/m) or ±1 (patched
into ``EdRVFL.one_hot`` for the experiment), no bias column, the vote ensemble, λ = 5, λ = 0.5·b. Prints one
markdown row per (set, change): prequential accuracy -F / -R, cumulative regret -F / -R, final test accuracy.

    nice -n 5 .venv/bin/python benchmarks/which_mode_coding.py digits segment breast_cancer wine
"""

from __future__ import annotations

import argparse

from iolstream.core import model as model_mod
from iolstream.tools.builtin_datasets import load
from iolstream.tools.protocol import Protocol, evaluate

CODINGS = {
    "01": lambda y: y,
    "centred": lambda y: y - 1.0 / y.shape[1],
    "pm1": lambda y: 2.0 * y - 1.0,
}
# label -> (model overrides, or None for λ = 0.5·b; coding)
CHANGES = {
    "0/1 one-hot (shipped)": ({}, "01"),
    "centred one-hot": ({}, "centred"),
    "±1": ({}, "pm1"),
    "no bias column": ({"bias_column": False}, "01"),
    "vote ensemble": ({"ensemble": "vote"}, "01"),
    "λ = 5": ({"lam": 5.0}, "01"),
    "λ = 0.5·b": (None, "01"),
}


def coded(kind: str):
    shipped = model_mod.EdRVFL.one_hot

    def one_hot(self, index):
        return CODINGS[kind](shipped(self, index))

    return one_hot, shipped


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sets", nargs="+")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print("| data | change | prequential -F / -R | regret -F / -R | test |\n|---|---|---|---|---|")
    for name in args.sets:
        data = load(name, seed=args.seed)
        protocol = Protocol(seed=args.seed)
        b = protocol.batch_rows(len(data.X) - int(round(protocol.test_fraction * len(data.X))))
        for label, (overrides, kind) in CHANGES.items():
            model = {"lam": 0.5 * b} if overrides is None else dict(overrides)
            one_hot, shipped = coded(kind)
            model_mod.EdRVFL.one_hot = one_hot
            try:
                (r,) = evaluate(data, model={**model, "seed": args.seed}, modes=("auto",), protocol=protocol)
            finally:
                model_mod.EdRVFL.one_hot = shipped
            f, rr = r.config["candidate_results"]
            print(
                f"| {name} | {label} | {f['prequential_metric']:.4f} / {rr['prequential_metric']:.4f} "
                f"| {f['cumulative_regret']:.4g} / {rr['cumulative_regret']:.4g} | {r.test_metric:.4f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
