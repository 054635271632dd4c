"""The scaler's warm-up: while the input scaler is not frozen, feature batches are held, not predicted
(``WarmUpHold``); its first W rows fix the scaling. Alone, the worker freezes it itself; in a group
(``ScalingAgreement``, ``stream.group.GroupState``) every member proposes its rows' scaling and the first
proposal in the log is everyone's. A forced step (shutdown, rebalance) never freezes it early: the
scaling would then depend on when the worker stopped.
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from iolstream.core import unit_ranges
from iolstream.stream.rows import FeatureRows, concat_rows, events_from_array

log = logging.getLogger("iolstream.processor")  # said by the processor, whose warm-up it is


class ScalingAgreement(Protocol):
    """Who decides the warm-up scalings when several workers share one model (group learning): the
    processor proposes its first W rows' input scaling, the model its target scaling; the agreed ones
    come back frozen into the model."""

    def propose_scaling(self, head: np.ndarray) -> None:
        """The first W rows' features: propose their input scaling."""

    def propose_targets(self, mean: np.ndarray, std: np.ndarray) -> None:
        """The warm-up labels' mean and spread: propose that target scaling."""


class WarmUpHold:
    """Feature batches taken while the warm-up scaler is not frozen: held in order (no prediction, no Gram)
    until the first W rows fix the scaling; then predicted in order, each after the labels of the ones
    before."""

    def __init__(self, n_features: int):
        self.n_features = n_features
        self.batches: list[FeatureRows] = []

    def __bool__(self) -> bool:
        return bool(self.batches)

    @property
    def rows(self) -> int:
        """Rows held."""
        return sum(len(r) for r in self.batches)

    def add(self, rows: FeatureRows) -> None:
        """Hold one batch."""
        self.batches.append(rows)

    def warm_up(self, scaler, agreement: ScalingAgreement | None) -> None:
        """Freeze ``scaler`` once the held batches hold its W rows: fitted on exactly the first W rows in one
        call, so the scaling never depends on where the batch boundaries fell (docs/design.md §4). With an
        ``agreement`` (group learning) the rows are proposed instead, and the group freezes it."""
        if self.rows < scaler.warmup_rows:
            return
        head = np.concatenate([rows.X for rows in self.batches])[: scaler.warmup_rows]
        if agreement is not None:
            return agreement.propose_scaling(head)
        scaler.partial_fit(head[scaler.count :])  # count > 0 only in a state saved by an older version
        scaler.freeze()

    def take(self) -> list[FeatureRows]:
        """Every held batch, in order; the hold is empty after."""
        batches, self.batches = self.batches, []
        return batches

    def drop(self, ids) -> list[str]:
        """Take the held rows of ``ids`` out (forgotten on request before they were predicted; the warm-up's
        first W rows are counted from the rows held, so a row taken out never enters the scaling); returns the
        ids taken."""
        wanted = set(ids)
        dropped, batches = [], []
        for rows in self.batches:
            keep = [i for i, row_id in enumerate(rows.ids) if row_id not in wanted]
            dropped += [row_id for row_id in rows.ids if row_id in wanted]
            if len(keep) == len(rows):
                batches.append(rows)
            elif keep:
                batches.append(FeatureRows([rows.ids[i] for i in keep], rows.X[keep], rows.ts[keep]))
        self.batches = batches
        return dropped

    def ids(self) -> set[str]:
        """The ids held (they are not in the join buffer yet)."""
        return {i for rows in self.batches for i in rows.ids}

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The state's ``held/*`` arrays: every row, and the size of each batch."""
        arrays = {f"held/{k}": v for k, v in concat_rows(self.batches, self.n_features).items()}
        arrays["held/sizes"] = np.array([len(rows) for rows in self.batches], dtype=np.int64)
        return arrays

    def load_arrays(self, arrays: dict) -> None:
        """Back from ``to_arrays`` (a state without sizes held one batch)."""
        held = {k[len("held/") :]: v for k, v in arrays.items() if k.startswith("held/")}
        if len(held.get("ids", ())):
            events = events_from_array(held["events"]) if "events" in held else None  # named-field rows
            rows = FeatureRows(
                [str(i) for i in held["ids"]], np.ascontiguousarray(held["X"]), held["ts"], events
            )
            bounds = np.concatenate([[0], np.cumsum(held.get("sizes", [len(rows)]))])
            self.batches = [rows.take(a, b) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def warn_if_linear(model, batches: list[FeatureRows]) -> None:
    """Say once, as the warm-up ends, when almost every random unit is linear or flat on the warm-up rows
    (``core.unit_ranges``): the hidden layers then add nothing to a linear model. Names the setting to change."""
    units = unit_ranges.of_model(model, np.concatenate([rows.X for rows in batches]))
    if units is not None and units.mostly_linear:
        log.warning("%s; set %s", units.describe(), units.remedy("model.{}: {}"), extra=units.fields)
