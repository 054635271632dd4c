"""The table "First start: compiling the kernels" of docs/benchmarks.md: what a first start costs. The kernels
compiled from an empty Numba cache, by a worker (what ``iolstream run`` loads before its first message:
``stream.kernel_warmup.preload`` of its config) and by the Python API's first ``fit`` (the README's wine example); then the
same worker start with the cache filled. Each in a fresh process with its own
empty ``NUMBA_CACHE_DIR``; wall seconds and CPU seconds (user + system) of that process. CPU seconds are the
comparable figure on a shared machine.

    nice -n 10 python benchmarks/first_start.py [--config config/minimal.yaml] [--tree PATH ...] [--rounds 2]

``--tree DIR`` runs another copy of the package (DIR first on PYTHONPATH), e.g. the commit before a change:
``git archive COMMIT iolstream | tar -x -C DIR``; the trees are measured in turn, round by round.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import sys
from iolstream.core import step_tuner
from iolstream.core.model import EdRVFL
from iolstream.kafka.config import load_config
from iolstream.stream import kernel_warmup
cfg = load_config(sys.argv[1])
model = EdRVFL(cfg.model)
step_tuner.configure_for_model(model)
tuner = model.thread_tuner
kernel_warmup.preload(cfg.model, parallel=tuner is not None and any(s.parallel for s in tuner.settings))
"""

API = """
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split
from iolstream import EdRVFLClassifier
X, y = load_wine(return_X_y=True)
X_tr, X_te, y_tr, y_te = train_test_split(X, y, random_state=0, stratify=y)
clf = EdRVFLClassifier(n_nodes=64, n_layers=3, mode="forward", random_state=0).fit(X_tr, y_tr)
assert clf.score(X_te, y_te) > 0.9
"""


def measure(code: str, args: list[str], tree: Path, cache: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process running ``code`` with ``tree``'s package and ``cache``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "config" / "minimal.yaml"))
    parser.add_argument(
        "--tree", action="append", default=None, help="a checkout to measure (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in (args.tree or [REPO])]
    config = str(Path(args.config).resolve())
    print(
        "round | tree | worker, empty cache: wall / CPU s | worker, cache filled | API first fit, empty cache"
    )
    for round_ in range(1, args.rounds + 1):
        for tree in trees:
            with tempfile.TemporaryDirectory() as worker_cache, tempfile.TemporaryDirectory() as api_cache:
                cold = measure(WORKER, [config], tree, Path(worker_cache))
                cached = measure(WORKER, [config], tree, Path(worker_cache))
                api = measure(API, [], tree, Path(api_cache))
            load = os.getloadavg()[0]
            print(
                f"{round_} | {tree} | {cold[0]:.1f} / {cold[1]:.1f} | {cached[0]:.1f} / {cached[1]:.1f} | "
                f"{api[0]:.1f} / {api[1]:.1f} | load {load:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
