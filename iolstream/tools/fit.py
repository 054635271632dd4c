"""Does a data set fit a worker's model? The rows' width against ``model.n_inputs``, and every distinct
label, encoded as ``iolstream produce`` sends it, through the worker's own label decoder
(``stream.codec``): a label the worker would dead-letter is named here, before anything is sent.

    >>> from iolstream.core.model import ModelConfig
    >>> model = ModelConfig(n_inputs=4, classes=("a", "b"))
    >>> mismatches(np.zeros((3, 13)), np.array(["a", "b", "c"]), "classification", model)
    ['the data has 13 features per row, model.n_inputs is 4', "label 'c' is not one of model.classes ['a', 'b']"]
    >>> mismatches(np.zeros((3, 4)), np.array(["a", "b", "a"]), "classification", model)
    []
"""

from __future__ import annotations

import numpy as np
import orjson

from iolstream.stream import codec
from iolstream.stream.rows import TargetSpec
from iolstream.tools.plan import label_value

MAX_NAMED = 5  # labels named in one message


def mismatches(X, y, task: str, model) -> list[str]:
    """What in (X, y) the model of ``model`` (a ModelConfig) would refuse, one line each; [] when it fits. ``X``:
    rows of numbers, or records of named fields (a model with a feature schema; checked when they were read)."""
    found = []
    y = np.asarray(y) if not isinstance(y, np.ndarray) else y
    if isinstance(X, np.ndarray) and X.shape[1] != model.n_inputs:
        found.append(f"the data has {X.shape[1]} features per row, model.n_inputs is {model.n_inputs}")
    if model.task == "classification":
        found += _class_mismatches(y, model)
    else:
        width = 1 if y.ndim == 1 else y.shape[1]
        if task == "classification" and y.dtype.kind in "US":
            found.append(
                "the target holds text labels, but the model is a regression (model.n_outputs); "
                "declare model.classes for classification"
            )
        elif width != model.n_outputs:
            found.append(f"the target has {width} values per row, model.n_outputs is {model.n_outputs}")
    return found


def _class_mismatches(y: np.ndarray, model) -> list[str]:
    target = TargetSpec(model.task, model.classes, model.m)
    refused = []
    for value in np.unique(y):
        label = label_value(value)
        message = orjson.dumps({"id": "fit", "y": label})
        rows, dead = codec.decode_labels(message, target, max_bytes=len(message) + 1)
        if rows is None or dead:
            refused.append(label)
    if not refused:
        return []
    named = ", ".join(repr(v) for v in refused[:MAX_NAMED]) + (
        f" and {len(refused) - MAX_NAMED} more" if len(refused) > MAX_NAMED else ""
    )
    many = "labels" if len(refused) > 1 else "label"
    verb = "are" if len(refused) > 1 else "is"
    return [f"{many} {named} {verb} not one of model.classes {list(model.classes)}"]
