"""The one exception of the Kafka adapter."""


class WorkerError(RuntimeError):
    """A condition the worker cannot continue from; the process exits with ``exit_code`` (EXIT_FATAL)."""

    exit_code = 3  # ops.lifecycle.EXIT_FATAL
