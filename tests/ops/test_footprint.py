"""The footprint formulas (``ops.footprint``) against what a model really holds: the arrays a snapshot writes and
the arrays a running model allocates, byte for byte, for every kind of learner set (one -F or -R learner, the
default -F and -R pair, λ and half-life candidates, the Woodbury route). Measured RSS: benchmarks/memory_formula.py."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from model_util import stream_one_batch_late

from iolstream.core import state_io
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.shared_gram import SharedGramLearner
from iolstream.kafka.config import config_from_dict
from iolstream.ops import footprint

SETTINGS = {
    "auto (default)": {},
    "forward": {"mode": "forward"},
    "forward, no regret": {"mode": "forward", "track_regret": False},
    "ridge": {"mode": "ridge"},
    "auto, lam auto": {"lam": "auto"},
    "auto, forgetting auto": {"forgetting": "auto"},
    "forward, Woodbury (b·6 ≤ n)": {"mode": "forward", "batch": 4},
}


def _streamed(setting: dict, seed: int = 50):
    setting = dict(setting)
    b = setting.pop("batch", 40)
    config = ModelConfig(
        n_inputs=4, classes=(0, 1, 2), n_nodes=30, n_layers=2, scaler="none", seed=seed, **setting
    )
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((12 * b, 4))
    model = stream_one_batch_late(EdRVFL(config), x, (x[:, 0] > 0).astype(int), b)
    return model, b


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_snapshot_formula_is_what_a_snapshot_writes(name):
    model, b = _streamed(SETTINGS[name])
    _, arrays = state_io.model_to_arrays(model)
    written = sum(v.nbytes for k, v in arrays.items() if "/scaler/" not in k and "/targets/" not in k)
    assert written == footprint.snapshot_model_bytes(model.config, b), name
    assert not any(k.endswith(("/beta", "/factor")) for k in arrays), sorted(arrays)  # derived, not written


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_memory_formula_is_what_the_model_allocates(name):
    """Sums, factors, the candidates' own arrays, the kept batch Grams and the scratch: as allocated after a
    stream (a candidate's copy of the sums is not, unless its state is read: the formula does not count it)."""
    model, b = _streamed(SETTINGS[name])
    held = model.batch_grams.nbytes
    scratch = 0
    for ln in model.learners:
        a = (ln._state if isinstance(ln, SharedGramLearner) else ln.state).arrays
        held += sum(x.nbytes for x in (a.gram, a.gram_labelled, a.factor, a.rhs, a.beta))
        if not isinstance(ln, SharedGramLearner) and ln._scratch is not None:
            scratch += ln._scratch.nbytes
    parts = footprint.model_memory(model.config, b, numba.config.NUMBA_NUM_THREADS)
    assert held == parts["sums"] + parts["factors"] + parts["candidates"] + parts["batch_grams"], name
    assert scratch == parts["scratch"], name
    net = model.network
    assert net.packed_weights_t.nbytes + net.packed_biases.nbytes == parts["weights"], name


def test_the_memory_estimate_adds_up_and_the_stores_are_their_bounds():
    raw = {
        "model": {"n_inputs": 4, "classes": ["ok", "fraud"]},
        "stream": {"max_pending_rows": 1000, "max_early_labels": 500, "remember_done": 2000},
        "group": {"enabled": True},
    }
    cfg = config_from_dict(raw, environ={})
    est = footprint.memory(cfg, threads=2, members=3)
    assert est.total == sum(est.parts.values()) and est.fixed < est.total
    stores = footprint.store_bounds(cfg, members=3)
    assert stores["pending_rows"] == 1000 * (
        footprint.pending_row_bytes(cfg.model) + footprint.PENDING_ROW_BYTES
    )
    assert stores["early_labels"] == 500 * footprint.EARLY_LABEL_BYTES
    assert stores["group_sums"] == 2 * footprint.snapshot_model_bytes(
        cfg.model, 256
    )  # the other two members'
    n = 512 + 4 + 1
    assert stores["feature_cache"] == min(footprint.FEATURE_CACHE_BYTES, 1000 * 2 * n * 8)
    assert est.parts["remembered_ids"] == 2000 * footprint.REMEMBERED_ID_BYTES
    # the default mode auto: A and A_r per layer, and two kept batch Grams, but no copy for the -R candidate
    assert est.parts["model.sums"] == 2 * 8 * 2 * n * n + 16 * 2 * n * 2
    assert (
        est.parts["model.batch_grams"] == 2 * 8 * 2 * n * n and est.parts["model.candidates"] == 8 * 2 * n * 2
    )
