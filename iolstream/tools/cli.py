"""The ``iolstream`` command line: one subcommand per module, found through ``COMMANDS``.

A command module exposes ``add_parser(subparsers)``, which adds its parser, sets
``func`` (called with the parsed arguments, returning the exit code) and returns the
parser. Adding a command is one line in ``COMMANDS``. Only the module of the command
being run is imported; the others appear in ``iolstream --help`` through the one-line
summary given here, so ``iolstream --help`` imports none of them.

Errors of the user's making — a bad argument or bad data (``DataError``, ``ValueError``) —
print one line, ``iolstream <command>: error: <what is wrong>``, and exit with code 2.

    >>> main(["evaluate", "--dataset", "nosuch"])
    2
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from iolstream.kafka.errors import WorkerError

# Subcommand -> (module defining add_parser(subparsers), one-line summary for --help), in --help order.
COMMANDS = {
    "evaluate": (
        "iolstream.tools.evaluate",
        "run the IOL process over a data set and report it as the paper does",
    ),
    "simulate": ("iolstream.tools.simulate", "the paper's Supplementary F simulation: regrets of -R and -F"),
    "bench": ("iolstream.tools.bench", "throughput benchmarks against baselines measured in the same run"),
    "run": ("iolstream.tools.run", "run the Kafka worker: features and labels in, predictions out"),
    "produce": ("iolstream.tools.produce", "replay a data set into the features and labels topics"),
    "check": ("iolstream.tools.check", "check a config, its cluster and a CSV before a first run"),
    "seed": (
        "iolstream.tools.seed",
        "learn a worker's starting state from a CSV (a snapshot it resumes from)",
    ),
    "schema": (
        "iolstream.tools.schema",
        "infer a worker config (the feature schema) from a CSV of named fields",
    ),
    "snapshot": (
        "iolstream.tools.snapshot",
        "inspect worker snapshots: format, config, counters, offsets, checksum",
    ),
    "forget": (
        "iolstream.tools.forget",
        "forget rows by id: send the requests, wait for their receipts, or verify what the disk holds",
    ),
    "topics": (
        "iolstream.tools.topics",
        "the kafka-topics lines creating a worker config's topics (or --create them)",
    ),
    "warmup": (
        "iolstream.tools.warmup",
        "compile the kernels a worker config takes into the cache, ahead of its first start",
    ),
    "acls": (
        "iolstream.tools.acls",
        "the kafka-acls lines granting a worker (or producer) exactly what it needs",
    ),
}

EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (no usage dump) and exit code 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> ArgumentParser:
    """The full parser of ``command`` (importing its module); the others as one-line placeholders."""
    from iolstream import __version__

    parser = ArgumentParser(
        prog="iolstream",
        description="Incremental online learning of edRVFL networks with forward regularization.",
    )
    parser.add_argument("--version", action="version", version=f"iolstream {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    subparsers.required = True
    for name, (module, summary) in COMMANDS.items():
        if name == command:
            importlib.import_module(module).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv``: its first token that is not an option."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv=None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]), run the command, return its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return int(exc.code or 0)
    prog = f"iolstream {args.command}"
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # DataError, ConfigError and friends are ValueErrors
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except WorkerError as exc:  # e.g. the broker refused the client (kafka.errors.AccessDenied: exit 6)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141


if __name__ == "__main__":
    sys.exit(main())
