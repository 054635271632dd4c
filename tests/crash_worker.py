"""One worker process for the durability tests (tests/kafka/test_durability_kafka.py).

    python tests/crash_worker.py CONFIG.yaml [--idle-stop-seconds S] [--max-seconds S] [--stop-at-end]

The same path as ``iolstream run`` (``iolstream.tools.run.run``): YAML config, signal handlers,
exit codes. A test chooses where the process dies with the environment variable
IOLSTREAM_CRASH_AT="point:n" (see ``iolstream.ops.faults.crash_point``), or kills it itself.
"""

from __future__ import annotations

import argparse
import sys

from iolstream.tools import run as cmd_run


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--idle-stop-seconds", type=float)
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--stop-at-end", action="store_true")
    a = p.parse_args()
    args = argparse.Namespace(
        config=a.config,
        bootstrap=None,
        max_seconds=a.max_seconds,
        idle_stop_seconds=a.idle_stop_seconds,
        stop_at_end=a.stop_at_end,
    )
    return cmd_run.run(args)


if __name__ == "__main__":
    sys.exit(main())
