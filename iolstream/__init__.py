"""iolstream: incremental online learning of edRVFL networks with forward regularization.

The package is layered; imports flow one way::

    cli -> worker (Kafka adapter) -> stream / snapshot -> model -> learner -> kernels

The math core (``kernels``, ``linalg``, ``network``, ``learner``, ``model``) takes
arrays and returns arrays; it does no I/O.
"""

__version__ = "0.1.0"
