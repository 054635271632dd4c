"""A secured local broker for the tests (``scripts/kafka.sh`` with ``KAFKA_SECURITY=sasl_ssl``), its users'
client settings, and a worker run as ``iolstream run`` in a subprocess.

The fixture ``secure_kafka`` (tests/secure/conftest.py) starts one per session in a fresh state dir on
``IOLSTREAM_TEST_SECURE_PORT`` (default 19392, controller on the next port) and wipes it at the end; with
``IOLSTREAM_TEST_SECURE_DATA`` naming the state dir of one already running, it uses that one and leaves it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import yaml
from kafka_util import admin_client, create_topics, unique_group

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "scripts" / "kafka.sh"
IOLSTREAM = Path(sys.executable).with_name("iolstream")
WINE_CLASSES = [0, 1, 2]


def lib_dir() -> str:
    """Where scripts/kafka.sh keeps the Kafka jars of its pom (``kafka.sh jars`` resolves them and says)."""
    r = subprocess.run(
        ["bash", str(KAFKA_SH), "jars"], capture_output=True, text=True, timeout=900, check=True
    )
    return r.stdout.strip().splitlines()[-1]


class SecureBroker:
    """One secured broker: SASL_SSL SCRAM-SHA-512, its own CA, ACLs enforced; users admin (super user),
    worker and producer with the passwords kafka.sh made."""

    def __init__(self, port: int, state_dir: Path):
        self.port = port
        self.state_dir = state_dir
        self.bootstrap = f"127.0.0.1:{port}"
        self.secure_dir = state_dir / "secure"
        self.ca = str(self.secure_dir / "ca.pem")
        self.passwords: dict[str, str] = {}
        self._admin = None
        self.owned = False  # started here (and so wiped at the end)

    def _sh(self, cmd: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KAFKA_PORT": str(self.port),
            "KAFKA_SECURITY": "sasl_ssl",
            "IOLSTREAM_KAFKA_DATA": str(self.state_dir),
            "KAFKA_HEAP_OPTS": os.environ.get("KAFKA_HEAP_OPTS", "-Xms128m -Xmx384m"),
            "KAFKA_SCRAM_USERS": "reader",  # a client of the predictions (the Java console consumer)
        }
        return subprocess.run(
            ["bash", str(KAFKA_SH), cmd],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        if self._sh("status", timeout=30).returncode != 0:
            self.owned = True
        r = self._sh("start")
        if r.returncode != 0:
            raise RuntimeError(
                f"KAFKA_SECURITY=sasl_ssl KAFKA_PORT={self.port} scripts/kafka.sh start failed "
                f"(exit {r.returncode}):\n{r.stderr}"
            )
        for line in (self.secure_dir / "credentials").read_text().splitlines():
            user, _, password = line.partition("=")
            self.passwords[user] = password

    def stop(self) -> None:
        if self.owned:
            self._sh("wipe", timeout=120)

    def properties(self, user: str) -> str:
        """The Java client settings file kafka.sh wrote for ``user``."""
        return str(self.secure_dir / f"{user}.properties")

    def java(self, main: str, *args: str, stdin: str | None = None, timeout: float = 120.0):
        """Run a Java tool of the Kafka jars kafka.sh resolved (``main`` class) to its end."""
        return subprocess.run(
            ["java", "-Xmx256m", "-cp", f"{lib_dir()}/*", main, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def log_text(self) -> str:
        return (self.state_dir / "kafka.log").read_text(errors="replace")

    def client(self, user: str, *, password: str | None = None, ca: str | None = None) -> dict[str, Any]:
        """kafka.client settings of ``user`` (librdkafka keys), without bootstrap.servers."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": self.passwords[user] if password is None else password,
            "ssl.ca.location": ca or self.ca,
        }

    def conf(self, user: str, **kw) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, **self.client(user, **kw)}

    @property
    def admin(self):
        if self._admin is None:
            self._admin = admin_client(self.bootstrap, **self.client("admin"))
        return self._admin

    def topics(self, *suffixes: str, partitions: int = 1) -> list[str]:
        """Fresh topics, created by the admin."""
        tag = uuid.uuid4().hex[:8]
        names = [f"s-{tag}-{s}" for s in suffixes]
        create_topics(self.admin, names, partitions=partitions)
        return names

    def grant(self, acls, user: str) -> None:
        """Create ``acls`` (iolstream.kafka.required_acls.Acl) for ``User:<user>`` and wait until the broker lists them."""
        from iolstream.kafka.required_acls import acl_bindings

        bindings = acl_bindings(acls, f"User:{user}")
        if not bindings:
            return
        for fut in self.admin.create_acls(bindings, request_timeout=30).values():
            fut.result(30)
        self.wait_listed(acls, user)

    def wait_listed(self, acls, user: str) -> None:
        """The broker's authorizer applies new ACLs from the metadata log a moment later: wait until it lists
        them."""
        from confluent_kafka.admin import AclBindingFilter

        from iolstream.kafka.required_acls import acl_bindings

        bindings = acl_bindings(acls, f"User:{user}")

        deadline = time.monotonic() + 30
        for b in bindings:
            pattern = AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            while not self.admin.describe_acls(pattern, request_timeout=10).result(10):
                assert time.monotonic() < deadline, f"ACL {b} not in force after 30 s"
                time.sleep(0.05)


def stream(n: int | None = None):
    """Rows of wine (178 rows, 13 features, 3 classes): ids, X, y."""
    from iolstream.tools.builtin_datasets import load

    ds = load("wine")
    X, y = ds.X[:n], ds.y[:n]
    ids = [f"r{i}" for i in range(len(X))]
    return ids, X, y


def feature_and_label_messages(ids, X, y) -> tuple[list[bytes], list[bytes]]:
    features = [orjson.dumps({"id": i, "x": x.tolist()}) for i, x in zip(ids, X)]
    labels = [orjson.dumps({"id": i, "y": int(v)}) for i, v in zip(ids, y)]
    return features, labels


def worker_raw(
    broker: SecureBroker, topics: dict, snap_dir: Path, *, user: str = "worker", **sections
) -> dict:
    """A worker config for wine over SASL_SSL as ``user``; ``topics`` names features, labels, predictions,
    dead_letters; ``sections`` update the defaults section by section."""
    raw = {
        "model": {"n_inputs": 13, "classes": WINE_CLASSES, "n_nodes": 16, "n_layers": 2, "warmup_rows": 16},
        "kafka": {
            "bootstrap_servers": broker.bootstrap,
            "group_id": unique_group("secure"),
            "client": broker.client(user),
            "call_timeout_seconds": 15,
        },
        "topics": {**topics, "create": False},
        "stream": {"batch_rows": 16, "max_message_bytes": 65536},
        "snapshot": {"dir": str(snap_dir)},
        "metrics": {"port": 0},
        "logging": {"status_every_seconds": 1},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return raw


def write_config(raw: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_worker(config: Path, *args: str, timeout: float = 120.0, env: dict | None = None):
    """``iolstream run -c config --stop-at-end ARGS`` to its end; (exit code, stderr text, seconds)."""
    t0 = time.monotonic()
    r = subprocess.run(
        [str(IOLSTREAM), "run", "-c", str(config), "--stop-at-end", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0
