"""The v3 `.ninfer` file: streaming writer and memory-mapped reader.

Layout (all integers little-endian)::

    offset 0   magic        8 bytes  b"\\x89NINFER\\n"
    offset 8   version      u32      3
    offset 12  flags        u32      0
    offset 16  header_off   u64      where the JSON header starts (after all tensor data)
    offset 24  header_len   u64      its length in bytes
    offset 32  header_xxh   u64      xxh3_64 of the header bytes
    offset 40  (zero padding to 64)
    offset 64  tensor data, every part aligned to 64 bytes
    header_off JSON header (UTF-8)

The header sits at the end so that a converter can stream tensors to disk without holding
them in memory; the fixed prelude points at it. Every tensor part carries an xxh3_64 checksum
verified on load, so a flipped byte anywhere is caught. See docs/artifact.md.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import xxhash

from ninfer.errors import ArtifactError

MAGIC = b"\x89NINFER\n"
VERSION = 3
PRELUDE = struct.Struct("<8sIIQQQ")  # magic, version, flags, header_off, header_len, header_xxh
ALIGN = 64

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")

_NP_DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "uint16": np.uint16,
    "uint8": np.uint8,
    "int8": np.int8,
    "int32": np.int32,
    "int64": np.int64,
}


def _checksum(buf: bytes | memoryview | np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(buf)


@dataclass(frozen=True)
class PartInfo:
    """One stored array of a tensor (its data, or a scale)."""

    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute file offset
    nbytes: int
    xxh3: str


@dataclass(frozen=True)
class TensorInfo:
    """A logical tensor: its storage format, logical shape and stored parts."""

    name: str
    format: str  # f32 | f16 | bf16 | fp8 | nvfp4 | gguf:<type name>
    shape: tuple[int, ...]
    parts: dict[str, PartInfo]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts.values())


@dataclass
class StoredTensor:
    """A tensor as the format stores it: the arrays of each part plus attributes.

    Plain formats have one part, `data`. Quantised ones add scales (see ninfer.artifact.quant).
    """

    format: str
    shape: tuple[int, ...]
    parts: dict[str, np.ndarray]
    attrs: dict[str, Any] = field(default_factory=dict)


class ArtifactWriter:
    """Streams tensors into `<path>.tmp-*` and renames to `path` on `close()`.

    Nothing is left behind when the writer is abandoned (`abort()`, or leaving a `with` block by
    an exception): a half-written OUT never exists under its final name.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]):
        self.path = Path(path)
        self.header = dict(header)
        self.header["format_version"] = VERSION
        self.tensors: dict[str, dict[str, Any]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".tmp-", dir=self.path.parent)
        self._tmp = Path(tmp)
        f = None
        try:  # interrupted here (a signal), no `with` block exists yet to abort
            f = os.fdopen(fd, "wb")
            f.write(b"\0" * ALIGN)
        except BaseException:
            if f is None:
                os.close(fd)
            else:
                f.close()
            self._tmp.unlink(missing_ok=True)
            raise
        self._f = f
        self._pos = ALIGN

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add(self, name: str, tensor: StoredTensor) -> None:
        if name in self.tensors:
            raise ValueError(f"duplicate tensor {name!r}")
        parts = {}
        for part_name, arr in tensor.parts.items():
            arr = np.ascontiguousarray(arr)
            dtype = arr.dtype.name
            if dtype not in _NP_DTYPES:
                raise ValueError(f"tensor {name}.{part_name}: unsupported dtype {dtype}")
            pad = (-self._pos) % ALIGN
            self._f.write(b"\0" * pad)
            self._pos += pad
            raw = memoryview(arr).cast("B")
            self._f.write(raw)
            parts[part_name] = {
                "dtype": dtype,
                "shape": list(arr.shape),
                "offset": self._pos,
                "nbytes": arr.nbytes,
                "xxh3": _checksum(raw),
            }
            self._pos += arr.nbytes
        self.tensors[name] = {
            "format": tensor.format,
            "shape": list(tensor.shape),
            "parts": parts,
            **({"attrs": tensor.attrs} if tensor.attrs else {}),
        }

    def close(self) -> Path:
        header = dict(self.header, tensors=self.tensors)
        blob = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
        pad = (-self._pos) % ALIGN
        self._f.write(b"\0" * pad)
        header_off = self._pos + pad
        self._f.write(blob)
        self._f.seek(0)
        self._f.write(
            PRELUDE.pack(MAGIC, VERSION, 0, header_off, len(blob), xxhash.xxh3_64_intdigest(blob))
        )
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.chmod(self._tmp, 0o644)  # mkstemp creates 0600; artifacts are ordinary readable files
        try:
            os.replace(self._tmp, self.path)
        except OSError:
            self._tmp.unlink(missing_ok=True)  # nothing is left behind
            raise
        return self.path

    def abort(self) -> None:
        try:
            self._f.close()
        finally:
            self._tmp.unlink(missing_ok=True)


