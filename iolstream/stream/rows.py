"""What the codec yields and refuses: validated rows, the target they are labelled for, and the
reasons a message (or one row of it) is refused (docs/design.md §5). No I/O, no Kafka types.

    >>> rows = FeatureRows(["a", "b", "c"], np.zeros((3, 2)), np.array([-1, 5, -1]))
    >>> rows.take(1, 3).ids, FeatureRows.concat([rows.take(0, 1), rows.take(2, 3)]).ts.tolist()
    (['b', 'c'], [-1, -1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

REASONS: tuple[str, ...] = (
    "malformed_json",  # not JSON (also: empty value, NaN/Infinity tokens, numbers overflowing a double)
    "bad_schema",  # not an object, wrong types, ids/x lengths differ, empty batch
    "missing_id",  # id absent, null or ""
    "wrong_feature_count",
    "non_finite",  # null (NaN as serialised by orjson/JS) in x or a regression y
    "unknown_class",
    "bad_label",  # wrong type/shape of y for the task
    "oversize",  # value longer than max_bytes (checked before parsing)
    "unknown_id",  # label whose feature row never came within the wait
    "expired_id",  # label for a row that expired (or was evicted) before its label came
    "duplicate_id",  # feature row whose id is already pending/known, or repeated within a message
    "forgotten_id",  # a row or label for an id the model was asked to forget (docs/design.md §13)
    "forget_unknown_id",  # forget request: id never seen here (or past both the retention and the id memory)
    "forget_past_retention",  # forget request: the row was learned, but its record is past the retention
    "forget_already_forgotten",  # forget request: the id was forgotten before
    "forget_failed",  # forget request: the downdate would leave the model not positive definite (kept)
    "bad_field",  # a named field of the wrong type (text for a number, an object for a category)
    "missing_field",  # a required named field absent or null
)

# what a reason usually means, for the lines that name one (the status line, ``iolstream produce --follow``)
REASON_HINTS = {
    "malformed_json": "values that are not JSON",
    "bad_schema": "JSON that is not a features or labels message (docs/configuration.md#messages)",
    "missing_id": "rows without an id",
    "wrong_feature_count": "rows whose width is not model.n_inputs",
    "non_finite": "NaN or null in the features or a regression label",
    "unknown_class": "labels that are not one of model.classes",
    "bad_label": "labels of the wrong type or shape for the task",
    "oversize": "messages over stream.max_message_bytes",
    "unknown_id": "labels whose row never came (within stream.early_label_ttl_ms)",
    "expired_id": "labels for rows that expired before them (stream.row_ttl_ms)",
    "duplicate_id": "ids the worker has seen before: the same rows sent again? give new rows new ids "
    "(iolstream produce --id-prefix)",
    "forgotten_id": "rows or labels whose id was forgotten on request: forgotten ids stay out "
    "(docs/data-protection.md#refusals)",
    "forget_unknown_id": "forget requests for ids never seen here: a request ahead of its row, or another "
    "member's id (docs/data-protection.md#refusals)",
    "forget_past_retention": "forget requests for rows older than the retention (retention.rows, retention.ms)",
    "forget_already_forgotten": "forget requests for ids forgotten before (a repeated request)",
    "forget_failed": "forget requests the model could not apply (round-off): the rows stay; see the log",
    "bad_field": "event fields of another type than model.features declares (the detail names the field)",
    "missing_field": "events without a field model.features declares required (the detail names it)",
}

MAX_DETAIL_CHARS = 500


class BadInput(Exception):
    """Why a message (or one row of it) was rejected.

    reason : one of REASONS (stable: used in metrics and dead-letter headers)
    detail : one line naming what was wrong, e.g. "row 3: expected 18 features, got 17"
    """

    def __init__(self, reason: str, detail: str):
        if reason not in REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}; expected one of {REASONS}")
        detail = " ".join(str(detail).split())  # one line
        if len(detail) > MAX_DETAIL_CHARS:
            detail = detail[: MAX_DETAIL_CHARS - 3] + "..."
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"

    def __eq__(self, other) -> bool:
        if not isinstance(other, BadInput):
            return NotImplemented
        return (self.reason, self.detail) == (other.reason, other.detail)

    def __hash__(self) -> int:
        return hash((self.reason, self.detail))


@dataclass(frozen=True, slots=True)
class FeatureRows:
    """Validated feature rows.

    ids    : list of b unique non-empty str
    X      : ndarray of shape (b, k), float64, C-contiguous — all finite, except a missing number of
             a named-field event (NaN; docs/design.md §11)
    ts     : ndarray of shape (b,), int64 — event time in ms, -1 where absent
    events : named-field events: the b events (dicts) the rows were encoded from, for the predictions'
             passthrough fields and the dead letters; None for array rows
    """

    ids: list[str]
    X: np.ndarray
    ts: np.ndarray
    events: list | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, a: int, b: int) -> FeatureRows:
        """Rows [a, b) (views of X and ts, not copies)."""
        events = None if self.events is None else self.events[a:b]
        return FeatureRows(self.ids[a:b], self.X[a:b], self.ts[a:b], events)

    def keep(self, index: list[int]) -> FeatureRows:
        """The rows at ``index``, in that order (copies)."""
        events = None if self.events is None else [self.events[i] for i in index]
        return FeatureRows([self.ids[i] for i in index], self.X[index], self.ts[index], events)

    @staticmethod
    def concat(parts: list[FeatureRows]) -> FeatureRows:
        """The rows of ``parts`` one after the other (copies)."""
        ids = [row_id for p in parts for row_id in p.ids]
        events = None if any(p.events is None for p in parts) else [e for p in parts for e in p.events]
        return FeatureRows(
            ids, np.concatenate([p.X for p in parts]), np.concatenate([p.ts for p in parts]), events
        )


@dataclass(frozen=True, slots=True)
class LabelRows:
    """Validated labels.

    ids : list of b unique non-empty str
    Y   : classification: ndarray of shape (b,), int64 — index into TargetSpec.classes;
          regression: ndarray of shape (b, m), float64, all finite
    """

    ids: list[str]
    Y: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class TargetSpec:
    """What a label is: ``classification`` over declared ``classes`` (all int, all str, or false and true;
    at least 2, distinct; ``n_outputs == len(classes)``) or ``regression`` with ``n_outputs`` values."""

    task: str
    classes: tuple | None
    n_outputs: int

    def __post_init__(self):
        if self.task == "classification":
            classes = tuple(self.classes) if self.classes is not None else ()
            all_int = all(
                isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in classes
            )
            all_str = all(isinstance(c, str) for c in classes)
            all_bool = len(classes) == 2 and all(isinstance(c, (bool, np.bool_)) for c in classes)
            if len(classes) < 2 or len(set(classes)) != len(classes) or not (all_int or all_str or all_bool):
                raise ValueError(
                    f"classes must be at least 2 distinct ints or strings, or false and true, got {self.classes!r}"
                )
            classes = (
                tuple(int(c) for c in classes)
                if all_int
                else tuple(bool(c) for c in classes)
                if all_bool
                else classes
            )
            object.__setattr__(self, "classes", classes)
            if self.n_outputs != len(classes):
                raise ValueError(
                    f"n_outputs must equal the number of classes ({len(classes)}), got {self.n_outputs}"
                )
        elif self.task == "regression":
            if self.classes is not None:
                raise ValueError("regression takes no classes")
            if not isinstance(self.n_outputs, int) or isinstance(self.n_outputs, bool) or self.n_outputs < 1:
                raise ValueError(f"n_outputs must be an int >= 1, got {self.n_outputs!r}")
        else:
            raise ValueError(f"task must be 'classification' or 'regression', got {self.task!r}")

    @classmethod
    def classification(cls, classes) -> TargetSpec:
        """The target of a classification over ``classes``."""
        classes = tuple(classes)
        return cls("classification", classes, len(classes))

    @classmethod
    def regression(cls, n_outputs: int = 1) -> TargetSpec:
        """The target of a regression with ``m`` outputs."""
        return cls("regression", None, n_outputs)


def concat_rows(rows: list[FeatureRows], k: int) -> dict[str, np.ndarray]:
    """The ids, features and stamps of several row batches as three arrays (k: features, for none), and the
    events of named-field rows as a fourth (``events_array``)."""
    if not rows:
        return {"ids": np.array([], dtype="U1"), "X": np.empty((0, k)), "ts": np.empty(0, dtype=np.int64)}
    ids = [i for r in rows for i in r.ids]
    out = {
        "ids": np.array(ids, dtype=str),
        "X": np.concatenate([r.X for r in rows]),
        "ts": np.concatenate([r.ts for r in rows]).astype(np.int64),
    }
    if all(r.events is not None for r in rows):
        out["events"] = events_array([e for r in rows for e in r.events])
    return out


def events_array(events: list) -> np.ndarray:
    """Events (dicts) as a state array: one JSON text each (no pickle in a snapshot)."""
    return (
        np.array([orjson.dumps(e).decode() for e in events], dtype=str)
        if events
        else np.array([], dtype="U1")
    )


def events_from_array(array) -> list:
    """``events_array`` back to the events."""
    return [orjson.loads(text) for text in np.asarray(array).tolist()]
