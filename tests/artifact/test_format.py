"""The v3 container: round trip, checksums, and every malformed-file case."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from ninfer.artifact import Artifact, ArtifactWriter
from ninfer.artifact.format import MAGIC, PRELUDE
from ninfer.artifact.quant import quantize
from ninfer.errors import ArtifactError

HEADER = {
    "architecture": "llama",
    "config": {"hidden_size": 8},
    "tokenizer": "{}",
    "metadata": {"name": "t"},
}


def write(path, tensors, header=HEADER):
    with ArtifactWriter(path, header) as w:
        for name, t in tensors.items():
            w.add(name, t)
    return path


@pytest.fixture
def sample(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {
        "a.weight": quantize(rng.standard_normal((32, 64)).astype(np.float32), "bf16"),
        "b.weight": quantize(rng.standard_normal((32, 64)).astype(np.float32), "nvfp4"),
        "norm.weight": quantize(rng.standard_normal(64).astype(np.float32), "f32"),
    }
    return write(tmp_path / "m.ninfer", tensors), tensors


def test_round_trip_preserves_parts_and_header(sample):
    path, tensors = sample
    a = Artifact(path)
    assert a.name == "t" and a.architecture == "llama" and a.config == {"hidden_size": 8}
    for name, t in tensors.items():
        got = a.stored(name)
        assert got.format == t.format and got.shape == t.shape
        for part, arr in t.parts.items():
            np.testing.assert_array_equal(got.parts[part], arr)
            assert a.info(name).parts[part].offset % 64 == 0
    assert a.verify() == sum(a.info(n).nbytes for n in a.tensors)


def test_name_falls_back_to_architecture(tmp_path):
    a = Artifact(write(tmp_path / "m.ninfer", {}, dict(HEADER, metadata={})))
    assert a.name == "llama"


def corrupt(path, offset, value):
    data = bytearray(path.read_bytes())
    data[offset] = value
    path.write_bytes(bytes(data))


def test_flipped_data_byte_is_caught_on_read(sample):
    path, _ = sample
    off = Artifact(path).info("b.weight").parts["scale"].offset + 3
    corrupt(path, off, path.read_bytes()[off] ^ 0x01)
    a = Artifact(path)  # header still fine
    a.array("a.weight")
    with pytest.raises(ArtifactError, match="checksum mismatch in tensor 'b.weight'"):
        a.array("b.weight", "scale")
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        Artifact(path).verify()


def test_flipped_header_byte_is_caught(sample):
    path, _ = sample
    hoff = PRELUDE.unpack_from(path.read_bytes(), 0)[3]
    corrupt(path, hoff + 10, path.read_bytes()[hoff + 10] ^ 0x20)
    with pytest.raises(ArtifactError, match="header checksum mismatch"):
        Artifact(path)


def test_bad_magic(sample):
    path, _ = sample
    corrupt(path, 1, ord("X"))
    with pytest.raises(ArtifactError, match="bad magic"):
        Artifact(path)


def test_not_an_artifact_at_all(tmp_path):
    p = tmp_path / "x.ninfer"
    p.write_text("hello")
    with pytest.raises(ArtifactError, match="truncated"):
        Artifact(p)
    p.write_bytes(b"\0" * 200)
    with pytest.raises(ArtifactError, match="bad magic"):
        Artifact(p)


def test_unknown_version(sample):
    path, _ = sample
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 8, 2)
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="unsupported .ninfer format version 2"):
        Artifact(path)


def test_truncated(sample):
    path, _ = sample
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 40):
        path.write_bytes(data[:cut])
        with pytest.raises(ArtifactError, match="truncated"):
            Artifact(path)


def rewrite_header(path, edit):
    data = bytearray(path.read_bytes())
    magic, version, flags, hoff, hlen, _ = PRELUDE.unpack_from(data, 0)
    header = json.loads(data[hoff : hoff + hlen])
    edit(header)
    blob = json.dumps(header).encode()
    import xxhash

    data = data[:hoff] + blob
    PRELUDE.pack_into(
        data, 0, magic, version, flags, hoff, len(blob), xxhash.xxh3_64_intdigest(blob)
    )
    path.write_bytes(bytes(data))


def test_misshapen_part(sample):
    path, _ = sample
    rewrite_header(path, lambda h: h["tensors"]["a.weight"]["parts"]["data"].update(shape=[33, 64]))
    with pytest.raises(ArtifactError, match="'?a.weight'?.* misshapen"):
        Artifact(path)


def test_missing_and_misshapen_tensor_lookups(sample):
    path, _ = sample
    a = Artifact(path)
    with pytest.raises(ArtifactError, match="missing tensor 'c.weight'"):
        a.dense("c.weight")
    with pytest.raises(ArtifactError, match="misshapen"):
        a.expect_shape("a.weight", (64, 32))


def test_unknown_architecture(sample):
    path, _ = sample
    rewrite_header(path, lambda h: h.update(architecture="gpt_neox"))
    with pytest.raises(ArtifactError, match="unknown architecture 'gpt_neox'"):
        Artifact(path)


def test_abandoned_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), ArtifactWriter(tmp_path / "m.ninfer", HEADER) as w:
        w.add("x", quantize(np.ones((2, 16), np.float32), "f32"))
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["magic", "truncate", "checksum"])
def test_cli_inspect_reports_one_line_without_traceback(sample, damage):
    path, _ = sample
    if damage == "magic":
        corrupt(path, 0, 0)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-5])
    else:
        off = Artifact(path).info("a.weight").parts["data"].offset
        corrupt(path, off, path.read_bytes()[off] ^ 0xFF)
    r = subprocess.run(
        [sys.executable, "-m", "ninfer.cli", "inspect", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("ninfer inspect: error:")


def test_magic_constant():
    assert MAGIC == b"\x89NINFER\n"
