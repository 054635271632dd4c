"""Numba's on-disk cache of the kernels, stamped with every kernel file, not only the kernel's own.

Numba keeps a compiled kernel until the file that defines it changes. A kernel that calls a
function from another file (``step_kernels`` calls ``activation_kernels.activate`` and the ``numba_blas`` wrappers;
all of them take their flags from ``activation_kernels.JIT``) carries its own copy of that function, so an
edit there left the cached kernel as it was: computing the old way, or crashing when an
interface changed (Numba's documented limitation, "changes in other files are not detected").
Here every kernel defined in KERNEL_FILES is stamped with its own file and a digest of all of
them: an edit of any recompiles them all, once (seconds).

Imported by ``activation_kernels`` (which ``numba_blas`` and ``step_kernels`` import first) before its first
``@njit(cache=True)``: the locator is chosen when a kernel is decorated. Functions outside
these files keep Numba's own locators.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from numba.core import caching, config

KERNEL_FILES = (
    "activation_kernels.py",
    "numba_blas.py",
    "step_kernels.py",
    "shared_step_kernels.py",
)  # recent_ids.py calls nothing outside itself
HERE = Path(__file__).resolve().parent


def sources_digest(paths) -> str:
    """SHA-256 over the names and bytes of ``paths``, in order."""
    h = hashlib.sha256()
    for path in paths:
        path = Path(path)
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def kernels_digest() -> str:
    """``sources_digest`` of this package's KERNEL_FILES (read once per process)."""
    return sources_digest(HERE / name for name in KERNEL_FILES)


class _StampedByAllKernels:
    """Mixed into Numba's source-file locators: only for this package's kernel files, and their
    stamp is (Numba's own stamp of the file, ``kernels_digest()``)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        path = Path(py_file).resolve()
        if path.parent != HERE or path.name not in KERNEL_FILES:
            return None
        return super().from_function(py_func, py_file)

    def get_source_stamp(self):
        return super().get_source_stamp(), kernels_digest()


def _numba(name: str):
    """A class of numba.core.caching, by its name in Numba 0.68 or its older private one."""
    return getattr(caching, name, None) or getattr(caching, "_" + name)


class UserDirLocator(_StampedByAllKernels, _numba("UserProvidedCacheLocator")):
    """``NUMBA_CACHE_DIR`` set (the container image): kernels cached there."""


class InTreeLocator(_StampedByAllKernels, _numba("InTreeCacheLocator")):
    """Kernels cached in ``__pycache__`` beside the sources."""


def cache_dir() -> Path:
    """Where the kernels of KERNEL_FILES are cached: ``NUMBA_CACHE_DIR``'s copy of this package's directory, else
    ``__pycache__`` beside the sources (Numba's user-wide directory when that is not writable, which
    ``cached_kernels`` then does not see)."""
    if config.CACHE_DIR:
        return Path(config.CACHE_DIR) / UserDirLocator.get_suitable_cache_subpath(str(HERE / KERNEL_FILES[0]))
    return HERE / "__pycache__"


def cached_kernels() -> int:
    """How many kernels of KERNEL_FILES have an index in ``cache_dir()`` (0: the next call of each compiles)."""
    where = cache_dir()
    try:
        names = os.listdir(where)
    except OSError:
        return 0
    stems = tuple(Path(name).stem + "." for name in KERNEL_FILES)
    return sum(1 for name in names if name.endswith(".nbi") and name.startswith(stems))


def install() -> None:
    """Put the two locators ahead of Numba's (idempotent)."""
    classes = _numba("CacheImpl")._locator_classes
    if UserDirLocator not in classes:
        classes[0:0] = [UserDirLocator, InTreeLocator]


install()
