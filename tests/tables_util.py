"""A small table of a team's orders (text, gaps, booleans) as a CSV, for the tests of the commands and of the
worker on named fields."""

from __future__ import annotations

import csv

import numpy as np


def orders_csv(path, n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["order_id", "amount", "country", "device.os", "coupon", "is_fraud"])
        for i in range(n):
            amount = rng.lognormal(3, 1)
            country = rng.choice(["FR", "DE", "US"])
            fraud = amount > 40 and country != "FR"
            w.writerow(
                [
                    f"o-{i}",
                    "" if i % 9 == 0 else f"{amount:.2f}",
                    country,
                    rng.choice(["ios", "android", ""]),
                    rng.choice(["true", "false", ""]),
                    "true" if fraud else "false",
                ]
            )
    return path
