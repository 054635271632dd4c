"""The secured broker of the tests in this folder (session scope): started from scripts/kafka.sh with
KAFKA_SECURITY=sasl_ssl in a fresh state dir, wiped at the end (tests/secure_kafka.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from secure_kafka import SecureBroker


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory, worker_kernels) -> Iterator[SecureBroker]:
    port = int(os.environ.get("IOLSTREAM_TEST_SECURE_PORT", "19392"))
    state = os.environ.get("IOLSTREAM_TEST_SECURE_DATA")
    broker = SecureBroker(port, Path(state) if state else tmp_path_factory.mktemp("secure-kafka"))
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
