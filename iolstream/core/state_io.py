"""Model state <-> plain arrays and a small JSON manifest (no pickle, no code loaded).

The state is everything a run needs to continue bit for bit, and nothing that can be derived from it: the
config, the seed of the random weights (regenerated, and checked against a stored digest), the scaler, and
per learner that makes its own updates (one, or one per half-life of ``auto``) and per layer A and A_r (the
lower triangle, packed: ``pack_lower``), c, and P = A⁻¹ where Woodbury updates have moved it (it drifts from
A⁻¹ by round-off, so it is not derived). β and the Cholesky factors are solved again from these when first
read, with the very kernels that made them, so a restored model predicts the same bits; a λ or -R candidate
of ``auto`` saves only its counters and loss sums (its sums are its primary's). ``save_model`` /
``load_model`` store it as one ``.npz`` read with ``allow_pickle=False``; ``state_bytes`` is its size.

    >>> import io, numpy as np
    >>> from iolstream.core.model import EdRVFL, ModelConfig
    >>> m = EdRVFL(ModelConfig(n_inputs=3, n_nodes=8, n_layers=2, scaler="none"))
    >>> m.learn_rows(np.ones((4, 3)), np.arange(4.0)).shape
    (2,)
    >>> buf = io.BytesIO(); save_model(buf, m); _ = buf.seek(0)
    >>> restored = load_model(buf)
    >>> bool(np.array_equal(restored.learner.state.layers[1].beta, m.learner.state.layers[1].beta))
    True
"""

from __future__ import annotations

import json

import numpy as np

from iolstream.core import gram_cholesky
from iolstream.core.candidates import FIRST_GRID, MODE_CANDIDATES, candidate_grid, with_modes
from iolstream.core.learner_state import COUNTERS, LayerState
from iolstream.core.model import EdRVFL, ModelConfig
from iolstream.core.shared_gram import SharedGramLearner

FORMAT = "iolstream.model"  # the saved format's name (the module moved to core/; the name stays)
# 1: the first; 2: forgetting and auto (clock, candidates, selector, target scaling). Version-1 states
# load as they were written: no forgetting, one learner, raw regression targets, clock = rows observed.
# Version-2 states name their auto grid in selection["grid"]; those written before it did load with
# candidates.FIRST_GRID (an optional key, read both ways: the version stays 2). With ``mode: auto`` the
# selection also names each candidate's mode (selection["modes"]); without it, every one has the config's.
# 3: only what cannot be derived (module docstring): A and A_r packed, no β, no Cholesky factor, no candidate's
# copy of its primary's sums. Versions 1 and 2 load as written (their β and Woodbury P; a Cholesky factor is
# made again from A, the same bits).
FORMAT_VERSION = 3
READS = (1, 2, 3)
_COUNTERS = (*COUNTERS, "version", "labelled_version")  # labelled_version: saved since -R solves on A_r alone


class StateFormatError(ValueError):
    """A saved state that cannot be read: wrong format, version, or inconsistent contents."""


