"""scripts/containers.sh installs system packages only when asked (IOLSTREAM_INSTALL_SYSTEM=1, which .ci/run
sets): otherwise a machine without podman gets exit 3 and a line naming what is missing, and `make test`
skips the container stack with that reason. Run against a PATH holding no podman, runc or debootstrap and a
stand-in apt-get that records its calls (and installs nothing)."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "containers.sh"


def fake_path(tmp_path: Path) -> tuple[Path, Path]:
    """A bin dir with the few tools the script's setup uses, ``id -u`` answering 0, and a recording apt-get."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "apt-calls"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "cat", "tail", "env"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")  # as root: the install question comes next
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 1\n')
    for name in ("id", "apt-get"):
        (bin_dir / name).chmod(0o755)
    return bin_dir, calls


def setup(tmp_path: Path, bin_dir: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "IOLSTREAM_CONTAINER_STATE": str(tmp_path / "state")}
    return subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT), "setup"],
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_nothing_is_installed_unless_asked(tmp_path):
    bin_dir, calls = fake_path(tmp_path)
    done = setup(tmp_path, bin_dir)
    assert done.returncode == 3, done.stderr
    assert "podman runc debootstrap not installed" in done.stderr
    assert "IOLSTREAM_INSTALL_SYSTEM=1" in done.stderr
    assert not calls.exists(), "apt-get was called without IOLSTREAM_INSTALL_SYSTEM=1"


def test_asked_it_goes_to_apt(tmp_path):
    bin_dir, calls = fake_path(tmp_path)
    done = setup(tmp_path, bin_dir, IOLSTREAM_INSTALL_SYSTEM="1")
    assert done.returncode == 3, done.stderr  # the stand-in apt-get fails: no working podman, exit 3
    assert "apt-get could not install" in done.stderr
    assert calls.read_text().split("\n")[0] == "update -qq"


def test_ci_asks_and_make_passes_the_variable_on():
    assert "IOLSTREAM_INSTALL_SYSTEM=1 make test" in (ROOT / ".ci" / "run").read_text()
    assert "export IOLSTREAM_INSTALL_SYSTEM ?= 0" in (ROOT / "Makefile").read_text()
