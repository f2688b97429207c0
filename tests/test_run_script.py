"""`./run`: the first start installs with one line per stage and pip's output in a log; a later
start whose stamp matches skips pip (so `./run serve --help` is fast); a changed pyproject.toml
installs again.

The install goes into a fresh virtualenv whose only extra is a .pth line to this environment's
site-packages, so pip finds every dependency already installed (no downloads of torch) and
installs just the editable ninfer and the demo model; pip never touches this environment (it
refuses to uninstall outside the one it installs into).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _clone(dst: Path) -> Path:
    """What `./run` installs from: the script, pyproject.toml, the README it names, the packages."""
    dst.mkdir()
    for name in ("run", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    for pkg in ("ninfer", "kernels"):
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _run(clone: Path, venv: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [str(clone / "run"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=dict(os.environ, NINFER_VENV=str(venv), PYTHONPATH=""),
    )
    return r, time.monotonic() - t0


@pytest.mark.slow
def test_install_once_then_skip_until_pyproject_changes(tmp_path):
    base = getattr(sys, "_base_executable", sys.executable)
    clone = _clone(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    (
        Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
        / "env.pth"
    ).write_text(sysconfig.get_paths()["purelib"] + "\n")

    first, _ = _run(clone, venv, "serve", "--help")
    assert first.returncode == 0, first.stderr
    assert "usage: ninfer serve" in first.stdout
    stages = [line for line in first.stderr.splitlines() if line.startswith("ninfer:")]
    assert stages[0].startswith(f"ninfer: installing into {venv}") and "install.log" in stages[0]
    assert stages[-1].startswith("ninfer: installed in ")
    assert "Requirement already satisfied" not in first.stderr  # pip's output is in the log
    assert "Successfully installed" in (venv / "install.log").read_text()

    again, seconds = _run(clone, venv, "serve", "--help")
    assert again.returncode == 0 and "usage: ninfer serve" in again.stdout
    assert again.stderr == ""  # no pip at all
    assert seconds < 10

    with open(clone / "pyproject.toml", "a") as f:
        f.write("# changed\n")
    third, _ = _run(clone, venv, "serve", "--help")
    assert third.returncode == 0 and "ninfer: installing into" in third.stderr
