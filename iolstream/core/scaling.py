"""Feature scaling (docs/design.md §4): z-score, frozen once set, because the Gram is only
meaningful while the scaling never changes.

Modes: ``fixed`` (mean/std given), ``warmup`` (estimated from the first W rows,
then frozen and kept in the state), ``none``. A column with zero spread is
centred and left unscaled (std taken as 1) rather than divided by zero.

With a feature schema (docs/design.md §11) the scaler is told which columns to z-score (``scaled``: the
number values; one-hot, boolean and indicator columns keep their 0/1), and a number may be missing: NaN in
the raw row. The warm-up then estimates each column's mean and spread from the values present, and
``transform`` maps NaN to 0, the column's mean (with ``none``: to 0 itself).

A z-score (``warmup``, ``fixed``) is clipped to ±``Z_LIMIT`` (1,000 deviations of the scaling). Real inputs stay
inside (the largest of the built-in and real tables, a loan applicant's income, is at 234); a value far
outside (an amount of 1e10 where the warm-up saw tens, a unit error, a sentinel such as 9.99e307) would
otherwise square into the Gram at a scale where λ and every other row are lost to round-off, and the sums
stop being positive definite. Clipped, the row still gets its prediction, as an extreme one;
``beyond`` counts such values (the worker reports them).
"""

from __future__ import annotations

import numpy as np

SCALER_MODES = ("warmup", "fixed", "none")
Z_LIMIT = 1000.0  # a z-score beyond ±Z_LIMIT is clipped to it (module docstring)


class ScalerNotReady(RuntimeError):
    """The warm-up scaler has not yet seen its W rows."""


