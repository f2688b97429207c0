"""The vision tower in the compiled plan: `ninfer compile --vision` shows it, every call names
a kernel the CPU executor has, the plan round-trips through JSON, and what cannot run is refused
with one line (no vision component). The CUDA plan: tests/vision/test_vision_cuda.py."""

from __future__ import annotations

import json

import pytest

from ninfer.artifact.format import Artifact
from ninfer.cli import main
from ninfer.errors import ConfigError
from ninfer.ir.plan import Plan
from ninfer.media.config import VisionPreprocessConfig
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_artifact
from ninfer.runtime.executors.cpu.executor import CPU_KERNELS

VISION_KERNELS = (
    "torch.patch_embed", "torch.pos_embed_interp", "torch.layernorm", "torch.rotary_2d",
    "torch.vision_attention", "torch.gelu", "torch.merge_rows", "torch.media_merge",
)  # fmt: skip


def compile_out(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["compile", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("arch", ["qwen3_5_vl", "qwen3_5_moe_vl"])
def test_compile_shows_the_vision_tower(arch, vision_artifact, capsys):
    path = str(vision_artifact(arch))
    rc, out, err = compile_out(capsys, path, "--vision", "--verbose")
    assert rc == 0, err
    assert "vision: blocks=2 hidden=32 heads=2 patch=2x8x8 merge=2 pos_grid=4x4 out=64" in out
    kernels = next(line for line in out.splitlines() if line.startswith("kernels: "))
    for k in VISION_KERNELS:
        assert f" {k}x" in kernels
    assert "torch.vision_attention" in out and "%vision_embeds" in out
    assert "declared: vision" not in out
    # without --vision the tower is declared only, and nothing of it is planned
    rc, out, err = compile_out(capsys, path)
    assert rc == 0 and "declared: vision(declared, not executed)" in out
    assert "vision: blocks" not in out and "torch.vision_attention" not in out


def test_every_vision_call_resolves_and_the_plan_round_trips(vision_artifact):
    art = Artifact(vision_artifact("qwen3_5_vl"))
    plan = compile_artifact(art, CompileOptions(vision=True), verify_each=True)
    assert plan.vision is not None and plan.vision.merge_size == 2
    assert plan.vision_calls and set(plan.vision_calls).isdisjoint(plan.step_calls)
    for c in plan.calls:
        CPU_KERNELS.lookup(c.kernel, c.op)  # raises for a kernel the executor lacks
    assert plan.buffers["positions"].type == "i32[3,T]"
    again = Plan.from_json(plan.to_json())
    assert again.vision == plan.vision and json.loads(again.to_json()) == json.loads(plan.to_json())


def test_vision_is_refused_where_it_cannot_run(fixture_artifacts, capsys):
    text = str(fixture_artifacts("qwen3_5"))
    capsys.readouterr()  # building the fixtures printed progress
    rc, out, err = compile_out(capsys, text, "--vision")
    assert rc != 0 and not out
    assert "--vision needs the artifact's vision component" in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match="vision must be true or false"):
        CompileOptions(vision="yes")


def test_the_artifact_keeps_the_processor_settings(vision_artifact, fixture_root, tmp_path):
    """`ninfer convert` of the Hugging Face directory writes the vision component and the
    processor files' settings, which ninfer.media reads."""
    vision_artifact("qwen3_5_vl")  # builds the directory too
    out = tmp_path / "vl.ninfer"
    assert main(["convert", str(fixture_root / "qwen3_5_vl-hf"), "-o", str(out)]) == 0
    art = Artifact(out)
    assert any(n.startswith("visual.blocks.1.") for n in art.tensors)
    assert art.components == ["text", "vision"]
    cfg = VisionPreprocessConfig.from_hf(art.preprocessor["image"], art.preprocessor["video"])
    assert (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size) == (8, 2, 2)
    assert (cfg.image_max_pixels, cfg.video_fps, cfg.video_max_frames) == (4096, 2.0, 4)


@pytest.mark.parametrize("verbose", [False, True], ids=["summary", "verbose"])
def test_vision_plan_snapshot(verbose, vision_artifact, capsys, snapshot):
    """The printed plan with the tower is deterministic (pinned like the text plans)."""
    path = str(vision_artifact("qwen3_5_vl"))
    capsys.readouterr()
    argv = [path, "--vision", "--max-concurrency", "2", *(["--verbose"] if verbose else [])]
    rc, out, err = compile_out(capsys, *argv)
    assert rc == 0, err
    assert out == snapshot
