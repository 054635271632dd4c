"""iolstream: incremental online learning of edRVFL networks with forward regularization, on Kafka.

The package has five rooms, whose imports go one way (``tests/test_architecture.py`` checks it;
``docs/architecture.md`` draws it)::

    core    the math: kernels, network, learner, model, persistence      (numpy, scipy, numba)
    stream  the stream logic: codec, join buffer, processor               (core)
    kafka   the worker loop and the collaborators that hold its clients   (core, stream, ops)
    ops     metrics, logs, process set-up, signals, watchdog              (core, stream)
    tools   the CLI and its commands, data sets, baselines, benchmarks    (anything)

The public Python API:

    >>> from iolstream import EdRVFL, ModelConfig
    >>> model = EdRVFL(ModelConfig(n_inputs=4, classes=(0, 1), n_nodes=8, n_layers=2))
    >>> type(model).__name__
    'EdRVFL'

A worker's model, for batch scoring: ``iolstream.load_snapshot(path)`` (a snapshot file, or a snapshot
directory: its newest valid snapshot) returns its ``EdRVFL``; ``EdRVFLClassifier.from_snapshot(path)``
and ``EdRVFLRegressor.from_snapshot(path)`` wrap it as a fitted scikit-learn estimator.

The names load on first use (``iolstream --help`` must not wait for Numba; ``EdRVFLClassifier`` and
``EdRVFLRegressor``, the scikit-learn estimators of ``iolstream.estimators``, need scikit-learn).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name loads on first use (below)
    from iolstream.core.model import EdRVFL, ModelConfig
    from iolstream.core.snapshot_file import load_snapshot
    from iolstream.estimators import EdRVFLClassifier, EdRVFLRegressor

__version__ = "0.1.0"
__all__ = ["EdRVFL", "EdRVFLClassifier", "EdRVFLRegressor", "ModelConfig", "load_snapshot", "__version__"]
_HOMES = {
    "EdRVFL": "iolstream.core.model",
    "ModelConfig": "iolstream.core.model",
    "load_snapshot": "iolstream.core.snapshot_file",
    "EdRVFLClassifier": "iolstream.estimators",
    "EdRVFLRegressor": "iolstream.estimators",
}


def __getattr__(name: str):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'iolstream' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy names too, for ``dir(iolstream)`` and completion in a REPL."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
