"""Comparison learners for ``iolstream evaluate --baseline``, driven by the same protocol.

Each implements ``evaluate.StreamLearner`` (start / arrive / label / predict / regret) and
learns from labels only, like -R: nothing changes when a batch's features arrive.

- ``os-elm``: OS-ELM (Liang et al., 2006) — one hidden layer H = g(X W + b) of N random
  nodes with no direct link, output weights by recursive least squares. The RLS starts
  from the prior P_0 = (λI)⁻¹ (the regularised OS-ELM) rather than from an initial block of
  N_0 ≥ N rows, so it predicts from the first batch. Same N, activation, init, λ, seed and
  scaler as the edRVFL run it is compared with; regret and bound as for a one-layer -R learner.
- ``river-softmax``: river's StandardScaler | SoftmaxRegression (LinearRegression for
  regression), one row at a time (learn_one / predict_proba_one).
- ``river-arf``: river's ARFClassifier / ARFRegressor (adaptive random forest), seeded.
- ``river-hat``: river's HoeffdingAdaptiveTreeClassifier / Regressor, seeded.

river is imported only when a river baseline is built.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from iolstream.core import blas_pools
from iolstream.core import learner as learner_mod
from iolstream.core import regret as regret_mod
from iolstream.core.model import ModelConfig, make_scaler
from iolstream.core.network import RandomNetwork
from iolstream.tools.dataset import DataError

BASELINES = ("os-elm", "river-softmax", "river-arf", "river-hat")


def make_baseline(name: str, split, config: ModelConfig):
    """The baseline ``name`` for the task of ``split``; ``config`` gives OS-ELM its hyperparameters."""
    if name == "os-elm":
        return OSELM(config)
    if name in ("river-softmax", "river-arf", "river-hat"):
        return RiverLearner(name, split, seed=config.seed)
    raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


class OSELM:
    """Online sequential ELM: one random hidden layer, RLS output weights (labels only)."""

    name = "os-elm"

    def __init__(self, config: ModelConfig):
        self.config = config
        k, n_nodes = config.n_inputs, config.n_nodes
        lam = ModelConfig.lam if config.lam == "auto" else config.lam  # auto: OS-ELM takes the default λ
        self.lam = max(learner_mod.as_lams(lam, config.n_layers))
        self.scaler = make_scaler(config)  # the model's: a feature schema z-scores its number columns only
        self.network = RandomNetwork.create(
            k, n_nodes, 1, activation=config.activation, init=config.init, seed=config.seed, bias_column=False
        )
        self.learner = learner_mod.OnlineLearner(n_nodes, config.m, 1, lam=self.lam, mode="ridge")
        self._classification = config.task == "classification"

    def start(self, x_head, batch_sizes=()):
        blas_pools.configure_blas()
        if blas_pools.blas_threads_for(self.config.n_nodes) == 1:
            threadpool_limits(
                limits=1, user_api="blas"
            )  # as step_tuner.configure_for_model does for small models
        if not self.scaler.frozen:
            self.scaler.partial_fit(x_head[: self.config.warmup_rows])
            self.scaler.freeze()

    def _hidden_t(self, x) -> np.ndarray:
        """Hᵀ, (1, N, b): the hidden block of the network's features, without the direct link."""
        features_t = self.network.features(self.scaler.transform(x))
        return np.ascontiguousarray(features_t[:, : self.config.n_nodes])

    def _decide(self, outputs: np.ndarray) -> np.ndarray:
        return outputs.argmax(axis=1) if self._classification else outputs

    def arrive(self, x):
        hidden_t = self._hidden_t(x)
        outputs = self.learner.layer_outputs(hidden_t)
        return (hidden_t, outputs), self._decide(outputs[0])

    def probabilities(self, handle):
        """The outputs clipped to [0.005, 1] and normalised (a ridge fit of one-hot targets has no softmax)."""
        if not self._classification:
            return None
        clipped = np.clip(handle[1][0], 0.005, 1.0)
        return clipped / clipped.sum(axis=1, keepdims=True)

    def label(self, handle, y) -> float:
        hidden_t, outputs = handle
        targets = _one_hot(y, self.config.m) if self._classification else y
        return float(self.learner.learn(hidden_t, targets, predicted=outputs)[0])

    def predict(self, x):
        chunks = (x[i : i + 4096] for i in range(0, len(x), 4096))
        return np.concatenate(
            [self._decide(self.learner.layer_outputs(self._hidden_t(c))[0]) for c in chunks]
        )

    def regret(self):
        st = self.learner.state
        ls = st.layers[0]
        expert = regret_mod.expert_loss(ls.rhs, ls.gram, st.sum_y2)
        n_nodes = self.config.n_nodes  # (N + k) of Theorem 4 becomes N: no direct link
        bound = regret_mod.bound_ridge(
            st.y_max, st.max_label_batch, n_nodes, st.label_batches, st.d_max, self.lam
        )
        return ls.loss_sum - expert, bound

    def describe(self) -> dict:
        c = self.config
        return {
            "learner": "OS-ELM (RLS, prior (λI)^-1)",
            "n_nodes": c.n_nodes,
            "lam": self.lam,
            "activation": c.activation,
            "init": c.init,
            "seed": c.seed,
            "scaler": c.scaler,
        }


