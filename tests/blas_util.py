"""The one-BLAS-thread fixture the numeric test modules share (conftest.py holds broker fixtures only).

A module uses it by importing it: ``from blas_util import one_blas_thread  # noqa: F401``.
"""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_limits


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """NumPy's and SciPy's OpenBLAS fight over 2 cores when calls alternate (docs/benchmarks.md, "The update's building blocks")."""
    with threadpool_limits(1):
        yield