def _json_safe(value):
    if isinstance(value, tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def model_to_arrays(model: EdRVFL, prefix: str = "model/") -> tuple[dict, dict[str, np.ndarray]]:
    """(manifest, arrays): the manifest is JSON-able, the arrays plain numeric ndarrays."""
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": {k: _json_safe(v) for k, v in model.config.to_dict().items()},
        "weights_sha256": model.weights_digest(),
    }
    arrays = {f"{prefix}scaler/{k}": v for k, v in model.scaler.to_state().items()}
    if len(model.class_counts):  # saved since class weights: labelled rows per class
        arrays[f"{prefix}class_counts"] = model.class_counts.copy()
    if len(model.residual_counts):  # saved since regression intervals: the residual counts and their clock
        arrays[f"{prefix}residual_counts"] = model.residual_counts.copy()
        arrays[f"{prefix}residual_clock"] = np.array([model.residual_clock], dtype=np.int64)
    tgt = model.targets
    if model.config.task == "regression" and model.config.target_scaler != "none":
        arrays[f"{prefix}targets/mean"], arrays[f"{prefix}targets/std"] = tgt.mean, tgt.std
        manifest["targets"] = {"frozen": tgt.frozen, "held": []}
        for i, (f, y, gram_in, predicted, observed_at) in enumerate(
            tgt.held
        ):  # labels waiting for the scaling
            parts = {
                "features_t": f,
                "y": y,
                "gram_in": gram_in,
                "predicted": predicted,
                "observed_at": observed_at,
            }
            manifest["targets"]["held"].append([k for k, v in parts.items() if v is not None])
            arrays.update(
                {f"{prefix}targets/held{i}/{k}": np.asarray(v) for k, v in parts.items() if v is not None}
            )
    if len(model.learners) == 1:
        manifest.update(_learner_to_arrays(model.learner, arrays, prefix))
    else:  # auto: every candidate (a shared one: its counters and losses), and the selector's recent losses
        manifest["candidates"] = [
            _learner_to_arrays(ln, arrays, f"{prefix}cand{j}/") for j, ln in enumerate(model.learners)
        ]
        sel = model.selector
        manifest["selection"] = {
            "chosen": sel.chosen,
            "loss": [float(v) for v in sel.loss],
            "rows": sel.rows,
            "pair": [[float(v) for v in row] for row in sel.pair],
            "switches": sel.switches,
            "clock": sel.clock,
            "grid": [[_json_safe(lam), h] for lam, h in model.candidates],
            "scoring": model.scoring.to_state(),
            "predicted_rows": [int(v) for v in model.predicted_rows],
        }
        if model.config.mode == "auto":  # each candidate's mode, and the loss of what was emitted (regret)
            manifest["selection"]["modes"] = list(model.modes)
            manifest["selection"]["emitted_loss"] = [float(v) for v in model.emitted_loss]
    return manifest, arrays


def pack_lower(stack: np.ndarray) -> np.ndarray:
    """The lower triangles of an (L, n, n) stack (A_l = stack[l].T: the upper ones of its C blocks), column by column:
    (L, n(n+1)/2)."""
    rows, cols = np.triu_indices(stack.shape[1])
    return stack[:, rows, cols]


