"""The exceptions of the Kafka adapter."""

from iolstream.ops.lifecycle import EXIT_ACCESS, EXIT_FATAL


class WorkerError(RuntimeError):
    """A condition the worker cannot continue from; the process exits with ``exit_code`` (EXIT_FATAL)."""

    exit_code = EXIT_FATAL


class AccessDenied(WorkerError):
    """The broker refused the client (authentication, TLS trust or a missing ACL): nothing to retry. The
    message is ``diagnose``'s one line; ``run``, ``produce`` and ``check`` exit with EXIT_ACCESS."""

    exit_code = EXIT_ACCESS
