"""The one exception of the Kafka adapter."""


class WorkerError(RuntimeError):
    """A condition the worker cannot continue from; the process exits non-zero (EXIT_FATAL)."""
