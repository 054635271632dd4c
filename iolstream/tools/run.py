"""``iolstream run -c config/worker.yaml``: the long-running Kafka worker."""

from __future__ import annotations

import logging


def add_parser(subparsers):
    p = subparsers.add_parser("run", help="run the worker: features and labels in, predictions out")
    p.add_argument("-c", "--config", required=True, help="worker YAML (see config/worker.yaml)")
    p.add_argument("--bootstrap", help="override kafka.bootstrap_servers")
    p.add_argument("--max-seconds", type=float, help="stop (cleanly) after this long")
    p.add_argument(
        "--idle-stop-seconds",
        type=float,
        help="stop (cleanly) after this long without input while partitions are assigned",
    )
    p.add_argument(
        "--stop-at-end",
        action="store_true",
        help="stop (cleanly) once every assigned partition has reached the end it had when assigned (a finite input, "
        "as kcat -e does)",
    )
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    import dataclasses
    import faulthandler
    import os
    import time

    started = time.monotonic()
    faulthandler.enable()  # a crash in a C extension leaves the Python stack of every thread on stderr

    from iolstream.kafka.config import check_login, load_config
    from iolstream.kafka.worker import EXIT_FATAL, Worker, WorkerError
    from iolstream.ops import logs
    from iolstream.ops.lifecycle import EXIT_OK, SignalThread
    from iolstream.ops.process import configure_worker_threads

    # SIGTERM/SIGINT on a thread of their own, which a stuck main thread does not hold up
    worker: Worker | None = None

    def on_signal(signum: int) -> None:
        if worker is None:  # still starting: nothing consumed, nothing to save
            logging.getLogger("iolstream.worker").info("signal %d while starting: exiting", signum)
            os._exit(EXIT_OK)
        worker.request_stop(signum)

    SignalThread(on_signal).start()
    cfg = load_config(args.config)
    check_login(cfg.kafka)  # a SASL login without its password: one line naming the variable, exit 2
    if args.bootstrap:
        cfg = dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, bootstrap_servers=args.bootstrap))
    logs.setup(cfg.logging.level, cfg.logging.format)
    log = logging.getLogger("iolstream.worker")
    spin = configure_worker_threads()  # before the first parallel kernel (Worker preloads them)
    if spin is not None:
        log.debug("GOMP_SPINCOUNT=%s (set GOMP_SPINCOUNT or OMP_WAIT_POLICY to choose)", spin)
    metrics = None
    if cfg.metrics.port:
        try:
            from iolstream.ops.metrics import Metrics
        except ModuleNotFoundError as exc:  # a core dependency: only a broken install lacks it
            log.error(
                "cannot start: metrics.port %d needs %s: pip install prometheus-client, or metrics.port: 0",
                cfg.metrics.port,
                exc.name,
            )
            return EXIT_FATAL

        metrics = Metrics(cfg)
        try:  # up before the model loads: /healthz and /readyz answer 503 "starting" meanwhile
            metrics.serve()
        except OSError as exc:
            log.error("cannot start: metrics.port %s:%d: %s", cfg.metrics.host, cfg.metrics.port, exc)
            return EXIT_FATAL
    try:
        try:  # a refused login or certificate: AccessDenied (exit 6) at once, not waited out
            if metrics is not None:
                metrics.starting = f"waiting for the broker at {cfg.kafka.bootstrap_servers}"
            if not _broker_answers(cfg, started, args.max_seconds, log):
                return EXIT_FATAL
            if metrics is not None:
                metrics.starting = "loading the snapshot"
            worker = Worker(cfg, metrics=metrics)
        except WorkerError as exc:
            log.error("cannot start: %s", exc)
            return exc.exit_code
        if metrics is not None:
            metrics.attach(worker)
        return worker.run(
            max_seconds=None
            if args.max_seconds is None
            else max(0.1, args.max_seconds - (time.monotonic() - started)),
            idle_stop_seconds=args.idle_stop_seconds,
            stop_at_end=args.stop_at_end,
            freeze_startup=True,
        )
    finally:
        if metrics is not None:
            metrics.close()


def _broker_answers(cfg, started: float, max_seconds: float | None, log) -> bool:
    """Wait for the broker up to ``kafka.connect_timeout_seconds`` (or ``--max-seconds``, if sooner), a line
    naming the address and ``kafka.bootstrap_servers`` at most every 10 s; False if it never answered,
    ``AccessDenied`` if it refused us."""
    import time

    from iolstream.kafka import diagnose
    from iolstream.kafka.clients import client_conf

    deadline = started + cfg.kafka.connect_timeout_seconds
    if max_seconds is not None:
        deadline = min(deadline, started + max_seconds)
    return diagnose.wait_for_broker(client_conf(cfg), max(deadline, time.monotonic()), log) is not None
