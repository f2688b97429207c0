"""`ninfer bench engine --images N`: image-prefill throughput through the vision stage, on CPU
with the tiny vision-language fixture and the tiny synthetic vision model; what it refuses; on a
GPU (skipped without one) the same load on the CUDA executor."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from artifacts.fixture_vision import build_vision_fixture
from ninfer.cli import build_parser
from ninfer.commands import bench
from ninfer.errors import ConfigError


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(["bench", *argv]).parse_args(["bench", *argv])


def test_image_prefill_report_on_the_vision_fixture(fixture_root: Path, tmp_path, capsys):
    path = build_vision_fixture("qwen3_5_vl", fixture_root)
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["engine", str(path), "--device", "cpu", "--images", "2", "--image-size", "64x48",
            "--input-len", "8", "--batch-sizes", "1,2", "--json", str(out), "--md", str(md)]  # fmt: skip
    assert bench.run(_parse(argv)) == 0
    report = json.loads(out.read_text())
    # 64 x 48 pixels fit the fixture's processor budget: patch 8 -> 8 x 6 patches, merge 2
    assert report["image_grid"] == [1, 6, 8] and report["tokens_per_image"] == 12
    assert "torch.vision_attention" in report["vision_kernels"]
    assert [r["batch"] for r in report["results"]] == [1, 2]
    for r in report["results"]:
        b = r["batch"]
        assert r["images"] == 2 * b  # every image encoded once: none came from the cache
        assert r["vision_tokens"] == 2 * b * 12
        assert r["prompt_tokens"] == b * (8 + 2 * (12 + 2))
        assert 0 < r["vision_encode_s"] < r["prefill_s"]
        assert r["text_prefill_s"] == pytest.approx(r["prefill_s"] - r["vision_encode_s"])
        assert r["images_per_s"] == pytest.approx(r["images"] / r["prefill_s"])
        assert r["vision_tok_per_s"] == pytest.approx(r["vision_tokens"] / r["prefill_s"])
        assert r["encode_images_per_s"] == pytest.approx(r["images"] / r["vision_encode_s"])
    printed = capsys.readouterr().out
    assert "2 image(s) per request, 64x48 pixels -> patch grid 1x6x8, 12 vision tokens" in printed
    assert "images/s" in printed and "vision encode s" in printed
    assert "| 2 | 4 | 48 |" in md.read_text()


def test_image_prefill_on_a_synthetic_vision_model(capsys):
    """The synthetic vision model (random weights, transformers' Qwen3.5 conditional-generation
    layout) through the same load; its processor is Qwen3.5's default (at least 65,536 pixels:
    a 64 x 64 image is resized up to 256 x 256, 32 x 32 patches of 8)."""
    argv = ["engine", "--synthetic", "tiny-qwen3.5-hybrid-vl", "--device", "cpu", "--images", "1",
            "--image-size", "64x64", "--input-len", "4"]  # fmt: skip
    assert bench.run(_parse(argv)) == 0
    printed = capsys.readouterr().out
    assert "patch grid 1x32x32, 256 vision tokens each" in printed
    row = printed.strip().splitlines()[-1].split()
    assert row[:3] == ["1", "1", "256"]


def test_image_prefill_refusals(fixture_artifacts):
    with pytest.raises(ConfigError, match="--images: .* has no vision component"):
        bench.run(_parse(["engine", str(fixture_artifacts("qwen3_5")), "--device", "cpu",
                          "--images", "1"]))  # fmt: skip
    with pytest.raises(ConfigError, match="--synthetic tiny-qwen3 has no vision tower"):
        bench.run(
            _parse(["engine", "--synthetic", "tiny-qwen3", "--device", "cpu", "--images", "1"])
        )
    with pytest.raises(ConfigError, match="--peer: not with --images"):
        bench.run(_parse(["engine", "--synthetic", "tiny-qwen3", "--images", "1", "--peer",
                          "transformers"]))  # fmt: skip
    for bad in ("448", "0x10", "axb"):
        with pytest.raises(SystemExit):
            _parse(["engine", "--images", "1", "--image-size", bad])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_image_prefill_report_on_the_gpu(fixture_root: Path, tmp_path):
    """The same load on the CUDA executor: the vision stage timed by CUDA events, the decode
    buckets captured, every image encoded once."""
    path = build_vision_fixture("qwen3_5_vl", fixture_root)
    out = tmp_path / "r.json"
    argv = ["engine", str(path), "--device", "cuda", "--images", "3", "--image-size", "64x48",
            "--input-len", "8", "--batch-sizes", "1,4", "--json", str(out)]  # fmt: skip
    assert bench.run(_parse(argv)) == 0
    report = json.loads(out.read_text())
    assert report["dtype"] == "bf16" and report["device"].startswith("cuda")
    for r in report["results"]:
        assert r["images"] == 3 * r["batch"] and r["vision_tokens"] == 36 * r["batch"]
        assert 0 < r["vision_encode_s"] < r["prefill_s"] and r["images_per_s"] > 0
