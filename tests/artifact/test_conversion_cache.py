"""The conversion cache behind `ninfer serve model.gguf` / `ninfer serve MODEL_DIR`: converted
once, reused while the source is unchanged, converted again when it changes; anything that is not
a model is refused in one line; temporary files of a killed conversion do not outlive it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from ninfer.artifact import Artifact
from ninfer.artifact.cache import Lock, cached_path, servable_path
from ninfer.artifact.demo import DEMO_FILE
from ninfer.errors import ArtifactError
from tests.artifact.test_gguf_convert import FFN, tiny_llama

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gguf(tmp_path, write_gguf) -> Path:
    return write_gguf(
        tmp_path / "Tiny-Llama.gguf",
        tiny_llama(np.random.default_rng(0)),
        hparams={"feed_forward_length": FFN},
    )


def test_an_artifact_is_served_as_it_is(fixture_artifacts, tmp_path):
    path = fixture_artifacts("llama")
    assert servable_path(path, tmp_path / "cache") == path
    assert not (tmp_path / "cache").exists()


def test_gguf_converted_once_and_again_when_it_changes(gguf, tmp_path):
    cache = tmp_path / "cache"
    out = servable_path(gguf, cache)
    assert out == cached_path(gguf, cache) and out.parent == cache
    assert out.name.startswith("tiny-llama-") and out.suffix == ".ninfer"
    a = Artifact(out)
    assert a.metadata["source_file"] == "Tiny-Llama.gguf"
    a.close()
    converted = out.stat().st_mtime_ns
    time.sleep(0.01)
    assert servable_path(gguf, cache) == out
    assert out.stat().st_mtime_ns == converted  # reused, not converted again
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the source changed
    assert servable_path(gguf, cache) == out
    assert out.stat().st_mtime_ns != converted
    # one artifact per source, its record and its lock: nothing else accumulates
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [out.name, out.name + ".lock", out.name + ".source"]
    )


def test_a_corrupt_cached_file_is_converted_again(gguf, tmp_path):
    cache = tmp_path / "cache"
    out = servable_path(gguf, cache)
    out.write_bytes(b"not an artifact")
    assert servable_path(gguf, cache) == out
    Artifact(out).close()


def test_hugging_face_directory(fixture_hf_dir, tmp_path):
    d = tmp_path / "my-model"
    shutil.copytree(fixture_hf_dir("llama"), d)
    cache = tmp_path / "cache"
    out = servable_path(d, cache)
    assert out.name.startswith("my-model-")
    Artifact(out).close()
    converted = out.stat().st_mtime_ns
    assert servable_path(d, cache) == out and out.stat().st_mtime_ns == converted
    (d / "generation_config.json").write_text('{"temperature": 0.5}')  # a file changed
    assert servable_path(d, cache) == out and out.stat().st_mtime_ns != converted
    a = Artifact(out)
    assert a.generation == {"temperature": 0.5}
    a.close()


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing.gguf", "no such file or directory"),
        (lambda p: (p / "notes.txt").write_text("hello") and p / "notes.txt", "not a .ninfer"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "without config.json"),
    ],
)
def test_anything_else_is_refused_in_one_line(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(ArtifactError) as e:
        servable_path(path, tmp_path / "cache")
    assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_serve_refuses_a_text_file_in_one_line(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "serve", str(notes), "--port", "9"],
        capture_output=True, text=True, check=False, cwd=REPO, timeout=120,
        env=dict(os.environ, NINFER_CACHE=str(tmp_path / "cache")),
    )  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "not a .ninfer artifact, a .gguf file or a Hugging Face model directory" in lines[0]
    assert "ninfer convert" in lines[0]


def test_serve_a_gguf(gguf, tmp_path):
    from tests.e2e.conftest import start_server

    env = {"NINFER_CACHE": str(tmp_path / "cache")}
    server = start_server(tmp_path, "--max-context", "128", artifact=gguf, env=env)
    try:
        models = httpx.get(server.base_url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["tiny-test"]  # the GGUF's general.name
        r = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={
                "model": "tiny-test",
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 3,
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        server.stop()
    # every stage shows, as plain lines (stderr is a file here): conversion, plan, ready URL
    log = server.stderr()
    assert "converting: 100% (" in log and "\r" not in log
    assert "plan: cpu float32, 1 lane(s), context 128, KV pool " in log
    assert f"ready: accepting requests on {server.base_url}" in log
    again = start_server(tmp_path, "--max-context", "128", artifact=gguf, env=env)
    again.stop()
    assert "converting" not in again.stderr()
    assert f"using {cached_path(gguf, tmp_path / 'cache')}" in again.stderr()


# -- temporary files of interrupted conversions --------------------------------------------------


def test_stale_temp_file_removed_on_the_next_start(gguf, tmp_path):
    cache = tmp_path / "cache"
    out = servable_path(gguf, cache)
    stale = out.with_name(out.name + ".tmp-k1ll3d")  # the writer's name for its temporary file
    stale.write_bytes(b"\0" * 4096)
    with Lock(out.with_name(out.name + ".lock")):  # a conversion is running: its file stays
        servable_path(gguf, cache)
        assert stale.exists()
    servable_path(gguf, cache)
    assert not stale.exists()
    stale.write_bytes(b"\0" * 4096)
    out.unlink()  # and on the path that converts
    servable_path(gguf, cache)
    assert not stale.exists() and out.exists()


def _started_conversion(args: list[str], out: Path, env: dict | None = None):
    """Start `python args...` and return (process, its temporary file) once it is writing `out`."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=dict(os.environ, **(env or {})),
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        temps = list(out.parent.glob(out.name + ".tmp-*")) if out.parent.exists() else []
        if temps:
            return proc, temps[0]
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.005)
    proc.kill()
    raise AssertionError("the conversion never started writing")


def _convert_demo_in_subprocess(cache: Path) -> tuple[subprocess.Popen, Path]:
    """A process converting the demo into `cache`, once its temporary file exists."""
    code = "from ninfer.artifact.demo import demo_artifact_path; demo_artifact_path()"
    return _started_conversion(["-c", code], cache / DEMO_FILE, {"NINFER_CACHE": str(cache)})


def test_killed_demo_conversion_leaves_nothing_after_the_next_start(demo_artifact, tmp_path):
    from ninfer.artifact.demo import demo_artifact_path

    cache = tmp_path / "cache"
    proc, temp = _convert_demo_in_subprocess(cache)
    proc.kill()  # SIGKILL: nothing of the process runs
    proc.wait()
    assert temp.exists()  # what issue 31 saw: ~99 MB left behind
    shutil.copyfile(demo_artifact, cache / DEMO_FILE)  # as if a later run had finished it
    assert demo_artifact_path(cache) == cache / DEMO_FILE
    assert sorted(p.name for p in cache.iterdir()) == [DEMO_FILE, DEMO_FILE + ".lock"]


def test_terminated_demo_conversion_removes_its_temp_file(demo_gguf, tmp_path):
    cache = tmp_path / "cache"
    proc, temp = _convert_demo_in_subprocess(cache)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert not temp.exists() and not (cache / DEMO_FILE).exists()


def test_terminated_convert_command_removes_its_temp_file(demo_gguf, tmp_path):
    out = tmp_path / "out" / "demo.ninfer"
    out.parent.mkdir()
    proc, _ = _started_conversion(
        ["-m", "ninfer.cli", "convert", str(demo_gguf), "-o", str(out)], out
    )
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 143
    assert list(out.parent.iterdir()) == []