def unpack_lower(packed: np.ndarray, stack: np.ndarray) -> None:
    """``pack_lower`` undone into ``stack`` (L, n, n): the lower triangles, the rest 0."""
    n = stack.shape[1]
    if packed.shape != (stack.shape[0], n * (n + 1) // 2):
        raise ValueError(
            f"packed triangles of shape {packed.shape}, expected ({stack.shape[0]}, {n * (n + 1) // 2})"
        )
    rows, cols = np.triu_indices(n)
    stack[...] = 0.0
    stack[:, rows, cols] = packed


def _learner_to_arrays(ln, arrays: dict, base: str) -> dict:
    """One learner's counters and per-layer metadata (returned) and arrays (into ``arrays``): a learner that makes
    its own updates writes A and A_r (packed), c and a Woodbury P; a shared candidate its calibration sums alone."""
    shared = isinstance(ln, SharedGramLearner)
    st = ln.own_state()  # a candidate's counters and losses: no copy of its primary's sums is made
    arrays[f"{base}calibration"] = st.calibration.copy()  # its own calibration sums (core.calibration)
    if not shared:
        a = st.arrays
        arrays[f"{base}gram"] = pack_lower(a.gram)
        arrays[f"{base}rhs"] = a.rhs.copy()
        if len(a.gram_labelled):
            arrays[f"{base}gram_labelled"] = pack_lower(a.gram_labelled)
        for i, ls in enumerate(st.layers):
            # Woodbury's P = A⁻¹, once updated (it drifts from A⁻¹ by round-off): not derivable; P as rebuilt from
            # A (no update since) is made again on loading, the same bits
            if ls.factor_kind == "inverse" and ls.woodbury_steps:
                arrays[f"{base}layer{i}/inverse"] = a.factor[i].copy()
    return {
        "counters": {k: getattr(st, k) for k in _COUNTERS},
        "layers": [
            {
                "lam": ls.lam,
                "factor_kind": ls.factor_kind,
                "loss_sum": ls.loss_sum,
                "woodbury_steps": ls.woodbury_steps,
            }
            for ls in st.layers
        ],
    }


def saved_config(manifest: dict) -> ModelConfig:
    """The model config a saved state (or snapshot manifest) was made with, as this build spells it.

    Version 1 had no ``forgetting`` (off) and no ``target_scaler``: regression targets were raw ("none");
    classification does not scale targets, so it gets the default. A worker compares this, not the
    raw ``manifest["config"]``, with its own config. Raises StateFormatError naming the bad key."""
    try:
        return _config_from_json(manifest["config"])
    except (KeyError, TypeError, ValueError) as exc:  # unknown or invalid config keys
        raise StateFormatError(f"saved config does not load: {exc}") from None


def _config_from_json(cfg: dict) -> ModelConfig:
    cfg = dict(cfg)
    cfg.setdefault("forgetting", None)  # saved before forgetting existed
    if cfg.get("classes") is None:  # saved before regression targets were scaled: raw, as then
        cfg.setdefault("target_scaler", "none")
    for key in ("classes", "scaler_mean", "scaler_std", "target_mean", "target_std"):
        if cfg.get(key) is not None:
            cfg[key] = tuple(cfg[key])
    if isinstance(cfg.get("lam"), list):
        cfg["lam"] = tuple(cfg["lam"])
    return ModelConfig(**cfg)


def _saved_grid(manifest: dict, config: ModelConfig) -> tuple[list[tuple] | None, list[str] | None]:
    """The auto candidates a state was saved with and their modes: its selection's ``grid`` and ``modes`` (saved
    with ``mode: auto``; else every candidate has the config's mode), or, saved before the grid was (version 2
    until the half-life 16384 gave way to 512), candidates.FIRST_GRID. (None, None): one learner."""
    selection = manifest.get("selection")
    if selection is None:
        return None, None
    if "grid" not in selection:  # saved before mode: auto existed: one mode
        return with_modes(candidate_grid(config.lam, config.forgetting, *FIRST_GRID), config.mode)
    try:
        grid = [
            (tuple(lam) if isinstance(lam, list) else float(lam), None if h is None else float(h))
            for lam, h in selection["grid"]
        ]
        modes = [str(m) for m in selection.get("modes", [config.mode] * len(grid))]  # "modes": since auto
    except (TypeError, ValueError) as exc:
        raise StateFormatError(f"saved selection grid does not load: {exc}") from None
    if len(modes) != len(grid) or not set(modes) <= set(MODE_CANDIDATES):
        raise StateFormatError(f"saved selection modes {modes} do not fit the grid {grid}")
    if (config.default_candidate, config.default_mode) not in zip(grid, modes):
        raise StateFormatError(
            f"saved selection grid {grid} (modes {modes}) lacks the default setting "
            f"{config.default_candidate} ({config.default_mode})"
        )
    return grid, modes


def model_from_arrays(manifest: dict, arrays, prefix: str = "model/") -> EdRVFL:
    if manifest.get("format") != FORMAT or manifest.get("format_version") not in READS:
        raise StateFormatError(
            f"not an {FORMAT} state of version {' or '.join(map(str, READS))} "
            f"(got {manifest.get('format')} v{manifest.get('format_version')}; this build writes v{FORMAT_VERSION})"
        )
    if manifest["format_version"] == 1 and ({"candidates", "targets"} & manifest.keys()):
        raise StateFormatError("a version-1 state cannot hold auto candidates or target scaling")
    config = saved_config(manifest)
    grid, modes = _saved_grid(manifest, config)
    model = EdRVFL(config, candidates=grid, modes=modes)
    if model.weights_digest() != manifest["weights_sha256"]:
        raise StateFormatError(
            "the random weights regenerated from the seed differ from the saved ones (NumPy RNG change?)"
        )
    model.scaler.load_state({k.split("/")[-1]: arrays[k] for k in arrays if k.startswith(f"{prefix}scaler/")})
    if f"{prefix}class_counts" in arrays:
        model.class_counts = np.array(arrays[f"{prefix}class_counts"], dtype=np.float64).reshape(
            model.class_counts.shape
        )
    if f"{prefix}residual_counts" in arrays:  # saved before intervals: none, the interval starts empty
        model.residual_counts = np.array(arrays[f"{prefix}residual_counts"], dtype=np.float64).reshape(
            model.residual_counts.shape
        )
        model.residual_clock = int(np.asarray(arrays[f"{prefix}residual_clock"]).reshape(-1)[0])
    try:
        saved = manifest.get("targets")
        if saved is None:  # saved before targets were scaled, or not scaled: raw targets
            model.targets.frozen = True
        else:
            tgt = model.targets
            tgt.mean = np.asarray(arrays[f"{prefix}targets/mean"], dtype=np.float64).reshape(model.config.m)
            tgt.std = np.asarray(arrays[f"{prefix}targets/std"], dtype=np.float64).reshape(model.config.m)
            tgt.frozen = bool(saved["frozen"])
            names = ("features_t", "y", "gram_in", "predicted", "observed_at")
            tgt.held = [
                tuple(
                    np.asarray(arrays[f"{prefix}targets/held{i}/{k}"]) if k in keys else None for k in names
                )
                for i, keys in enumerate(saved["held"])
            ]
    except (KeyError, ValueError) as exc:
        raise StateFormatError(f"inconsistent saved target scaling: {exc}") from None
    try:
        version = manifest["format_version"]
        if len(model.learners) == 1:
            _learner_from_arrays(model.learner, manifest, arrays, prefix, version)
        else:
            saved = manifest["candidates"]
            if len(saved) != len(model.learners):
                raise ValueError(f"{len(saved)} candidates saved, the config makes {len(model.learners)}")
            for j, (ln, part) in enumerate(zip(model.learners, saved)):
                _learner_from_arrays(ln, part, arrays, f"{prefix}cand{j}/", version)
            for ln in model.learners:  # λ and -R candidates: their sums are their primary's, as restored
                if isinstance(ln, SharedGramLearner):
                    ln.mark_synced()
            sel = manifest["selection"]
            model.selector.chosen, model.selector.rows = int(sel["chosen"]), float(sel["rows"])
            model.selector.loss = np.asarray(sel["loss"], dtype=np.float64).reshape(len(saved))
            model.selector.pair = np.asarray(sel["pair"], dtype=np.float64).reshape(len(saved), len(saved))
            model.selector.switches = int(sel["switches"])
            model.selector.clock = int(sel.get("clock", 0))  # saved since group learning
            model.scoring.load_state(sel.get("scoring"))  # saved since candidates are scored on some batches
            saved_rows = sel.get("predicted_rows")  # before: every candidate predicted every row
            model.predicted_rows = np.array(
                [ln.state.rows_labelled for ln in model.learners] if saved_rows is None else saved_rows,
                dtype=np.int64,
            ).reshape(len(model.learners))
            if "emitted_loss" in sel:  # mode: auto
                model.emitted_loss = np.asarray(sel["emitted_loss"], dtype=np.float64).reshape(
                    config.n_layers
                )
    except (KeyError, ValueError) as exc:
        raise StateFormatError(f"inconsistent saved state: {exc}") from None
    return model


def _learner_from_arrays(ln, part: dict, arrays, base: str, version: int) -> None:
    shared = isinstance(ln, SharedGramLearner)
    st = ln.own_state()
    if (
        f"{base}calibration" in arrays
    ):  # saved before calibration: no sums, the clipped mean until labels come
        st.calibration = np.array(arrays[f"{base}calibration"], dtype=np.float64).reshape(
            st.calibration.shape
        )
    for key, value in part["counters"].items():
        if key in _COUNTERS:
            setattr(st, key, type(getattr(st, key))(value))
    if "clock" not in part["counters"]:  # saved before forgetting existed: every row seen was observed
        st.clock = st.rows_observed
    metas = list(part["layers"])
    if len(metas) != len(st.layers):
        raise ValueError(f"{base}: {len(metas)} layers saved, the config makes {len(st.layers)}")
    for ls, meta in zip(st.layers, metas):
        ls.lam, ls.loss_sum = float(meta["lam"]), float(meta["loss_sum"])
    a = st.arrays
    with (
        st.changing_gram()
    ):  # the sums as saved: factors and β made from them when first read, the bits they had
        if not shared and version >= 3:
            unpack_lower(_array(arrays, f"{base}gram"), a.gram)
            a.rhs[...] = _shaped(arrays, f"{base}rhs", a.rhs.shape)
            if len(a.gram_labelled):
                unpack_lower(_array(arrays, f"{base}gram_labelled"), a.gram_labelled)
    if shared:  # its β and sums are solved from its primary's
        return
    if version < 3:  # one array per layer, as written (β and a Woodbury P kept; a Cholesky factor made again)
        for i, (ls, meta) in enumerate(zip(st.layers, metas)):
            _restore_layer(ls, meta, arrays, f"{base}layer{i}/")
        return
    for i, (ls, meta) in enumerate(zip(st.layers, metas)):
        if meta["factor_kind"] == "inverse":
            steps = int(meta["woodbury_steps"])
            if steps:
                ls.factor = _shaped(arrays, f"{base}layer{i}/inverse", (ls.gram.shape[0],) * 2)
            else:  # rebuilt from A when it was last (learner._enter_gram)
                ls.factor = gram_cholesky.inverse_from_cholesky(gram_cholesky.cholesky(ls.gram))
            ls.factor_kind, ls.woodbury_steps = "inverse", steps


def _array(arrays, name: str) -> np.ndarray:
    return np.asarray(arrays[name], dtype=np.float64)


def _shaped(arrays, name: str, shape: tuple) -> np.ndarray:
    value = _array(arrays, name)
    if value.shape != tuple(shape):
        raise ValueError(f"{name}: shape {value.shape}, expected {tuple(shape)}")
    return value


def _restore_layer(ls: LayerState, meta: dict, arrays, base: str) -> None:
    """A layer of a version-1 or -2 state (full arrays per layer)."""

    def load(name, like):
        value = _shaped(arrays, base + name, like.shape)
        return np.asfortranarray(value) if like.flags.f_contiguous else np.ascontiguousarray(value)

    ls.gram = load("gram", ls.gram)
    ls.rhs = load("rhs", ls.rhs)
    ls.beta = load("beta", ls.beta)  # as written
    if meta["factor_kind"] == "inverse":  # Woodbury's P: as written; a Cholesky factor is made from A again
        ls.factor = load("factor", np.empty((ls.gram.shape[0],) * 2))
        ls.factor_kind, ls.woodbury_steps = "inverse", int(meta["woodbury_steps"])
    if ls.gram_labelled is not None:
        ls.gram_labelled = load("gram_labelled", ls.gram_labelled)


def save_model(file, model: EdRVFL) -> None:
    """Write the model to ``file`` (path or binary file object) as an .npz with its manifest."""
    manifest, arrays = model_to_arrays(model)
    arrays["__manifest__"] = np.frombuffer(json.dumps(manifest).encode(), dtype=np.uint8)
    np.savez(file, **arrays)


def load_model(file) -> EdRVFL:
    with np.load(file, allow_pickle=False) as data:
        if "__manifest__" not in data:
            raise StateFormatError("no __manifest__ in the saved state")
        manifest = json.loads(bytes(data["__manifest__"]).decode())
        return model_from_arrays(manifest, {k: data[k] for k in data.files})
