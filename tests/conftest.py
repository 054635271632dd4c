"""Broker fixtures for the integration tests (and only those: put other fixtures in your own
test modules).

``kafka_bootstrap`` (session) -> "host:port" of a real Kafka broker, found in this order:
  1. env IOLSTREAM_TEST_BOOTSTRAP (e.g. set by `make test`, which starts scripts/kafka.sh itself);
  2. a testcontainers KafkaContainer, if a Docker engine answers (disable with IOLSTREAM_TEST_DOCKER=0;
     image from IOLSTREAM_TEST_KAFKA_IMAGE);
  3. the local broker of `scripts/kafka.sh start` on env KAFKA_PORT (default 19092); stopped at the
     end of the session only if this fixture started it.
It never skips: if no broker can be had, the tests error with the reason.

``kafka_admin`` -> confluent_kafka AdminClient on that broker.
``kafka_topics(*suffixes, partitions=1, config=None)`` -> fresh, uniquely named topic names
(t-<test>-<uuid8>-<suffix>), created and ready; deleted after the test.

``worker_kernels`` (session) compiles the Numba kernels a worker takes, once, before the first broker fixture
hands out a broker (and so before the first worker starts): a cold cache compiles for minutes on a slow machine,
which no test's wait for a worker should have to cover.

Helpers (produce_json, consume_all, committed_offsets, unique_group, ...) live in kafka_util.py.

In parallel (``make test`` runs pytest-xdist's ``-n 2``; ``PYTEST_WORKERS=0`` runs it in one process) each
module's tests run in one worker process, so a module's fixtures are made once; the tests of tests/secure and of
tests/cluster run in one worker each (their brokers listen on fixed ports, started once per session). The workers
share the broker ``IOLSTREAM_TEST_BOOTSTRAP`` names: a broker this fixture started for one worker would stop under
the other's feet, so in parallel it must be given (``make test`` does).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
KAFKA_SH = REPO / "scripts" / "kafka.sh"

if str(TESTS_DIR) not in sys.path:  # `import kafka_util` from any test module
    sys.path.insert(0, str(TESTS_DIR))

from kafka_util import admin_client, create_topics, delete_topics, wait_for_broker, warm_up  # noqa: E402


def _docker_available(timeout: float = 3.0) -> bool:
    """True if a Docker engine answers a ping within ``timeout`` s (never hangs, never raises)."""
    if os.environ.get("IOLSTREAM_TEST_DOCKER", "").lower() in ("0", "false", "no", "off"):
        return False
    try:
        import docker  # type: ignore[import-untyped]
    except ImportError:
        docker = None
    if docker is not None:
        try:
            client = docker.from_env(timeout=int(max(1, timeout)))
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False
    if shutil.which("docker"):
        try:
            r = subprocess.run(
                ["docker", "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            return r.returncode == 0
        except (subprocess.TimeoutExpired, OSError):
            return False
    return False


def _start_container() -> tuple[str, Callable[[], None]]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # older testcontainers
        from testcontainers.kafka import KafkaContainer  # type: ignore[no-redef]
    image = os.environ.get("IOLSTREAM_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.6.0")
    container = (
        KafkaContainer(image)
        .with_kraft()
        # Single broker: internal topics must not ask for 3 replicas (transactions need this).
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
    )
    container.start(timeout=120)
    return container.get_bootstrap_server(), container.stop


def _kafka_sh(cmd: str, port: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_PORT": port}
    return subprocess.run(
        ["bash", str(KAFKA_SH), cmd],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _start_local(port: str) -> tuple[str, Callable[[], None] | None]:
    if _kafka_sh("status", port, timeout=30).returncode == 0:
        return f"127.0.0.1:{port}", None  # someone else's broker: leave it running
    r = _kafka_sh("start", port)
    if r.returncode != 0:
        raise RuntimeError(
            f"`KAFKA_PORT={port} bash scripts/kafka.sh start` failed (exit {r.returncode}); "
            f"it needs java 17+ and, on first use, mvn with access to Maven Central.\n"
            f"--- stdout ---\n{r.stdout}\n--- stderr ---\n{r.stderr}"
        )

    def stop() -> None:
        _kafka_sh("stop", port, timeout=120)

    return f"127.0.0.1:{port}", stop


# The kinds of model the tests' workers run: the kernels' signatures follow the dtype (float64: no worker test runs
# float32, whose kernels tests/core compiles in its own process), the mode (auto keeps -F and -R candidates), the task
# and forgetting; ``kernel_warmup.preload`` takes both solvers, serial and parallel, as a worker's start does for its config.
WORKER_KINDS = [
    {"mode": mode, **task}
    for mode in ("auto", "forward", "ridge")
    for task in ({"classes": (0, 1)}, {"n_outputs": 1})
] + [
    {"forgetting": 5000, "classes": (0, 1)},
    {"forgetting": "auto", "lam": "auto", "classes": (0, 1)},
    {"forgetting": "auto", "lam": "auto", "n_outputs": 1},
]


# tests that share a broker started on a fixed port by a session fixture: one worker process runs all of them
_SHARED_BROKERS = {"secure": "tests/secure/", "cluster": "tests/cluster/"}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent when it is not installed or disabled
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n``: each module's tests to one worker process (its fixtures made once), and the tests of each
    shared broker (``_SHARED_BROKERS``) to one. (xdist's ``--dist loadgroup`` would take marks, but it renames
    the tests to group them, which pytest 9 no longer lets it do.) The modules go in collection order, not xdist's
    largest-first: a module of one or two tests may take minutes (the cluster's start, the image build), and
    started last it would run alone at the end."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return next((name for name, d in _SHARED_BROKERS.items() if module.startswith(d)), module)

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def worker_kernels(request) -> float:
    """The kernels of every kind in WORKER_KINDS compiled into the cache (or loaded from it), in this process;
    returns the seconds it took, which the terminal shows."""
    from iolstream.core.model import ModelConfig
    from iolstream.stream import kernel_warmup

    started = time.perf_counter()
    for kind in WORKER_KINDS:
        kernel_warmup.preload(ModelConfig(n_inputs=3, n_nodes=8, n_layers=2, scaler="none", **kind))
    seconds = time.perf_counter() - started
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # to the terminal, not into the first test's output
            reporter.write_line(f"worker kernels compiled or loaded in {seconds:.1f} s (tests/conftest.py)")
    return seconds


@pytest.fixture(scope="session")
def kafka_bootstrap(worker_kernels) -> Iterator[str]:
    """Bootstrap servers ("host:port") of a real broker, verified to answer. Never skips."""
    stop: Callable[[], None] | None = None
    source: str
    env = os.environ.get("IOLSTREAM_TEST_BOOTSTRAP", "").strip()
    container_error = ""
    bootstrap = ""
    if env:
        bootstrap, source = env, "IOLSTREAM_TEST_BOOTSTRAP"
    elif _docker_available():
        try:
            bootstrap, stop = _start_container()
            source = "testcontainers KafkaContainer"
        except Exception as e:  # e.g. image cannot be pulled: fall back to the local broker
            container_error = f"(testcontainers failed first: {type(e).__name__}: {e})\n"
    if not bootstrap and os.environ.get("PYTEST_XDIST_WORKER"):
        raise RuntimeError(
            "in parallel (pytest -n) the workers share one broker: name it in IOLSTREAM_TEST_BOOTSTRAP "
            "(`make test` starts one and does), or run without -n"
        )
    if not bootstrap:
        port = os.environ.get("KAFKA_PORT", "19092")
        try:
            bootstrap, stop = _start_local(port)
        except Exception as e:
            raise RuntimeError(f"no Kafka broker for the integration tests: {container_error}{e}") from e
        source = "scripts/kafka.sh"
    try:
        try:
            wait_for_broker(bootstrap, timeout=60)
            warm_up(bootstrap, timeout=60)
        except Exception as e:
            raise RuntimeError(f"Kafka broker at {bootstrap} (from {source}) is not usable: {e}") from e
        yield bootstrap
    finally:
        if stop is not None:
            stop()


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str):
    """A confluent_kafka AdminClient on the test broker."""
    return admin_client(kafka_bootstrap)


def _topic_safe(s: str, limit: int) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", s).strip("-._")[:limit] or "x"


@pytest.fixture
def kafka_topics(request: pytest.FixtureRequest, kafka_bootstrap: str, kafka_admin):
    """Factory: ``kafka_topics("in", "out", partitions=3, config={...})`` -> list of fresh topic
    names ``t-<test>-<uuid8>-<suffix>`` (one per suffix), created and with leaders; deleted at
    teardown (best effort). With no suffixes, one topic is created (suffix "t")."""
    created: list[str] = []
    test = _topic_safe(request.node.name, 80)

    def make(*suffixes: str, partitions: int = 1, config: dict[str, str] | None = None) -> list[str]:
        tag = uuid.uuid4().hex[:8]
        names = [f"t-{test}-{tag}-{_topic_safe(s, 60)}" for s in (suffixes or ("t",))]
        create_topics(kafka_admin, names, partitions=partitions, config=config)
        created.extend(names)
        return names

    yield make
    delete_topics(kafka_admin, created)
