"""Attach an MTP head to an existing artifact: `ninfer convert SRC.ninfer --mtp-head HEAD -o OUT`.

Hugging Face checkpoints that ship `mtp.*` tensors (Qwen3.5) get their `mtp` component from
`ninfer convert` directly (convert_hf.py). A head trained separately (artifacts/train_mtp.py,
for a model whose checkpoint has none) is a safetensors file of `mtp.*` tensors in the same
layout (ir/models/mtp.py); this copies every stored tensor of SRC unchanged, adds the head's
tensors (float32, or as stored when bf16 / f16) and records the `mtp` component. The result
must build the head the model's config implies (`check_model`), or nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ninfer.artifact.convert_hf import check_fits
from ninfer.artifact.format import Artifact, ArtifactWriter, StoredTensor
from ninfer.errors import ConvertError

_FORMATS = {"float32": "f32", "float16": "f16"}


def read_head(path: Path) -> dict[str, np.ndarray]:
    """The `mtp.*` tensors of safetensors file `path` (ConvertError naming the file)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as e:
        raise ConvertError(f"--mtp-head {path}: not a readable safetensors file ({e})") from None
    bad = sorted(n for n in tensors if not n.startswith("mtp."))
    if bad or not tensors:
        raise ConvertError(
            f"--mtp-head {path}: expected only mtp.* tensors, found {', '.join(bad[:3]) or 'none'}"
        )
    return tensors


def attach_mtp(
    src: Path, head: Mapping[str, np.ndarray], out: Path, check_model=None, name: str | None = None
) -> Path:
    """Write `out`: artifact `src` plus the MTP head `head` (module docstring)."""
    art = Artifact(src)
    if "mtp" in art.components:
        raise ConvertError(f"{src}: already has an mtp component")
    header = {k: v for k, v in art.header.items() if k not in ("tensors", "format_version")}
    header["components"] = [c for c in ("text", "mtp", "vision") if c in {*art.components, "mtp"}]
    if name is not None:
        header["metadata"] = {**header.get("metadata", {}), "name": name}
    with ArtifactWriter(out, header) as writer:
        for t in art:
            writer.add(t, art.stored(t))
        for t, a in sorted(head.items()):
            a = np.asarray(a)
            fmt = _FORMATS.get(a.dtype.name)
            if fmt is None:
                a, fmt = a.astype(np.float32), "f32"
            writer.add(t, StoredTensor(fmt, tuple(a.shape), {"data": a}))
        check_fits(src, art.architecture, art.config, writer.tensors, check_model)
    return out
