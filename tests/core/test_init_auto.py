"""init auto: each activation draws its own weights, an explicit init is obeyed, and what is recorded
(config, snapshot, group digest) names the weights actually drawn, so older snapshots and group records
of the ReLU default still agree.

Seeds are fixed and printed in the assertion messages.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from iolstream.core import state_io
from iolstream.core.activation_kernels import ACTIVATIONS
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.network import AUTO_INITS, INITS, SPREAD, RandomNetwork, resolve_init
from iolstream.stream.group import model_digest

K = 6


def config(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(n_inputs=K, classes=(0, 1, 2), n_nodes=24, n_layers=3, seed=4), **kw})


def test_auto_is_the_default_and_every_activation_has_its_init():
    assert ModelConfig.init == "auto" and set(AUTO_INITS) == set(ACTIVATIONS)
    for activation in ACTIVATIONS:
        assert AUTO_INITS[activation] in INITS and AUTO_INITS[activation] != "auto"
        assert config(activation=activation).init == AUTO_INITS[activation], activation


@pytest.mark.parametrize("init", [i for i in INITS if i != "auto"])
@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_an_explicit_init_is_obeyed(init, activation):
    assert config(activation=activation, init=init).init == init
    assert resolve_init(init, activation) == init


def test_relu_auto_draws_bitwise_the_weights_of_the_former_default():
    """init: xavier was the default for every activation: ReLU (the default activation) keeps it bit for bit,
    so the default model, its snapshots and its results are today's."""
    for seed in range(3):
        auto, xavier = EdRVFL(config(seed=seed)), EdRVFL(config(seed=seed, init="xavier"))
        assert auto.weights_digest() == xavier.weights_digest(), f"seed={seed}"


def test_spread_scales_every_layer_by_its_own_fan_in():
    """Layer 1 takes the k inputs, deeper layers [H_{l-1} | X]: N + k. Weights N(0, s²/fan_in), biases N(0, s²)."""
    seed, k, n_nodes = 11, 150, 200
    for activation in ("sigmoid", "tanh", "relu"):
        net = RandomNetwork.create(k, n_nodes, 3, activation=activation, init="spread", seed=seed)
        s = SPREAD.get(activation, 1.0)
        for layer, (w_t, bias) in enumerate(zip(net.weights_t, net.biases)):
            fan_in = k if layer == 0 else n_nodes + k
            msg = f"{activation} layer {layer} seed={seed}"
            assert w_t.shape == (n_nodes, fan_in), msg
            assert abs(w_t.std() * np.sqrt(fan_in) / s - 1) < 0.03, msg
            assert abs(bias.std() / s - 1) < 0.2, msg  # 200 draws


def test_a_saved_model_records_the_resolved_init_and_loads_back():
    for activation in ("sigmoid", "relu"):
        model = EdRVFL(config(activation=activation, scaler="none"))
        model.learn_rows(np.random.default_rng(0).standard_normal((8, K)), np.arange(8) % 3)
        manifest, _ = state_io.model_to_arrays(model)
        assert manifest["config"]["init"] == AUTO_INITS[activation]
        buf = io.BytesIO()
        state_io.save_model(buf, model)
        buf.seek(0)
        restored = state_io.load_model(buf)
        assert restored.config == model.config and restored.weights_digest() == model.weights_digest()


def test_a_state_saved_with_xavier_before_auto_loads_as_xavier():
    """A sigmoid model saved when xavier was every activation's default keeps its weights: its config says
    xavier, which is obeyed (a worker configured with the new default sees a different model.init)."""
    model = EdRVFL(config(activation="sigmoid", init="xavier", scaler="none"))
    manifest, arrays = state_io.model_to_arrays(model)
    restored = state_io.model_from_arrays(manifest, arrays)
    assert restored.config.init == "xavier" and restored.weights_digest() == model.weights_digest()
    assert state_io.saved_config(manifest) != config(activation="sigmoid", scaler="none")


def test_group_records_of_the_former_default_agree():
    """Group members compare a digest of the config: the default (auto, ReLU) must equal the former explicit
    xavier, else a member upgraded in place would refuse its peers' sums."""
    assert model_digest(config()) == model_digest(config(init="xavier"))
    assert model_digest(config(activation="tanh")) != model_digest(config(activation="tanh", init="xavier"))


def test_unknown_init_is_refused_with_the_list():
    with pytest.raises(ValueError, match=r"model\.init: must be one of .*'auto'.*got 'orthogonal'"):
        config(init="orthogonal")