class Artifact:
    """A memory-mapped `.ninfer` file.

    Opening validates the prelude and header (one-line `ArtifactError` on any problem);
    `array()` verifies a part's checksum the first time it is read (`verify()` checks all).
    Header fields: `name`, `architecture`, `config` (the Hugging Face text config, flattened),
    `tokenizer_json`, `chat_template`, `special_tokens`, `generation`, `components`.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if not self.path.is_file():
            raise ArtifactError(f"{self.path}: no such artifact file")
        size = self.path.stat().st_size
        if size < PRELUDE.size:
            raise ArtifactError(
                f"{self.path}: truncated file ({size} bytes), not a .ninfer artifact"
            )
        with open(self.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        magic, version, _flags, hoff, hlen, hxxh = PRELUDE.unpack_from(self._mm, 0)
        if magic != MAGIC:
            raise ArtifactError(f"{self.path}: bad magic, not a .ninfer artifact")
        if version != VERSION:
            raise ArtifactError(
                f"{self.path}: unsupported .ninfer format version {version} (this ninfer reads {VERSION}); reconvert it"
            )
        if hoff + hlen > size or hoff < ALIGN:
            raise ArtifactError(
                f"{self.path}: truncated file (header expected at bytes {hoff}..{hoff + hlen}, file has {size})"
            )
        blob = self._mm[hoff : hoff + hlen]
        if xxhash.xxh3_64_intdigest(blob) != hxxh:
            raise ArtifactError(f"{self.path}: header checksum mismatch, the file is corrupt")
        try:
            self.header: dict[str, Any] = json.loads(blob)
        except (ValueError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{self.path}: unreadable header ({e})") from None
        self._verified: set[tuple[str, str]] = set()
        self.tensors: dict[str, TensorInfo] = {}
        try:
            for name, t in self.header["tensors"].items():
                parts = {
                    pn: PartInfo(
                        p["dtype"], tuple(p["shape"]), int(p["offset"]), int(p["nbytes"]), p["xxh3"]
                    )
                    for pn, p in t["parts"].items()
                }
                self.tensors[name] = TensorInfo(
                    name, t["format"], tuple(t["shape"]), parts, t.get("attrs", {})
                )
            arch = self.header["architecture"]
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(
                f"{self.path}: malformed header (missing or bad field {e})"
            ) from None
        if arch not in ARCHITECTURES:
            raise ArtifactError(
                f"{self.path}: unknown architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})"
            )
        for t in self.tensors.values():
            for pn, p in t.parts.items():
                if p.dtype not in _NP_DTYPES:
                    raise ArtifactError(
                        f"{self.path}: tensor {t.name}.{pn} has unknown dtype {p.dtype!r}"
                    )
                expect = (
                    int(np.prod(p.shape, dtype=np.int64)) * np.dtype(_NP_DTYPES[p.dtype]).itemsize
                )
                if expect != p.nbytes:
                    raise ArtifactError(
                        f"{self.path}: tensor {t.name}.{pn} is misshapen ({p.shape} {p.dtype} is not {p.nbytes} bytes)"
                    )
                if p.offset + p.nbytes > hoff:
                    raise ArtifactError(
                        f"{self.path}: truncated file (tensor {t.name} lies past the data region)"
                    )

    # -- header fields -------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.header["architecture"]

    @property
    def name(self) -> str:
        return self.header.get("metadata", {}).get("name") or self.architecture

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.get("metadata", {})

    @property
    def config(self) -> dict[str, Any]:
        return self.header["config"]

    @property
    def tokenizer_json(self) -> str:
        return self.header["tokenizer"]

    @property
    def chat_template(self) -> str | None:
        return self.header.get("chat_template")

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self.header.get("special_tokens", {})

    @property
    def generation(self) -> dict[str, Any]:
        return self.header.get("generation", {})

    @property
    def components(self) -> list[str]:
        return self.header.get("components", ["text"])

    @property
    def preprocessor(self) -> dict[str, Any]:
        """The vision processor settings as converted: {"image": preprocessor_config.json,
        "video": video_preprocessor_config.json} contents, each present when the checkpoint
        had it (ninfer.media.config.VisionPreprocessConfig.from_hf reads them); {} otherwise."""
        return self.header.get("preprocessor") or {}

    # -- tensors -------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise ArtifactError(f"{self.path}: missing tensor {name!r}") from None

    def array(self, name: str, part: str = "data", verify: bool = True) -> np.ndarray:
        """A zero-copy read-only view of one stored part (checksum verified on first read)."""
        info = self.info(name)
        try:
            p = info.parts[part]
        except KeyError:
            raise ArtifactError(f"{self.path}: tensor {name!r} has no part {part!r}") from None
        buf = memoryview(self._mm)[p.offset : p.offset + p.nbytes]
        if verify and (name, part) not in self._verified:
            if _checksum(buf) != p.xxh3:
                raise ArtifactError(
                    f"{self.path}: checksum mismatch in tensor {name!r} ({part}), the file is corrupt"
                )
            self._verified.add((name, part))
        return np.frombuffer(buf, dtype=_NP_DTYPES[p.dtype]).reshape(p.shape)

    def stored(self, name: str) -> StoredTensor:
        info = self.info(name)
        return StoredTensor(
            info.format, info.shape, {pn: self.array(name, pn) for pn in info.parts}, info.attrs
        )

    def dense(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32 by the reference dequantiser of its format."""
        from ninfer.artifact.quant import dequantize

        return dequantize(self.stored(name))

    def expect_shape(self, name: str, shape: tuple[int, ...]) -> None:
        info = self.info(name)
        if tuple(info.shape) != tuple(shape):
            raise ArtifactError(
                f"{self.path}: tensor {name!r} is misshapen: {list(info.shape)}, expected {list(shape)}"
            )

    def verify(self) -> int:
        """Check every part's checksum; returns the number of bytes verified."""
        total = 0
        for name, info in self.tensors.items():
            for part in info.parts:
                self.array(name, part)
                total += info.parts[part].nbytes
        return total

    def close(self) -> None:
        self._mm.close()
