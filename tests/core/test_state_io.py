"""Model state round trip (docs/design.md §6): save → load → continue is bit for bit the run that never stopped.

Seeds are fixed and printed in every assertion message.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from blas_util import one_blas_thread  # noqa: F401 (autouse)

from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.state_io import FORMAT_VERSION, StateFormatError, load_model, model_to_arrays, save_model

K = 4
SEED = 20261125


def config(**kwargs) -> ModelConfig:
    base = dict(
        n_inputs=K, classes=(0, 1, 2), n_nodes=16, n_layers=3, scaler="none", refactor_every=4, seed=3
    )
    return ModelConfig(**{**base, **kwargs})


class Stream:
    """A deterministic -F/-R stream driver whose pending-label queue (the join buffer, which the
    snapshot stores separately) lives outside the model, so the model can be swapped mid-stream."""

    def __init__(self, seed: int):
        self.seed = seed
        self.pending = []  # (Prediction, Y) waiting for labels

    def run(self, model: EdRVFL, start: int, stop: int) -> None:
        for t in range(start, stop):
            rng = np.random.default_rng([self.seed, t])
            b = int(rng.integers(1, 5))  # small: Woodbury under "auto" (n = 21)
            x = rng.standard_normal((b, K)) * 2 + 1
            if not model.ready:
                model.scaler.partial_fit(x)
                if not model.ready:
                    continue
            m = model.config.m
            y = (
                model.encode_labels(rng.integers(0, m, b))
                if model.config.classes
                else rng.standard_normal((b, m))
            )
            pred = model.observe(x)  # -R: a pure prediction with the β in force
            self.pending.append((pred, y))
            if t % 3 == 2:  # some rows arrive with their labels and were never observed
                x_new = rng.standard_normal((2, K))
                model.learn_rows(
                    x_new, rng.integers(0, m, 2) if model.config.classes else rng.standard_normal((2, m))
                )
            while len(self.pending) > 2:  # labels two batches late
                pred, y = self.pending.pop(0)
                model.learn(pred.features_t, y, predicted=pred.predicted)
            if t % 7 == 6 and model.config.mode == "forward" and self.pending:  # an expired row: downdate
                pred, _ = self.pending.pop(0)
                model.learner.forget(pred.features_t)


def assert_bitwise(a: EdRVFL, b: EdRVFL, msg: str):
    sa, sb = a.learner.state, b.learner.state
    for key, value in vars(sa).items():
        if key not in ("layers", "arrays"):  # the arrays are compared layer by layer below
            assert np.array_equal(value, getattr(sb, key)), (
                f"{msg}: counter {key}: {value} != {getattr(sb, key)}"
            )
    for i, (la, lb) in enumerate(zip(sa.layers, sb.layers)):
        assert np.array_equal(la.beta, lb.beta), (
            f"{msg}: layer {i} β differs by {np.abs(la.beta - lb.beta).max():.3e}"
        )
        assert np.array_equal(la.rhs, lb.rhs), f"{msg}: layer {i} c"
        assert np.array_equal(np.tril(la.gram), np.tril(lb.gram)), f"{msg}: layer {i} A"
        assert (la.factor_kind, la.woodbury_steps, la.loss_sum) == (
            lb.factor_kind,
            lb.woodbury_steps,
            lb.loss_sum,
        ), msg
        factor_a, factor_b = (
            (la.factor, lb.factor)
            if la.factor_kind == "inverse"
            else (np.tril(la.factor), np.tril(lb.factor))
        )
        assert np.array_equal(factor_a, factor_b), f"{msg}: layer {i} factor"
        if la.gram_labelled is not None:
            assert np.array_equal(np.tril(la.gram_labelled), np.tril(lb.gram_labelled)), (
                f"{msg}: layer {i} A_r"
            )
    for key, value in a.scaler.to_state().items():
        assert np.array_equal(value, b.scaler.to_state()[key]), f"{msg}: scaler {key}"


CASES = {
    "forward-cholesky": dict(mode="forward", solver="cholesky"),
    "forward-woodbury": dict(mode="forward", solver="woodbury"),
    "forward-auto": dict(mode="forward", solver="auto"),
    "ridge-cholesky": dict(mode="ridge", solver="cholesky"),
    "ridge-woodbury": dict(mode="ridge", solver="woodbury"),
    "forward-mid-warmup": dict(mode="forward", solver="woodbury", scaler="warmup", warmup_rows=30),
    "ridge-mid-warmup": dict(mode="ridge", solver="cholesky", scaler="warmup", warmup_rows=30),
    "float32-lam-per-layer": dict(mode="forward", dtype="float32", lam=(0.5, 1.0, 2.0), ensemble="vote"),
    "regression-fixed-scaler": dict(
        classes=None,
        n_outputs=3,
        scaler="fixed",
        scaler_mean=(1.0,) * K,
        scaler_std=(2.0,) * K,
        ensemble="median",
        warmup_rows=40,  # the target scaling freezes after the save: held labels are saved and restored
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_save_load_continue_is_bitwise(case, tmp_path):
    cfg = config(**CASES[case])
    save_at, stop = (3, 30)  # mid-warmup cases: the scaler has seen ≈ 8 of its 30 rows at t = 3
    never_stopped, first_half = EdRVFL(cfg), EdRVFL(cfg)
    stream_a, stream_b = Stream(SEED), Stream(SEED)
    stream_a.run(never_stopped, 0, stop)
    stream_b.run(first_half, 0, save_at)
    if "warmup" in case:
        assert not first_half.ready and 0 < first_half.scaler.count < 30, f"{case}: not mid-warmup"
    if "regression" in case:
        assert first_half.targets.held and not first_half.targets.frozen, (
            f"{case}: labels not held at the save"
        )
    path = tmp_path / "model.npz"
    save_model(path, first_half)
    resumed = load_model(path)
    assert resumed.config == cfg
    assert_bitwise(first_half, resumed, f"{case}: right after load, seed={SEED}")
    stream_b.run(resumed, save_at, stop)
    assert never_stopped.learner.state.rows_labelled > 0 and never_stopped.ready
    assert_bitwise(never_stopped, resumed, f"{case}: continued, seed={SEED}")
    x = np.random.default_rng(SEED).standard_normal((7, K))
    assert np.array_equal(
        never_stopped.predict_batch(x).layer_outputs, resumed.predict_batch(x).layer_outputs
    )


@pytest.mark.parametrize("case", ["forward-woodbury", "ridge-cholesky"])
def test_save_twice_mid_stream(case):
    """Two saves (to file objects) at different points still continue bit for bit."""
    cfg = config(**CASES[case])
    never_stopped, resumed = EdRVFL(cfg), EdRVFL(cfg)
    stream_a, stream_b = Stream(SEED + 1), Stream(SEED + 1)
    stream_a.run(never_stopped, 0, 25)
    for start, stop in ((0, 9), (9, 17), (17, 25)):
        stream_b.run(resumed, start, stop)
        buf = io.BytesIO()
        save_model(buf, resumed)
        buf.seek(0)
        resumed = load_model(buf)
    assert_bitwise(never_stopped, resumed, f"{case}, seed={SEED + 1}")


def _saved(tmp_path, edit=None):
    model = EdRVFL(config(mode="forward"))  # one learner: the edits name its arrays
    Stream(SEED).run(model, 0, 6)
    manifest, arrays = model_to_arrays(model)
    if edit:
        edit(manifest, arrays)
    arrays["__manifest__"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    path = tmp_path / "state.npz"
    np.savez(path, **arrays)
    return path


def test_the_file_loads_without_pickle(tmp_path):
    model = EdRVFL(config(lam=(0.5, 1.0, 2.0), classes=("x", "y", "z")))
    model.learn_rows(np.ones((3, K)), ["x", "y", "z"])
    path = tmp_path / "state.npz"
    save_model(path, model)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    assert arrays and all(a.dtype != object for a in arrays.values())
    manifest = json.loads(bytes(arrays["__manifest__"]).decode())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["config"]["classes"] == ["x", "y", "z"]
    assert load_model(path).config == model.config


def test_an_object_array_is_refused(tmp_path):
    path = _saved(tmp_path)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["model/rhs"] = np.array([object()], dtype=object)
    np.savez(path, **arrays)  # written with pickle inside
    with pytest.raises(ValueError, match="allow_pickle"):
        load_model(path)


@pytest.mark.parametrize(
    "name,edit",
    [
        ("wrong version", lambda m, a: m.update(format_version=FORMAT_VERSION + 1)),
        ("wrong format", lambda m, a: m.update(format="something.else")),
        ("tampered digest", lambda m, a: m.update(weights_sha256="0" * 64)),
        ("other seed", lambda m, a: m["config"].update(seed=4)),  # weights regenerate differently
        ("wrong shape", lambda m, a: a.update({"model/gram": np.zeros((3, 3))})),
        ("wrong shape of c", lambda m, a: a.update({"model/rhs": np.zeros((3, 3))})),
        ("missing array", lambda m, a: a.pop("model/rhs")),
        ("layer count", lambda m, a: m["layers"].pop()),
        ("unknown config key", lambda m, a: m["config"].update(colour="blue")),
        ("invalid config", lambda m, a: m["config"].update(n_nodes=0)),
    ],
)
def test_bad_states_raise_state_format_error(name, edit, tmp_path):
    path = _saved(tmp_path, edit)
    with pytest.raises(StateFormatError):
        load_model(path)


def test_missing_manifest(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, beta=np.zeros(3))
    with pytest.raises(StateFormatError, match="manifest"):
        load_model(path)