class RiverLearner:
    """A river estimator fed one row at a time; predictions at arrival, learn_one when labels come."""

    def __init__(self, name: str, split, *, seed: int = 0):
        try:
            from river import forest, linear_model, preprocessing, tree
        except ImportError:
            raise DataError(f"baseline {name!r} needs river: pip install 'iolstream[data]'") from None
        self.name = name
        self._classification = split.task == "classification"
        self.m = split.n_outputs
        if not self._classification and self.m != 1:
            raise DataError(f"baseline {name!r} supports one regression target, the data set has {self.m}")
        if name == "river-softmax":
            estimator = (
                linear_model.SoftmaxRegression() if self._classification else linear_model.LinearRegression()
            )
            self.model = preprocessing.StandardScaler() | estimator
            self._label = f"river StandardScaler | {type(estimator).__name__}"
        elif name == "river-hat":
            kind = (
                tree.HoeffdingAdaptiveTreeClassifier
                if self._classification
                else tree.HoeffdingAdaptiveTreeRegressor
            )
            self.model = estimator = kind(seed=seed)
            self._label = f"river {type(estimator).__name__}"
        else:
            estimator = (
                forest.ARFClassifier(seed=seed) if self._classification else forest.ARFRegressor(seed=seed)
            )
            self.model = estimator
            self._label = f"river {type(estimator).__name__}"
        self.seed = seed

    def start(self, x_head, batch_sizes=()):
        pass  # river scales online (StandardScaler) or needs no scaling (trees)

    @staticmethod
    def _rows(x):
        rows = np.asarray(x, dtype=np.float64)
        if np.isnan(
            rows
        ).any():  # named fields with gaps: a missing number is a feature left out, River's way
            return [{j: v for j, v in enumerate(row) if v == v} for row in rows.tolist()]
        return [dict(enumerate(row)) for row in rows.tolist()]

    def _proba(self, row) -> np.ndarray:
        """River's probabilities over the m classes: those it has not seen at 0, as it says, normalised; uniform
        while it has seen no label (it returns nothing then: zeros would score 34.5 nats a row, the floor's)."""
        p = np.zeros(self.m)
        for cls, value in self.model.predict_proba_one(row).items():
            if 0 <= cls < self.m:
                p[cls] = value
        total = p.sum()
        return p / total if total > 0 else np.full(self.m, 1.0 / self.m)

    def arrive(self, x):
        rows = self._rows(x)
        if self._classification:
            proba = np.array([self._proba(r) for r in rows]).reshape(len(rows), self.m)
            return (rows, proba), proba.argmax(axis=1)
        values = np.array([self.model.predict_one(r) or 0.0 for r in rows], dtype=np.float64).reshape(-1, 1)
        return (rows, values), values

    def probabilities(self, handle):
        return handle[1] if self._classification else None

    def label(self, handle, y) -> float:
        rows, outputs = handle
        if self._classification:
            targets = _one_hot(y, self.m)
            for row, cls in zip(rows, y.tolist()):
                self.model.learn_one(row, cls)
        else:
            targets = y
            for row, value in zip(rows, y[:, 0].tolist()):
                self.model.learn_one(row, value)
        return float(0.5 * np.sum((outputs - targets) ** 2))

    def predict(self, x):
        rows = self._rows(x)
        if self._classification:
            return np.array([self._proba(r).argmax() for r in rows], dtype=np.int64)
        return np.array([self.model.predict_one(r) or 0.0 for r in rows], dtype=np.float64).reshape(-1, 1)

    def regret(self):
        return None, None

    def describe(self) -> dict:
        return {"learner": self._label, "seed": self.seed}


def _one_hot(index: np.ndarray, m: int) -> np.ndarray:
    out = np.zeros((len(index), m))
    out[np.arange(len(index)), index] = 1.0
    return out