class Scaler:
    """z-score scaler with an explicit, array-only state.

    Examples
    --------
    >>> import numpy as np
    >>> s = Scaler("warmup", n_features=2, warmup_rows=3)
    >>> s.partial_fit(np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]))
    >>> s.frozen, s.transform(np.array([[2.0, 6.0]])).round(3).tolist()
    (True, [[0.0, 1.0]])
    """

    def __init__(
        self, mode: str, n_features: int, *, warmup_rows: int = 1000, mean=None, std=None, scaled=None
    ):
        if mode not in SCALER_MODES:
            raise ValueError(f"scaler mode must be one of {SCALER_MODES}, got {mode!r}")
        if mode == "warmup" and warmup_rows < 2:
            raise ValueError(f"warmup_rows must be ≥ 2, got {warmup_rows}")
        self.mode = mode
        self.n_features = n_features
        self.warmup_rows = warmup_rows
        self.count = 0
        self._sum = np.zeros(n_features)
        self._sumsq_dev = np.zeros(n_features)  # Σ (x - mean)² (Chan et al. parallel update)
        self.mean = np.zeros(n_features)
        self.scale = np.ones(n_features)
        self.frozen = mode == "none"
        # a schema's scaler: (n_features,) bool, the columns to z-score, and each one's values present so far
        self.scaled = None if scaled is None else np.asarray(scaled, dtype=bool).reshape(n_features)
        self._present = None if scaled is None else np.zeros(n_features, dtype=np.int64)
        if mode == "fixed":
            if mean is None or std is None:
                raise ValueError("scaler mode 'fixed' needs both mean and std")
            mean, std = np.asarray(mean, float), np.asarray(std, float)
            if mean.shape != (n_features,) or std.shape != (n_features,):
                raise ValueError(
                    f"scaler mean/std: expected {n_features} values each, got {mean.shape} and {std.shape}"
                )
            if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
                raise ValueError("scaler mean/std must be finite and std > 0")
            self.mean, self.scale, self.frozen = mean, std, True

    @property
    def rows_needed(self) -> int:
        """Rows still to be seen before the scaler freezes (0 when ready)."""
        return 0 if self.frozen else max(self.warmup_rows - self.count, 0)

    def partial_fit(self, x: np.ndarray) -> None:
        """Accumulate rows while warming up; freeze when W rows have been seen. No-op once frozen.

        Only the first W rows count (docs/design.md §4), so the frozen scaling does not depend on where the
        micro-batch boundaries fell: rows of ``x`` beyond the W-th are ignored.
        """
        if self.frozen or len(x) == 0:
            return
        x = np.asarray(x, dtype=np.float64)[: self.warmup_rows - self.count]
        if self.scaled is not None:
            return self._partial_fit_present(x)
        n_b = x.shape[0]
        mean_b = x.mean(axis=0)
        dev_b = ((x - mean_b) ** 2).sum(axis=0)
        if self.count == 0:
            mean_new, dev_new = mean_b, dev_b
        else:
            mean_old = self._sum / self.count
            total = self.count + n_b
            delta = mean_b - mean_old
            mean_new = mean_old + delta * n_b / total
            dev_new = self._sumsq_dev + dev_b + delta**2 * self.count * n_b / total
        self.count += n_b
        self._sum = mean_new * self.count
        self._sumsq_dev = dev_new
        if self.count >= self.warmup_rows:
            self.freeze()

    def _partial_fit_present(self, x: np.ndarray) -> None:
        """``partial_fit`` of a schema's scaler: per scaled column, over the values present (not NaN);
        Chan et al.'s update with each column's own count."""
        cols = x[:, self.scaled]
        present = ~np.isnan(cols)
        n_b = present.sum(axis=0)
        values = np.where(present, cols, 0.0)
        mean_b = values.sum(axis=0) / np.maximum(n_b, 1)
        dev_b = (np.where(present, cols - mean_b, 0.0) ** 2).sum(axis=0)
        n_old = self._present[self.scaled]
        total = n_old + n_b
        mean_old = self._sum[self.scaled] / np.maximum(n_old, 1)
        delta = mean_b - mean_old
        mean_new = np.where(n_old > 0, mean_old + delta * n_b / np.maximum(total, 1), mean_b)
        dev_new = self._sumsq_dev[self.scaled] + dev_b + delta**2 * n_old * n_b / np.maximum(total, 1)
        self._present[self.scaled] = total
        self._sum[self.scaled] = mean_new * total
        self._sumsq_dev[self.scaled] = dev_new
        self.count += x.shape[0]
        if self.count >= self.warmup_rows:
            self.freeze()

    def freeze(self) -> None:
        """Fix mean and std from what has been seen (at least 2 rows)."""
        if self.frozen:
            return
        if self.count < 2:
            raise ScalerNotReady(
                f"the warm-up scaler has seen {self.count} rows; it needs at least 2 to freeze"
            )
        if self.scaled is not None:  # per column, over the values present; columns not scaled keep 0 / 1
            n = self._present
            mean = np.where(self.scaled & (n > 0), self._sum / np.maximum(n, 1), 0.0)
            std = np.where(self.scaled & (n > 1), np.sqrt(self._sumsq_dev / np.maximum(n - 1, 1)), 1.0)
            self.mean = mean
            self.scale = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
            self.frozen = True
            return
        self.mean = self._sum / self.count
        std = np.sqrt(self._sumsq_dev / (self.count - 1))
        self.scale = np.where(std > 1e-12 * np.maximum(1.0, np.abs(self.mean)), std, 1.0)
        self.frozen = True

    def transform(self, x: np.ndarray) -> np.ndarray:
        if not self.frozen:
            raise ScalerNotReady(f"the warm-up scaler needs {self.rows_needed} more rows before it can scale")
        if self.scaled is not None:  # a schema's row: a missing number (NaN) is the mean, z = 0
            z = np.asarray(x, dtype=np.float64)
            z = z if self.mode == "none" else np.clip((z - self.mean) / self.scale, -Z_LIMIT, Z_LIMIT)
            return np.where(np.isnan(z), 0.0, z)
        if self.mode == "none":
            return np.asarray(x, dtype=np.float64)
        return np.clip((np.asarray(x, dtype=np.float64) - self.mean) / self.scale, -Z_LIMIT, Z_LIMIT)

    def beyond(self, x: np.ndarray) -> int:
        """How many values of the rows ``x`` ``transform`` clips (0 with ``none``, or before the scaling is set)."""
        if self.mode == "none" or not self.frozen:
            return 0
        with np.errstate(invalid="ignore"):  # a schema's missing number, NaN, is not beyond
            return int((np.abs((np.asarray(x, dtype=np.float64) - self.mean) / self.scale) > Z_LIMIT).sum())

    def to_state(self) -> dict:
        state = {
            "count": np.array(self.count),
            "sum": self._sum.copy(),
            "sumsq_dev": self._sumsq_dev.copy(),
            "mean": self.mean.copy(),
            "scale": self.scale.copy(),
            "frozen": np.array(self.frozen),
        }
        if self._present is not None:
            state["present"] = self._present.copy()
        return state

    def load_state(self, state: dict) -> None:
        if self.scaled is not None:  # a schema's scaler; every value was present if the count is all there is
            present = state.get("present")
            self._present = (
                np.full(self.n_features, int(state["count"]), dtype=np.int64)
                if present is None
                else np.array(present, dtype=np.int64).reshape(self.n_features)
            )
        self.count = int(state["count"])
        self._sum = np.array(state["sum"], dtype=float)
        self._sumsq_dev = np.array(state["sumsq_dev"], dtype=float)
        self.mean = np.array(state["mean"], dtype=float)
        self.scale = np.array(state["scale"], dtype=float)
        self.frozen = bool(state["frozen"])


