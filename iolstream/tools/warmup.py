"""``iolstream warmup -c CONFIG``: compile the Numba kernels a worker of CONFIG takes into the cache, ahead of
its first start.

A worker compiles its kernels at its first start when nothing is cached (about 50 s on 2 idle cores,
``stream.kernel_warmup.COLD_COMPILE_SECONDS``) and loads them in about a second afterwards. The cache is
``NUMBA_CACHE_DIR`` when set, else ``__pycache__`` beside iolstream's sources: run this where the worker will
run, with the same ``NUMBA_CACHE_DIR`` (an image's build step, an init container writing to a volume the
worker mounts). ``--all`` compiles every kind of model a config may ask for (both dtypes, classification and
regression, every mode, ``lam`` and ``forgetting`` auto), for an image that serves any config; the
container image's build runs it (docker/Dockerfile).

Exit 0 when compiled, 2 for a config that does not load (the line names the key).
"""

from __future__ import annotations


def add_parser(subparsers):
    p = subparsers.add_parser(
        "warmup",
        help="compile the kernels a worker config takes into the cache, ahead of its first start",
        description=(
            "Compile the Numba kernels a worker of CONFIG takes into the kernel cache (NUMBA_CACHE_DIR, else "
            "__pycache__ beside the sources), so that its first start loads them in about a second instead of "
            "compiling them. --all: every kind of model (for an image that serves any config)."
        ),
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "-c", "--config", help="worker YAML (see config/worker.yaml): the kernels its model takes"
    )
    which.add_argument(
        "--all", action="store_true", help="every kind of model: both dtypes, tasks and every mode"
    )
    p.add_argument("--quiet", action="store_true", help="print only the last line")
    p.set_defaults(func=main)
    return p


def main(args) -> int:
    import sys

    from iolstream.core import kernel_cache
    from iolstream.stream import kernel_warmup

    say = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if args.all:
        runs, what = kernel_warmup.every_kind(), "every kind of model"
    else:
        from iolstream.kafka.config import load_config

        model = load_config(args.config).model
        # the parallel kernels too, whatever this machine's cores: the worker's may have more (step_tuner.StepTuner)
        runs = kernel_warmup.kernel_runs(model, parallel=True)
        target = f"{len(model.classes)} classes" if model.classes else f"{model.n_outputs} outputs"
        what = f"{args.config} (mode {model.mode}, {model.dtype}, {target})"
    where = kernel_cache.cache_dir()
    cached = kernel_cache.cached_kernels()
    there = (
        f"{cached} kernels cached there already"
        if cached
        else f"nothing cached there yet: {kernel_warmup.COLD_COMPILE_SECONDS} for one model"
    )
    say(f"compiling the kernels of {what} into {where} ({there})")

    def progress(done: int, total: int, seconds: float, compiled: int) -> None:
        say(f"  {done}/{total} kernel sets ready ({seconds:.0f} s, {compiled} compilations)")

    warmed = kernel_warmup.run_all(runs, progress=progress)
    done = f"{warmed.compiled} compilations" if warmed.compiled else "all of them cached already"
    print(
        f"warmup: the kernels of {what} are in {where} ({warmed.seconds:.1f} s, {done}); a worker with this "
        "cache loads them at start in about a second"
    )
    return 0
