"""The payload a predicted row carries while it waits for its label: one float64 row per feature row,
its fields named (``PAYLOAD``, saved in the state's manifest, checked when a state is read back).

- ``x``: the row's k features (its Gram is recomputed from them, or taken out again when it expires);
- ``position``: its column in its batch (a label batch that is exactly one observed batch, in order,
  reuses that batch's cached features);
- ``stamp``: the model's clock right after its batch was seen (forgetting: the weight its Gram has in A);
- ``candidate``: the candidate whose prediction was emitted (``lam`` / ``forgetting: auto``);
- ``outputs``: every candidate's layer outputs for the row (K·L·m), so each candidate is judged on the
  prediction it made itself;
- ``emitted``: the m numbers emitted for it, the probabilities (classification) or the value (regression): the
  prequential metrics score what was sent, whatever the calibration has learned since.

The join buffer and the group's handover move payloads without reading them; only the processor reads
fields, through ``PayloadLayout``.
"""

from __future__ import annotations

import numpy as np

PAYLOAD = ("x", "position", "stamp", "candidate", "outputs", "emitted")
BEFORE_EMITTED = ("x", "position", "stamp", "candidate", "outputs")  # the layout saved before "emitted"


class PayloadLayout:
    """Where each ``PAYLOAD`` field sits in a payload row (k features, K candidates, L layers, m outputs).

    >>> layout = PayloadLayout(n_features=2, n_candidates=1, n_layers=1, m=2)
    >>> rows = layout.build(np.ones((3, 2)), stamp=7, candidate=0, outputs=np.zeros((1, 1, 3, 2)),
    ...                     emitted=np.full((3, 2), 0.5))
    >>> rows.shape, layout.stamp(rows).tolist(), layout.position(rows).tolist()
    ((3, 9), [7, 7, 7], [0, 1, 2])
    """

    def __init__(self, n_features: int, n_candidates: int, n_layers: int, m: int):
        self.n_features, self.n_candidates, self.n_layers, self.m = n_features, n_candidates, n_layers, m
        k = n_features
        self._position, self._stamp, self._candidate = k, k + 1, k + 2
        self._outputs = k + 3
        self._emitted = k + 3 + n_candidates * n_layers * m
        self.width = self._emitted + m

    def build(
        self, x: np.ndarray, *, stamp: int, candidate: int, outputs: np.ndarray, emitted: np.ndarray
    ) -> np.ndarray:
        """The payload rows of one predicted batch: ``outputs`` of shape (K, L, b, m), ``emitted`` (b, m)."""
        b = len(x)
        payload = np.empty((b, self.width))
        payload[:, : self.n_features] = x
        payload[:, self._position] = np.arange(b)
        payload[:, self._stamp] = stamp  # rows seen so far: exact in float64 below 2⁵³
        payload[:, self._candidate] = candidate
        payload[:, self._outputs : self._emitted] = outputs.transpose(2, 0, 1, 3).reshape(b, -1)
        payload[:, self._emitted :] = np.asarray(emitted, dtype=np.float64).reshape(b, self.m)
        return payload

    def x(self, payload: np.ndarray) -> np.ndarray:
        """The rows' features, shape (b, k)."""
        return payload[:, : self.n_features]

    def position(self, payload: np.ndarray) -> np.ndarray:
        """Each row's column in its batch."""
        return payload[:, self._position].astype(np.int64)

    def stamp(self, payload: np.ndarray) -> np.ndarray:
        """The model's clock when each row's batch was seen."""
        return payload[:, self._stamp].astype(np.int64)

    def candidate(self, payload: np.ndarray) -> np.ndarray:
        """The candidate whose prediction was emitted for each row."""
        return payload[:, self._candidate].astype(np.int64)

    def outputs(self, payload: np.ndarray) -> np.ndarray:
        """Every candidate's layer outputs of the rows, shape (K, L, b, m)."""
        b = len(payload)
        shape = (b, self.n_candidates, self.n_layers, self.m)
        return payload[:, self._outputs : self._emitted].reshape(shape).transpose(1, 2, 0, 3)

    def emitted(self, payload: np.ndarray) -> np.ndarray:
        """What was emitted for each row, (b, m): its probabilities, or its value."""
        return payload[:, self._emitted :]


def upgrade(arrays: dict, version: int, layout, model) -> dict:
    """The pending rows' and queued labels' payloads in this version's layout (PAYLOAD). A version-1 state
    (before the stamps) holds x, position, L·m outputs of its one learner: the stamp column gets the
    clock (weight 1; such a state never forgets) and the candidate column 0. A state saved before "emitted"
    gets what its outputs give now (``model.combine`` by the candidate that emitted each row)."""
    if version != 1:
        if layout is not None and list(layout) == list(BEFORE_EMITTED):
            return _with_emitted(arrays, model)
        if layout is None or list(layout) != list(PAYLOAD):
            raise ValueError(
                f"pending rows saved with the payload layout {layout}; this build reads {list(PAYLOAD)}"
            )
        return arrays
    if len(model.learners) != 1 or model.learner.half_life is not None:
        raise ValueError("a version-1 state has no row stamps: it cannot forget nor hold auto candidates")
    k = model.config.n_inputs
    arrays = dict(arrays)
    for key in ("join/pending_X", "queue/payload"):
        if key in arrays:
            old = np.asarray(arrays[key], dtype=np.float64)
            extra = np.column_stack([np.full(len(old), float(model.learner.state.clock)), np.zeros(len(old))])
            arrays[key] = np.hstack([old[:, : k + 1], extra, old[:, k + 1 :]])
    return _with_emitted(arrays, model)


def _with_emitted(arrays: dict, model) -> dict:
    """Payloads of the layout before "emitted" with its m columns appended (the last field)."""
    mc = model.config
    layout = PayloadLayout(mc.n_inputs, len(model.learners), mc.n_layers, mc.m)
    arrays = dict(arrays)
    for key in ("join/pending_X", "queue/payload"):
        if key not in arrays:
            continue
        old = np.asarray(arrays[key], dtype=np.float64)
        padded = np.hstack([old, np.zeros((len(old), mc.m))])
        outputs, chosen = layout.outputs(padded), layout.candidate(padded)
        emitted = np.zeros((len(old), mc.m))
        for candidate in np.unique(chosen):
            rows = np.flatnonzero(chosen == candidate)
            proba, _, value = model.combine(outputs[candidate][:, rows], int(candidate))
            emitted[rows] = proba if proba is not None else value
        padded[:, layout._emitted :] = emitted
        arrays[key] = padded
    return arrays