class TargetScaler:
    """Regression targets z-scored as the inputs are (docs/design.md §4): mean and deviation of the first
    ``warmup_rows`` labels, then frozen, so that the ridge prior and -F's shrinkage pull toward the
    mean and not toward 0. The layers learn (y − μ)/σ; ``inverse`` maps their ensemble back.

    Until frozen, labelled batches are held (their Grams, under -F, are already in A) and enter, scaled,
    the moment the warmup_rows-th label arrives; held batches are part of the saved state.
    mean, std : (m,) float64; frozen : bool; held : [(features_t, Y, gram_in, predicted, observed_at)]
    """

    def __init__(self, m: int, warmup_rows: int, active: bool):
        self.mean, self.std = np.zeros(m), np.ones(m)
        self.warmup_rows = warmup_rows
        self.frozen = not active
        self.held: list[tuple] = []
        # group learning: gets (mean, std) once the warm-up labels are in, instead of freezing here; the group's
        # agreed scaling comes back through ``agree`` (stream.group)
        self.propose = None

    def transform(self, targets: np.ndarray) -> np.ndarray:
        return (targets - self.mean) / self.std

    def inverse(self, values: np.ndarray) -> np.ndarray:
        return values * self.std + self.mean

    def hold(self, features_t, targets, gram_in, predicted, observed_at) -> np.ndarray:
        """Keep a labelled batch until the scaling is known (freezing it once warmup_rows labels are in);
        returns its immediate losses ½‖D_l β_l − Y‖² per layer in the units of the targets."""
        copy = lambda a: None if a is None else np.array(a)  # noqa: E731 (the caller may reuse its arrays)
        self.held.append(
            (
                np.array(features_t),
                np.array(targets, dtype=np.float64),
                copy(gram_in),
                copy(predicted),
                copy(observed_at),
            )
        )
        if sum(len(h[1]) for h in self.held) >= self.warmup_rows:
            # the first warmup_rows labels, wherever the batches end (a replay after a restart may cut them elsewhere)
            y = np.concatenate([h[1] for h in self.held])[: self.warmup_rows]
            std = y.std(axis=0, ddof=1)
            mean, std = y.mean(axis=0), np.where(std > 0, std, 1.0)
            if self.propose is not None:
                self.propose(mean, std)
            else:
                self.mean, self.std, self.frozen = mean, std, True
        if predicted is None or np.ndim(predicted) != 3:
            return np.full(features_t.shape[0], np.nan)
        return 0.5 * ((np.asarray(predicted) - targets[None]) ** 2).sum(axis=(1, 2))

    def labels_mean(self) -> np.ndarray:
        """(m,) the mean of the labels held so far (0 before the first): what a model that has learned none of
        them predicts best, and where the scaling will centre."""
        if not self.held:
            return np.zeros_like(self.mean)
        return np.concatenate([h[1] for h in self.held]).mean(axis=0)

    def agree(self, mean, std) -> None:
        """Freeze to a scaling decided elsewhere (group learning: the first proposal in the log)."""
        mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
        if (
            mean.shape != self.mean.shape
            or std.shape != self.std.shape
            or not (np.isfinite(mean).all() and (std > 0).all())
        ):
            raise ValueError(
                f"target scaling: expected {len(self.mean)} finite means and deviations > 0, got {mean}, {std}"
            )
        self.mean, self.std, self.frozen = mean, std, True

    def drop(self, column: np.ndarray, y: np.ndarray, stamp) -> bool | None:
        """Take one labelled row out of the held batches (a row forgotten before the scaling was known,
        docs/design.md §13): the held column whose features match ``column`` (L, n) to round-off and whose label
        and stamp are ``y`` (m,) and ``stamp``. Rows alike in all three are interchangeable in every sum, so
        whichever is found is the one. Returns whether its Gram is in A already (the batch's ``gram_in``),
        None when no held row matches. Its label then never enters the warm-up statistics."""
        for i, (f, held_y, gram_in, predicted, observed_at) in enumerate(self.held):
            stamps = None if observed_at is None else np.broadcast_to(observed_at, (len(held_y),))
            for j in range(len(held_y)):
                if (
                    np.array_equal(held_y[j], y)
                    and (stamps is None or stamp is None or stamps[j] == stamp)
                    and np.allclose(f[:, :, j], column, rtol=1e-9, atol=1e-12)
                ):
                    in_a = True if gram_in is None else bool(gram_in[j])
                    keep = np.arange(len(held_y)) != j
                    if not keep.any():
                        del self.held[i]
                        return in_a
                    self.held[i] = (
                        np.ascontiguousarray(f[:, :, keep]),
                        held_y[keep],
                        None if gram_in is None else np.asarray(gram_in)[keep],
                        None if predicted is None else np.asarray(predicted)[..., keep, :],
                        observed_at if observed_at is None or np.ndim(observed_at) == 0 else stamps[keep],
                    )
                    return in_a
        return None

    def release(self) -> list[tuple]:
        """The held batches with their targets scaled, once frozen (and forgets them)."""
        out = [(f, self.transform(y), g, p, o) for f, y, g, p, o in self.held]
        self.held = []
        return out
