"""The MTP head as an artifact component: `ninfer convert SRC.ninfer --mtp-head HEAD` attaches a
trained head (bad heads refused in one line, nothing written), and the head's compiled plan
computes what the training module of artifacts/train_mtp.py computes (the layout the trainer
writes is the layout the runtime reads)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from artifacts.fixtures import TINY_AGENT
from artifacts.train_mtp import HEAD, Head
from ninfer.artifact.format import Artifact
from ninfer.artifact.model_spec import model_spec
from ninfer.passes.options import CompileOptions
from ninfer.passes.pipeline import compile_mtp
from ninfer.runtime.executors.cpu.executor import Executor
from ninfer.runtime.step import SeqChunk, StepBatch


def _convert(*args):
    cmd = [sys.executable, "-m", "ninfer.cli", "convert", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _one_line_error(r, needle: str) -> None:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]


def test_convert_attaches_a_trained_head(tmp_path):
    out = tmp_path / "agent-mtp.ninfer"
    r = _convert(TINY_AGENT, "--mtp-head", HEAD, "-o", out)
    assert r.returncode == 0, r.stderr
    art = Artifact(out)
    assert art.components == ["text", "mtp"]
    assert art.verify() > 0
    base = Artifact(TINY_AGENT)
    assert all(np.array_equal(art.dense(n), base.dense(n)) for n in base)  # copied unchanged
    r = _convert(out, "--mtp-head", HEAD, "-o", tmp_path / "twice.ninfer")
    _one_line_error(r, "already has an mtp component")

    head = load_file(str(HEAD))
    bad = tmp_path / "bad.safetensors"
    save_file({**head, "model.norm.weight": head["mtp.norm.weight"]}, str(bad))
    _one_line_error(_convert(TINY_AGENT, "--mtp-head", bad, "-o", out), "expected only mtp.*")
    save_file({**head, "mtp.fc.weight": head["mtp.fc.weight"][:, :100].copy()}, str(bad))
    wrong = tmp_path / "wrong.ninfer"
    _one_line_error(_convert(TINY_AGENT, "--mtp-head", bad, "-o", wrong), "mtp.fc.weight")
    assert not wrong.exists() and not list(tmp_path.glob("wrong.ninfer.tmp-*"))
    _one_line_error(_convert(TINY_AGENT, "-o", wrong), "--mtp-head")


def test_the_plan_computes_the_training_module(tiny_agent_mtp):
    art = Artifact(tiny_agent_mtp)
    ex = Executor(compile_mtp(art, CompileOptions(cpu_weights="float32")), art)
    spec = model_spec(art.architecture, art.config)
    embed = torch.from_numpy(np.asarray(art.dense("model.embed_tokens.weight"), np.float32))
    params = {n: torch.from_numpy(a.copy()) for n, a in load_file(str(HEAD)).items()}
    head = Head(params, spec, embed)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (41,), generator=g)
    hidden = torch.randn(41, spec.hidden, generator=g)
    with torch.no_grad():
        (want,) = head.unrolled(tokens, hidden, 1)  # positions 0..39 read tokens 1..40
    chunk = SeqChunk(0, tuple(tokens[1:].tolist()), 0, tuple(range(3)))
    logits = ex.run(StepBatch((chunk,)), inputs={"hidden": hidden[:40]})
    got = ex.hidden["final"]
    assert (got - want).abs().max().item() < 1e-4
    assert torch.allclose(logits[0], want[-1] @ embed.T, atol=1e-3)
    with pytest.raises(ValueError, match="'hidden': 39 rows for 40 tokens"):
        ex.run(StepBatch((chunk,)), inputs={"hidden": hidden[:39]})
